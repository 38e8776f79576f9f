package events

import (
	"fmt"
	"slices"
	"strings"
)

// Bus permissions, derived from this contract rather than written by hand:
// for one identity (a role on a host), the subjects it may publish and
// subscribe to and the JetStream API calls it needs on the streams and
// buckets it uses, and nothing else. `fanctl nats-config` turns these into
// the nats-server authorization; a test fails when a type or subject of
// this package has no publisher here.

// Names of what fan keeps on JetStream. They are part of the operator-facing
// contract (permissions, `nats stream view`), so they never change.
const (
	EventsStream   = "FAN_EVENTS"
	CommandsStream = "FAN_CMD"
	StateBucket    = "fan_state"
)

// ExecutorConsumer names the durable consumer through which one node's (or
// DNS site's) executor reads its commands.
func ExecutorConsumer(cluster, node string) string { return "exec-" + cluster + "-" + node }

// InboxPrefix is where an identity receives replies (JetStream acks,
// consumer deliveries, request replies). Each identity has its own, so one
// cannot read what is delivered to another; clients pass it to the NATS
// connection (nats.CustomInboxPrefix) and it is derived from the public key
// they authenticate with, which both sides know.
func InboxPrefix(publicKey string) string { return "_INBOX_" + publicKey }

// BusRole is what an identity is allowed to be on the bus.
type BusRole string

const (
	RoleProber     BusRole = "prober"
	RoleArbiter    BusRole = "arbiter"
	RoleIPMover    BusRole = "ipmover"
	RoleReplicator BusRole = "replicator"
	RoleScheduler  BusRole = "scheduler"
	// RoleOperator runs fanctl: reads everything, asks the arbiter to act.
	RoleOperator BusRole = "operator"
	// RoleAuditor reads the trail and the state; it can change nothing.
	RoleAuditor BusRole = "auditor"
	// RoleViewer is the status page (fanctl serve): a server that faces
	// browsers, so the least of all: it reads the audit stream, the live
	// stream, the state bucket and the call records, and may neither
	// publish, nor list streams, nor ask any service anything.
	RoleViewer BusRole = "viewer"
	// RoleAdmin provisions streams and buckets at install; it alone has
	// create rights, and even it cannot purge, delete or reconfigure the
	// audit stream. It backs the audit stream up and restores it into a
	// bus that lost it (fanctl backup, restore: a snapshot; a restore
	// creates the stream, which it may do anyway).
	RoleAdmin BusRole = "admin"
)

// Services are the roles that are fan daemons (the service name in their
// announcements and status subjects is the role).
var Services = []BusRole{RoleProber, RoleArbiter, RoleIPMover, RoleReplicator, RoleScheduler}

// Roles lists every role.
func Roles() []BusRole {
	return append(slices.Clone(Services), RoleOperator, RoleAuditor, RoleViewer, RoleAdmin)
}

// Identity is one credential on the bus.
type Identity struct {
	Cluster string
	Role    BusRole
	// Name is the host (a PBX node's name for prober, ipmover and
	// replicator on a node; the control host's name otherwise) or, for
	// operators and auditors, the person.
	Name string
	// Executes lists the nodes whose commands an ipmover carries out: its
	// own node by default, or the DNS sites of a DNS executor.
	Executes []string
	// Relays lists nodes without a prober whose heartbeats the arbiter
	// receives over HTTP and publishes for them.
	Relays []string
	// PublicKey is the identity's nkey; when set, replies go to its own
	// inbox (InboxPrefix) instead of the shared _INBOX.
	PublicKey string
}

// Rule is an allow and a deny list of subjects.
type Rule struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// Permissions are what nats-server enforces for one identity.
type Permissions struct {
	Publish   Rule
	Subscribe Rule
	// AllowResponses lets a service answer a request it received (one
	// reply) without any publish right on the requester's inbox.
	AllowResponses bool
}

// Scopes of a publisher's subjects.
type scope int

const (
	scopeOwnNode  scope = iota // the subject names the identity's own node
	scopeExecuted              // the subject names a node the ipmover executes for
	scopeRelayed               // the subject names a node the arbiter relays for
	scopeCluster               // any subject of the kind in the cluster
)

// publisher says who publishes a type and on which of its subjects.
type publisher struct {
	role    BusRole
	scope   scope
	subject func(cluster, node string) string // node is "*" for scopeCluster
}

func perNode(f func(cluster, node string) string) func(string, string) string { return f }

func perCluster(f func(cluster, x string) string) func(string, string) string {
	return func(cluster, _ string) string { return f(cluster, "*") }
}

func commandOf(verb string) func(string, string) string {
	return func(cluster, _ string) string { return CommandSubject(cluster, "*", verb) }
}

func clusterOnly(f func(cluster string) string) func(string, string) string {
	return func(cluster, _ string) string { return f(cluster) }
}

// publishers is the table of who publishes each event type. A type missing
// here has no publisher on a bus with permissions; TestPermissionsCover
// fails for it. ServiceAnnounce is published by every service for itself
// and is handled apart.
var publishers = map[Type][]publisher{
	TypeProbeResult:      {{RoleProber, scopeOwnNode, perNode(ProbeResultSubject)}},
	TypeHealthTransition: {{RoleProber, scopeOwnNode, perNode(HealthSubject)}},
	TypeNodeHeartbeat: {
		{RoleProber, scopeOwnNode, perNode(HeartbeatSubject)},
		{RoleArbiter, scopeRelayed, perNode(HeartbeatSubject)},
	},
	TypeArbiterDecision:     {{RoleArbiter, scopeCluster, perCluster(DecisionSubject)}},
	TypeClaimIP:             {{RoleArbiter, scopeCluster, commandOf(VerbClaim)}},
	TypeReleaseIP:           {{RoleArbiter, scopeCluster, commandOf(VerbRelease)}},
	TypeAnswerPBX:           {{RoleArbiter, scopeCluster, commandOf(VerbAnswer)}},
	TypeCommandResult:       {{RoleIPMover, scopeExecuted, perNode(CommandResultSubject)}},
	TypeCallsAdopted:        {{RoleIPMover, scopeExecuted, perNode(CallsAdoptedSubject)}},
	TypeFailbackPermit:      {{RoleScheduler, scopeCluster, perCluster(PermitSubject)}},
	TypeReplicationStatus:   {{RoleReplicator, scopeOwnNode, perNode(ReplicationSubject)}},
	TypeReplicationApplied:  {{RoleReplicator, scopeOwnNode, perNode(ReplicationAppliedSubject)}},
	TypeReplicationAlarm:    {{RoleReplicator, scopeOwnNode, perNode(ReplicationAlarmSubject)}},
	TypeReplicationConflict: {{RoleReplicator, scopeOwnNode, perNode(ReplicationConflictSubject)}},
	TypeReplicationHeld:     {{RoleReplicator, scopeOwnNode, perNode(ReplicationHeldSubject)}},
	TypeCallsSummary:        {{RoleReplicator, scopeOwnNode, perNode(CallsSummarySubject)}},
	TypeNodePresence:        {{RoleArbiter, scopeCluster, perCluster(PresenceSubject)}},
	TypeAddressConflict:     {{RoleIPMover, scopeExecuted, perNode(AddressConflictSubject)}},
	TypeAddressCorrection:   {{RoleIPMover, scopeExecuted, perNode(AddressCorrectionSubject)}},
	TypeDispatcherWeights:   {{RoleArbiter, scopeCluster, perCluster(WeightsSubject)}},
	TypeOperatorAction:      {{RoleArbiter, scopeCluster, clusterOnly(OperatorActionSubject)}},
	TypePlannedMove:         {{RoleArbiter, scopeCluster, perCluster(PlannedMoveSubject)}},
	TypeArbiterTerm:         {{RoleArbiter, scopeCluster, clusterOnly(TermSubject)}},
	TypeGroupPin:            {{RoleArbiter, scopeCluster, perCluster(PinSubject)}},
	TypeLeadersHold:         {{RoleArbiter, scopeCluster, clusterOnly(LeadersHoldSubject)}},
}

// Publishers names the roles that publish a type (for documentation and
// tests); nil for a type nobody may publish.
func Publishers(t Type) []BusRole {
	if t == TypeServiceAnnounce {
		return slices.Clone(Services)
	}
	var out []BusRole
	for _, p := range publishers[t] {
		if !slices.Contains(out, p.role) {
			out = append(out, p.role)
		}
	}
	return out
}

// JetStream API and internal subjects the permissions are made of.
const (
	jsAPI = "$JS.API"
	jsAck = "$JS.ACK"
	jsFC  = "$JS.FC"
)

func kvStream(bucket string) string  { return KVStreamName(bucket) }
func objStream(bucket string) string { return ObjectStreamName(bucket) }

// KVSubject is the subject a KV put of key in bucket is published on.
func KVSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// streamRead is what reading a stream with ordered (ephemeral, randomly
// named) consumers and direct gets needs.
func streamRead(stream string) []string {
	return []string{
		jsAPI + ".STREAM.INFO." + stream,
		jsAPI + ".CONSUMER.CREATE." + stream + ".>",
		jsAPI + ".CONSUMER.INFO." + stream + ".*",
		jsAPI + ".CONSUMER.DELETE." + stream + ".*",
		jsAPI + ".CONSUMER.MSG.NEXT." + stream + ".*",
		jsAPI + ".DIRECT.GET." + stream,
		jsAPI + ".DIRECT.GET." + stream + ".>",
		JSStreamMsgGetSubject(stream),
		jsFC + "." + stream + ".>",
	}
}

// executorConsumer is what one executor needs to read its own commands and
// nothing else: the consumer's name and filter are part of the create
// subject, so it cannot make a consumer on another node's commands.
func executorConsumer(cluster, node string) []string {
	name := ExecutorConsumer(cluster, node)
	return []string{
		jsAPI + ".CONSUMER.CREATE." + CommandsStream + "." + name + "." + NodeCommands(cluster, node),
		jsAPI + ".CONSUMER.INFO." + CommandsStream + "." + name,
		jsAPI + ".CONSUMER.MSG.NEXT." + CommandsStream + "." + name,
		jsAck + "." + CommandsStream + "." + name + ".>",
	}
}

// objectStoreUse is what the replicator does on an object store: read,
// write and delete objects (a delete purges the object's chunks), but not
// create, reconfigure or delete the store.
func objectStoreUse(bucket string) []string {
	return append(streamRead(objStream(bucket)),
		"$O."+bucket+".>",
		jsAPI+".STREAM.PURGE."+objStream(bucket),
	)
}

// kvRead is what reading the keys of a bucket that match one filter needs
// (a KV Get, a watch, a key listing): the bucket's info, which opening it
// asks; a last-value get of one key, whose key is in the subject; and a
// consumer whose one filter subject lies within keys, deleted when done,
// with its flow control. Nothing here reads past keys: not a get by
// sequence or with the subject in the request's body, not a consumer with
// several filters or none (their create subject names no filter).
func kvRead(bucket, keys string) []string {
	st := kvStream(bucket)
	return []string{
		jsAPI + ".STREAM.INFO." + st,
		jsAPI + ".DIRECT.GET." + st + "." + KVSubject(bucket, keys),
		jsAPI + ".CONSUMER.CREATE." + st + ".*." + KVSubject(bucket, keys),
		jsAPI + ".CONSUMER.INFO." + st + ".*",
		jsAPI + ".CONSUMER.DELETE." + st + ".*",
		jsFC + "." + st + ".>",
	}
}

// callsRead is reading every call record of a cluster (calls.go), the
// adopted ones included.
func callsRead(cluster string) []string {
	return append(kvRead(CallsBucket, ClusterCallKeys(cluster)), kvRead(CallsBucket, ClusterKeptKeys(cluster))...)
}

// auditProtected are the API calls nobody may make on the audit stream:
// purge, delete, deleting a message, or reconfiguring it (a shorter max age
// would purge it too). Changing its settings is a server operator's act.
func auditProtected() []string {
	return []string{
		jsAPI + ".STREAM.PURGE." + EventsStream,
		jsAPI + ".STREAM.DELETE." + EventsStream,
		jsAPI + ".STREAM.MSG.DELETE." + EventsStream,
		jsAPI + ".STREAM.UPDATE." + EventsStream,
	}
}

// Permissions returns what the identity may do on the bus.
func (id Identity) Permissions() (Permissions, error) {
	executes, err := id.validate()
	if err != nil {
		return Permissions{}, err
	}
	g := &grants{id: id, cl: id.Cluster, executes: executes}
	g.replies()
	g.events()
	g.service()
	g.calls()
	g.role()
	// Nobody but the admin calls the JetStream API beyond the above; the
	// audit stream's protection is also stated as a deny for every role,
	// so that a mistake in an allow list cannot open it.
	if id.Role != RoleAdmin {
		g.p.Publish.Deny = append(g.p.Publish.Deny, auditProtected()...)
	}
	g.p.Publish.Allow = dedupe(g.p.Publish.Allow)
	g.p.Subscribe.Allow = dedupe(g.p.Subscribe.Allow)
	return g.p, nil
}

// validate checks the identity's names and role, and returns the nodes it
// executes for: an ipmover's own node when it names none.
func (id Identity) validate() (executes []string, err error) {
	if err := ValidToken("cluster", id.Cluster); err != nil {
		return nil, err
	}
	if err := ValidToken("name", id.Name); err != nil {
		return nil, err
	}
	if !slices.Contains(Roles(), id.Role) {
		return nil, fmt.Errorf("%w: role %q", ErrInvalidField, id.Role)
	}
	executes = id.Executes
	if len(executes) == 0 && id.Role == RoleIPMover {
		executes = []string{id.Name}
	}
	for _, n := range append(slices.Clone(executes), id.Relays...) {
		if err := ValidToken("node", n); err != nil {
			return nil, err
		}
	}
	return executes, nil
}

// grants gathers one identity's permissions, in the order they are granted.
type grants struct {
	id       Identity
	cl       string
	executes []string
	p        Permissions
}

func (g *grants) pub(s ...string) { g.p.Publish.Allow = append(g.p.Publish.Allow, s...) }
func (g *grants) sub(s ...string) { g.p.Subscribe.Allow = append(g.p.Subscribe.Allow, s...) }

// replies: JetStream acks, consumer deliveries and request replies.
func (g *grants) replies() {
	if g.id.PublicKey != "" {
		g.sub(InboxPrefix(g.id.PublicKey) + ".>")
	} else {
		g.sub("_INBOX.>")
	}
}

// events are the events this role publishes, from the table.
func (g *grants) events() {
	for _, t := range slices.Sorted(slices.Values(Types())) {
		for _, pb := range publishers[t] {
			if pb.role != g.id.Role {
				continue
			}
			switch pb.scope {
			case scopeOwnNode:
				g.pub(pb.subject(g.cl, g.id.Name))
			case scopeExecuted:
				for _, n := range g.executes {
					g.pub(pb.subject(g.cl, n))
				}
			case scopeRelayed:
				for _, n := range g.id.Relays {
					g.pub(pb.subject(g.cl, n))
				}
			case scopeCluster:
				g.pub(pb.subject(g.cl, "*"))
			}
		}
	}
}

// service is what every fan daemon needs: its announcements, its status
// endpoint, and a look at the streams and buckets.
func (g *grants) service() {
	if !slices.Contains(Services, g.id.Role) {
		return
	}
	g.pub(AnnounceSubject(g.cl, string(g.id.Role), g.id.Name))
	// The status endpoint (NATS micro) and its discovery subjects;
	// answers go out through AllowResponses.
	g.sub(ServiceStatusSubject(g.cl, string(g.id.Role), g.id.Name), "$SRV.>")
	g.p.AllowResponses = true
	// Every service opens the streams and the buckets at start to
	// check they exist (creating them is the admin's job); the info
	// of a bucket holds no record.
	g.pub(jsAPI+".INFO",
		jsAPI+".STREAM.INFO."+EventsStream,
		jsAPI+".STREAM.INFO."+LiveStream,
		jsAPI+".STREAM.INFO."+CommandsStream,
		jsAPI+".STREAM.INFO."+kvStream(StateBucket),
		jsAPI+".STREAM.INFO."+kvStream(CallsBucket))
}

// calls are the call records (calls.go): a node's replicator writes and
// deletes its node's calls keys, and reads them back to reconcile them
// with Asterisk; it also reads the kept records of its cluster, to learn
// when a call its Asterisk still has after a planned move has ended at the
// node that kept it. A node's ipmover writes and deletes its node's kept
// keys and reads every record of the cluster, to adopt; the arbiter and
// the people read them all. Nobody else touches them.
func (g *grants) calls() {
	cl, name := g.cl, g.id.Name
	switch g.id.Role {
	case RoleReplicator:
		g.pub(KVSubject(CallsBucket, NodeCallKeys(cl, name)))
		g.pub(kvRead(CallsBucket, NodeCallKeys(cl, name))...)
		g.pub(kvRead(CallsBucket, ClusterKeptKeys(cl))...)
	case RoleIPMover:
		g.pub(KVSubject(CallsBucket, NodeKeptKeys(cl, name)))
		g.pub(callsRead(cl)...)
	case RoleArbiter, RoleOperator, RoleAuditor, RoleViewer:
		g.pub(callsRead(cl)...)
	}
}

// role is what only this role does.
func (g *grants) role() {
	cl, name := g.cl, g.id.Name
	switch g.id.Role {
	case RoleProber:
		g.pub(BeaconSubject(cl, name))
	case RoleArbiter:
		g.arbiter()
	case RoleIPMover:
		g.pub(streamRead(EventsStream)...)
		g.pub(streamRead(kvStream(StateBucket))...)
		// Executors read the arbiter lease's records by sequence and the
		// last one, to accept only epochs that are lease terms.
		g.pub(JSStreamMsgGetSubject(CommandsStream),
			jsAPI+".DIRECT.GET."+CommandsStream,
			jsAPI+".DIRECT.GET."+CommandsStream+"."+LeaseSubject(cl, ArbiterLease))
		for _, n := range g.executes {
			g.pub(executorConsumer(cl, n)...)
		}
	case RoleReplicator:
		g.replicator()
	case RoleScheduler:
		g.pub(streamRead(EventsStream)...)
		g.pub(streamRead(kvStream(StateBucket))...)
		g.pub(KVSubject(StateBucket, ScheduleKey(cl)))
	case RoleOperator, RoleAuditor:
		g.pub(jsAPI + ".INFO")
		g.pub(streamRead(EventsStream)...)
		g.pub(streamRead(LiveStream)...)
		g.pub(streamRead(kvStream(StateBucket))...)
		g.pub(jsAPI+".STREAM.INFO."+CommandsStream, jsAPI+".STREAM.LIST", jsAPI+".STREAM.NAMES")
		g.pub(ServiceStatusSubject(cl, "*", "*"), "$SRV.>")
		if g.id.Role == RoleOperator {
			// Only the operator's own subject: the arbiter records who
			// asked from it.
			g.pub(OperatorRequestSubject(cl, name))
		}
	case RoleViewer:
		// The timeline and explanations (consumers on the audit and live
		// streams), each node's last heartbeat (a direct get) and the
		// status records and plans (the bucket's stream).
		g.pub(streamRead(EventsStream)...)
		g.pub(streamRead(LiveStream)...)
		g.pub(streamRead(kvStream(StateBucket))...)
	case RoleAdmin:
		g.pub(jsAPI+".>", "$KV.>", "$O.>", jsFC+".>", JSSnapshotSubjects)
		g.p.Publish.Deny = append(g.p.Publish.Deny, auditProtected()...)
	}
}

func (g *grants) arbiter() {
	cl := g.cl
	g.pub(LeaseSubject(cl, "*"), ArbiterPresenceSubject(cl, g.id.Name))
	g.sub(AllOperatorRequests(cl), AllBeacons(cl), AllArbiterPresence(cl))
	g.pub(streamRead(EventsStream)...)
	// Heartbeats (presence, level-triggered check states, the
	// registry, dispatcher weights) are in the live stream.
	g.pub(streamRead(LiveStream)...)
	g.pub(streamRead(kvStream(StateBucket))...)
	// The lease and outstanding claims are read back from the command
	// stream by message (no consumer).
	g.pub(JSStreamMsgGetSubject(CommandsStream),
		jsAPI+".DIRECT.GET."+CommandsStream,
		jsAPI+".DIRECT.GET."+CommandsStream+".>")
	// A leader that cannot command releases the lease by deleting its
	// term's lease messages (no more power than commanding itself).
	g.pub(jsAPI + ".STREAM.MSG.DELETE." + CommandsStream)
	g.pub(KVSubject(StateBucket, ArbiterStateKey(cl)),
		KVSubject(StateBucket, AllGroupStatusKeys(cl)),
		KVSubject(StateBucket, AllRegistryKeys(cl)),
		// The leaders hold: operators ask the arbiter leader, which
		// checks and records the request before it writes the hold.
		KVSubject(StateBucket, LeadersHoldKey(cl)))
	// Leader step-downs of fan's streams and consumers (the meta
	// leader's needs the system account, a separate identity).
	// The steward lists the durable consumers to find their leaders
	// and hears elections from the advisories.
	for _, s := range LedStreams() {
		g.pub(JSStreamLeaderStepDownSubject(s), JSConsumerLeaderStepDownSubject(s, "*"),
			jsAPI+".STREAM.INFO."+s, jsAPI+".CONSUMER.LIST."+s, jsAPI+".CONSUMER.INFO."+s+".*")
		g.sub(JSStreamLeaderElectedAdvisory(s), JSConsumerLeaderElectedAdvisory(s, "*"))
	}
}

func (g *grants) replicator() {
	cl, name := g.cl, g.id.Name
	g.pub(streamRead(EventsStream)...)
	g.pub(streamRead(kvStream(StateBucket))...)
	g.pub(objectStoreUse(ReplBlobBucket)...)
	g.pub(objectStoreUse(ReplManifestBucket)...)
	// Direct transfer: it answers on its own node's content subject
	// (through AllowResponses) and asks any peer of the cluster, which
	// can read the same contents from the blob bucket anyway.
	g.sub(ContentSubject(cl, name))
	g.pub(ContentSubject(cl, "*"))
	// AstDB changes as they happen (astdb.go): each publishes its own
	// node's and hears every node's; reconciles are asked of any node
	// and answered on its own subject.
	g.pub(AstDBDeltaSubject(cl, name), AstDBResyncSubject(cl, "*"))
	g.sub(AllAstDBDeltas(cl), AstDBResyncSubject(cl, name))
}

func dedupe(s []string) []string {
	out := make([]string, 0, len(s))
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// SubjectMatches reports whether a literal subject matches a pattern with
// NATS wildcards (* one token, > one or more trailing tokens).
func SubjectMatches(pattern, subject string) bool {
	pt := strings.Split(pattern, ".")
	st := strings.Split(subject, ".")
	for i, p := range pt {
		if p == ">" {
			return len(st) > i
		}
		if i >= len(st) {
			return false
		}
		if p != "*" && p != st[i] {
			return false
		}
	}
	return len(pt) == len(st)
}

// Allows reports whether the rule lets subject through: allowed by some
// pattern and denied by none.
func (r Rule) Allows(subject string) bool {
	for _, d := range r.Deny {
		if SubjectMatches(d, subject) {
			return false
		}
	}
	for _, a := range r.Allow {
		if SubjectMatches(a, subject) {
			return true
		}
	}
	return false
}

// SystemPermissions are those of the arbiter's system-account identity: the
// JetStream meta leader's step-down and the servers' read-only reports that
// show where leaders are, nothing that changes a server (reload, kick, lame
// duck) or an account.
func SystemPermissions(publicKey string) Permissions {
	inbox := "_INBOX.>"
	if publicKey != "" {
		inbox = InboxPrefix(publicKey) + ".>"
	}
	return Permissions{
		Publish: Rule{Allow: []string{
			JSMetaLeaderStepDownSubject, JSServerPingJSZ,
			"$SYS.REQ.SERVER.PING.VARZ", "$SYS.REQ.SERVER.PING.STATZ",
			"$SYS.REQ.SERVER.*.JSZ", "$SYS.REQ.SERVER.*.VARZ",
		}},
		// The shared _INBOX too: the system account holds only the
		// arbiters' step-down users, so nobody else's replies pass there.
		Subscribe: Rule{Allow: dedupe([]string{inbox, "_INBOX.>", JSMetaLeaderElectedAdvisory})},
	}
}
