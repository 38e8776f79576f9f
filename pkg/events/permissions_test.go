package events

import (
	"slices"
	"testing"
)

// permIdentities are one identity of every role on a small cluster: two PBX
// nodes (n1, n2), a control host ctl1, a DNS site executor, an HTTP
// heartbeat node (h1) relayed by the arbiter.
func permIdentities(t *testing.T) map[string]Permissions {
	t.Helper()
	ids := []Identity{
		{Role: RoleArbiter, Name: "ctl1", Relays: []string{"h1"}},
		{Role: RoleScheduler, Name: "ctl1"},
		{Role: RoleIPMover, Name: "ctl1", Executes: []string{"siteA"}},
		{Role: RoleOperator, Name: "alice"},
		{Role: RoleAuditor, Name: "bob"},
		{Role: RoleViewer, Name: "noc"},
		{Role: RoleAdmin, Name: "admin"},
	}
	for _, n := range []string{"n1", "n2"} {
		for _, r := range []BusRole{RoleProber, RoleIPMover, RoleReplicator} {
			ids = append(ids, Identity{Role: r, Name: n})
		}
	}
	out := map[string]Permissions{}
	for _, id := range ids {
		id.Cluster = "c1"
		p, err := id.Permissions()
		if err != nil {
			t.Fatalf("%s@%s: %v", id.Role, id.Name, err)
		}
		out[string(id.Role)+"@"+id.Name] = p
	}
	return out
}

func roleOf(key string) BusRole {
	for i := range key {
		if key[i] == '@' {
			return BusRole(key[:i])
		}
	}
	return BusRole(key)
}

// TestPermissionsCover walks every registered type: its sample's subject
// (the one Subject derives, for nodes n1, n2, siteA or h1) must be
// publishable by an identity of a role that publishes the type, and by no
// identity of any other role but the admin.
func TestPermissionsCover(t *testing.T) {
	perms := permIdentities(t)
	for _, typ := range Types() {
		if _, ok := publishers[typ]; !ok && typ != TypeServiceAnnounce {
			t.Errorf("type %s has no publisher in the permissions table", typ)
			continue
		}
		p, ok := samples()[typ]
		if !ok {
			t.Errorf("type %s has no sample", typ)
			continue
		}
		roles := Publishers(typ)
		// A node-scoped subject names whichever node the sample names;
		// publish it as each node in turn so the subject is the node's own.
		subjects := map[string]bool{}
		for _, n := range []string{"n1", "n2", "ctl1", "siteA", "h1"} {
			env := Envelope{Cluster: "c1", Source: Source{Service: "x", Node: n}}
			subjects[Subject(env, p)] = true
		}
		for subj := range subjects {
			allowedBy := []string{}
			for key, perm := range perms {
				if perm.Publish.Allows(subj) {
					allowedBy = append(allowedBy, key)
				}
			}
			for _, key := range allowedBy {
				if r := roleOf(key); !slices.Contains(roles, r) && r != RoleAdmin {
					t.Errorf("%s (%s): %s may publish it, only %v should", typ, subj, key, roles)
				}
			}
		}
		// At least one subject of the type must be publishable by its publisher.
		any := false
		for subj := range subjects {
			for key, perm := range perms {
				if slices.Contains(roles, roleOf(key)) && perm.Publish.Allows(subj) {
					any = true
				}
			}
		}
		if !any {
			t.Errorf("type %s: no identity of %v may publish any of %v", typ, roles, subjects)
		}
	}
}

// TestPermissionsNodeScoped: a PBX node's identities say only that node's
// things and consume only that node's commands.
func TestPermissionsNodeScoped(t *testing.T) {
	perms := permIdentities(t)
	own := map[string][]string{
		"prober@n1":     {ProbeResultSubject("c1", "n1"), HealthSubject("c1", "n1"), HeartbeatSubject("c1", "n1"), BeaconSubject("c1", "n1"), AnnounceSubject("c1", "prober", "n1")},
		"ipmover@n1":    {CommandResultSubject("c1", "n1"), AddressConflictSubject("c1", "n1"), "$JS.API.CONSUMER.CREATE.FAN_CMD.exec-c1-n1.fan.cmd.c1.n1.>", "$JS.API.CONSUMER.MSG.NEXT.FAN_CMD.exec-c1-n1", "$JS.ACK.FAN_CMD.exec-c1-n1.1.2.3.4.5"},
		"replicator@n1": {ReplicationSubject("c1", "n1"), ReplicationAppliedSubject("c1", "n1"), "$O.fan_repl_blobs.C.abc"},
		"ipmover@ctl1":  {CommandResultSubject("c1", "siteA"), "$JS.API.CONSUMER.MSG.NEXT.FAN_CMD.exec-c1-siteA"},
	}
	other := map[string][]string{
		"prober@n1":     {ProbeResultSubject("c1", "n2"), HealthSubject("c1", "n2"), HeartbeatSubject("c1", "n2"), BeaconSubject("c1", "n2"), AnnounceSubject("c1", "prober", "n2"), AnnounceSubject("c1", "arbiter", "n1")},
		"ipmover@n1":    {CommandResultSubject("c1", "n2"), CommandSubject("c1", "n1", VerbClaim), "$JS.API.CONSUMER.CREATE.FAN_CMD.exec-c1-n2.fan.cmd.c1.n2.>", "$JS.API.CONSUMER.CREATE.FAN_CMD.exec-c1-n1.fan.cmd.c1.>", "$JS.API.CONSUMER.CREATE.FAN_CMD.x.fan.cmd.c1.n1.>", "$JS.API.CONSUMER.MSG.NEXT.FAN_CMD.exec-c1-n2", "$JS.ACK.FAN_CMD.exec-c1-n2.1.2.3.4.5"},
		"replicator@n1": {ReplicationSubject("c1", "n2"), ReplicationAppliedSubject("c1", "n2")},
		"ipmover@ctl1":  {CommandResultSubject("c1", "n1"), "$JS.API.CONSUMER.MSG.NEXT.FAN_CMD.exec-c1-n1"},
	}
	for key, subs := range own {
		for _, s := range subs {
			if !perms[key].Publish.Allows(s) {
				t.Errorf("%s may not publish its own %s", key, s)
			}
		}
	}
	for key, subs := range other {
		for _, s := range subs {
			if perms[key].Publish.Allows(s) {
				t.Errorf("%s may publish %s", key, s)
			}
		}
	}
	if perms["prober@n1"].Subscribe.Allows(NodeCommands("c1", "n1")) {
		t.Error("a prober may subscribe to commands")
	}
}

// TestPermissionsExclusive: the lease, commands, the arbiter's state keys,
// the scheduler's permits and plan have one writer; the audit stream
// cannot be purged or deleted by anyone; no service creates streams.
func TestPermissionsExclusive(t *testing.T) {
	perms := permIdentities(t)
	only := map[string]BusRole{
		LeaseSubject("c1", "arbiter"):                     RoleArbiter,
		CommandSubject("c1", "n1", VerbClaim):             RoleArbiter,
		CommandSubject("c1", "n2", VerbRelease):           RoleArbiter,
		KVSubject(StateBucket, ArbiterStateKey("c1")):     RoleArbiter,
		KVSubject(StateBucket, GroupStatusKey("c1", "g")): RoleArbiter,
		KVSubject(StateBucket, RegistryKey("c1", "n1")):   RoleArbiter,
		PermitSubject("c1", "pbx"):                        RoleScheduler,
		KVSubject(StateBucket, ScheduleKey("c1")):         RoleScheduler,
		OperatorActionSubject("c1"):                       RoleArbiter,
		OperatorRequestSubject("c1", "alice"):             RoleOperator,
	}
	for subj, role := range only {
		for key, p := range perms {
			r := roleOf(key)
			if r == role || r == RoleAdmin {
				continue
			}
			if p.Publish.Allows(subj) {
				t.Errorf("%s may publish %s (only %s should)", key, subj, role)
			}
		}
	}
	for key, p := range perms {
		for _, s := range []string{"$JS.API.STREAM.PURGE.FAN_EVENTS", "$JS.API.STREAM.DELETE.FAN_EVENTS", "$JS.API.STREAM.MSG.DELETE.FAN_EVENTS", "$JS.API.STREAM.UPDATE.FAN_EVENTS"} {
			if p.Publish.Allows(s) {
				t.Errorf("%s may call %s", key, s)
			}
		}
		if roleOf(key) == RoleAdmin {
			if !p.Publish.Allows("$JS.API.STREAM.CREATE.FAN_EVENTS") || !p.Publish.Allows("$JS.API.STREAM.CREATE.KV_fan_state") {
				t.Errorf("the admin may not create streams")
			}
			continue
		}
		for _, s := range []string{"$JS.API.STREAM.CREATE.FAN_EVENTS", "$JS.API.STREAM.CREATE.KV_fan_state", "$JS.API.STREAM.CREATE.OBJ_fan_repl_blobs", "$JS.API.STREAM.DELETE.FAN_CMD", "$JS.API.STREAM.PURGE.FAN_CMD", "$JS.API.STREAM.UPDATE.FAN_CMD"} {
			if p.Publish.Allows(s) {
				t.Errorf("%s may call %s", key, s)
			}
		}
	}
	if perms["auditor@bob"].Publish.Allows(OperatorRequestSubject("c1", "bob")) {
		t.Error("an auditor may ask the arbiter to act")
	}
	if perms["viewer@noc"].Publish.Allows(OperatorRequestSubject("c1", "noc")) {
		t.Error("the status page may ask the arbiter to act")
	}
	// An operator's credentials speak only for that operator.
	if !perms["operator@alice"].Publish.Allows(OperatorRequestSubject("c1", "alice")) {
		t.Error("alice may not send her own requests")
	}
	for _, s := range []string{OperatorRequestSubject("c1", "bob"), AllOperatorRequests("c1"), RequestRoot + ".c1.arbiter.operate"} {
		if perms["operator@alice"].Publish.Allows(s) {
			t.Errorf("alice may publish %s", s)
		}
	}
}

func TestSubjectMatches(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"a.b", "a.b", true}, {"a.*", "a.b", true}, {"a.*", "a.b.c", false}, {"a.>", "a", false},
		{"a.>", "a.b.c", true}, {"a.*.c", "a.b.c", true}, {"a.b", "a.b.c", false},
	} {
		if got := SubjectMatches(c.p, c.s); got != c.want {
			t.Errorf("SubjectMatches(%q, %q) = %v", c.p, c.s, got)
		}
	}
}

// TestViewerOnlyReads: the status page's identity may read the audit and
// live streams and the state bucket, and nothing else: no event, command,
// key or object write, no stream list or account info, no request to a
// service, no read of the command stream, no other identity's inbox.
func TestViewerOnlyReads(t *testing.T) {
	p := permIdentities(t)["viewer@noc"]
	for _, s := range []string{
		"$JS.API.CONSUMER.CREATE.FAN_EVENTS.x.fan.evt.c1.>", "$JS.API.CONSUMER.CREATE.FAN_LIVE.x.fan.state.c1.>",
		"$JS.API.CONSUMER.CREATE.KV_fan_state.x.$KV.fan_state.group.c1.*", "$JS.API.DIRECT.GET.FAN_LIVE." + HeartbeatSubject("c1", "n1"),
		"$JS.API.STREAM.INFO.FAN_LIVE", "$JS.API.STREAM.INFO.KV_fan_state",
	} {
		if !p.Publish.Allows(s) {
			t.Errorf("the viewer may not %s, which the page needs", s)
		}
	}
	for _, s := range []string{
		"$JS.API.INFO", "$JS.API.STREAM.LIST", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.INFO.FAN_CMD",
		"$JS.API.CONSUMER.CREATE.FAN_CMD.x.fan.cmd.c1.>", "$JS.API.DIRECT.GET.FAN_CMD", "$JS.API.STREAM.MSG.DELETE.FAN_LIVE",
		"$JS.API.STREAM.PURGE.KV_fan_state", "$JS.ACK.FAN_EVENTS.x.1.1.1.1.0",
		KVSubject(StateBucket, GroupStatusKey("c1", "pbx")), KVSubject(StateBucket, ScheduleKey("c1")),
		"$O.fan_repl_blobs.C.x", ServiceStatusSubject("c1", "arbiter", "ctl1"), "$SRV.PING",
		OperatorRequestSubject("c1", "noc"), LeaseSubject("c1", ArbiterLease),
	} {
		if p.Publish.Allows(s) {
			t.Errorf("the viewer may publish %s", s)
		}
	}
	for typ, sample := range samples() {
		for _, n := range []string{"n1", "n2", "ctl1", "noc"} {
			subj := Subject(Envelope{Cluster: "c1", Source: Source{Service: "x", Node: n}}, sample)
			if p.Publish.Allows(subj) {
				t.Errorf("the viewer may publish %s on %s", typ, subj)
			}
		}
	}
	if len(p.Subscribe.Allow) != 1 || p.Subscribe.Allow[0] != "_INBOX.>" || p.AllowResponses {
		t.Errorf("the viewer subscribes to %v (responses %v): only its replies", p.Subscribe.Allow, p.AllowResponses)
	}
}
