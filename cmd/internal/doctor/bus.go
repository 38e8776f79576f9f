package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// busFacts is what the bus said, for the checks that compare with it.
type busFacts struct {
	// groupStatus are the group status records by cluster; statusErr says
	// why they could not be read ("" when they were).
	groupStatus map[string][]events.GroupStatus
	statusErr   string
	// clusters are the clusters that have group status records, sorted.
	clusters []string
	// heartbeats are the other nodes' last heartbeats; heartbeatsErr says
	// why they could not be read.
	heartbeats    map[string]heartbeat
	heartbeatsErr string
	// servers name the server each bus.url entry reached ("" unreached).
	servers map[string]string
}

type heartbeat struct {
	name *string
	at   time.Time
}

// identity is one local service's connection settings: exactly its bus
// section, so what doctor proves is what the service will meet.
type identity struct {
	service
	urls []string
}

func (id identity) label() string { return id.name + "@" + id.c.Node }

// connection is one identity's connection to one server.
type connection struct {
	who  string // the identity's label
	url  string
	name string // the server's name from its INFO
	b    *bus.Bus
	err  error
}

// readers are the services whose identity may read most, best first: the
// arbiter reads the live stream and every stream's info; the others the
// state bucket; the prober only the streams' info.
var readers = []string{"arbiter", "replicator", "ipmover", "scheduler", "prober"}

// checkBus connects as every local service to every server of its bus.url
// and, with the identity that may read most, checks the streams, their
// raft peers, the group status records and the other nodes' heartbeats.
func (r *run) checkBus(ctx context.Context) busFacts {
	facts := busFacts{servers: map[string]string{}}
	var ids []identity
	for _, s := range r.files.services() {
		if s.c.Bus.URL == "" {
			r.out.addf(Error, "bus.connect", s.name+".yaml", "paste bus: from this host's bundle (<svc>-bus.yaml; deploy/systemd/README.md)", "no bus.url")
			continue
		}
		var urls []string
		for _, u := range strings.Split(s.c.Bus.URL, ",") {
			if u = strings.TrimSpace(u); u != "" {
				urls = append(urls, u)
			}
		}
		ids = append(ids, identity{service: s, urls: urls})
	}
	if len(ids) == 0 {
		return facts
	}

	conns := make([][]connection, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		if !r.checkCredentials(id.service) {
			r.out.addf(Skipped, "bus.connect", id.label(), "", "not tried: its credentials above are broken")
			continue
		}
		conns[i] = make([]connection, len(id.urls))
		for j, u := range id.urls {
			wg.Go(func() { conns[i][j] = r.connect(ctx, id, u) })
		}
	}
	wg.Wait()
	defer func() {
		for _, cs := range conns {
			for _, c := range cs {
				if c.b != nil {
					c.b.Close()
				}
			}
		}
	}()

	r.reportConnections(ids, conns)
	for i := range ids {
		for _, c := range conns[i] {
			if c.name != "" {
				facts.servers[c.url] = c.name
			}
		}
	}
	for i, id := range ids {
		if conns[i] != nil {
			r.checkOrder(id, conns[i])
		}
	}

	// The best reader with a live connection reads the rest.
	best := func(from []string, pred func(identity) bool) *connection {
		for _, want := range from {
			for i, id := range ids {
				if id.name != want || !pred(id) {
					continue
				}
				for j := range conns[i] {
					if conns[i][j].b != nil {
						return &conns[i][j]
					}
				}
			}
		}
		return nil
	}
	all := func(identity) bool { return true }
	if c := best(readers, all); c != nil {
		r.checkStreams(ctx, c, ids)
	} else {
		r.out.addf(Skipped, "bus.streams", "", "", "no identity of this host reached a server: the streams were not checked")
	}
	r.checkMeta(ctx)
	if c := best(readers[:4], all); c != nil {
		facts.groupStatus, facts.statusErr = r.readGroupStatus(ctx, c.b)
		facts.clusters = sortedKeys(facts.groupStatus)
	} else {
		facts.statusErr = "no identity of this host that may read the state bucket (arbiter, replicator, ipmover, scheduler) reached a server"
	}
	if c := best([]string{"arbiter"}, all); c != nil {
		// The arbiter reads its own cluster's.
		cluster := r.files.arbiter.Cluster
		facts.heartbeats, facts.heartbeatsErr = r.readHeartbeats(ctx, c.b, cluster, facts.groupStatus[cluster])
	} else {
		facts.heartbeatsErr = "heartbeats are in the live stream, which only the arbiter's identity (and the people's) may read, and no arbiter on this host reached a server"
	}
	return facts
}

// connect dials one server as the identity, with its bus section narrowed
// to that one server.
func (r *run) connect(ctx context.Context, id identity, url string) connection {
	cfg := id.c.Bus
	cfg.URL = url
	cfg.ConnectOnce = true
	ctx, cancel := context.WithTimeout(ctx, r.o.Step+time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, cfg, bus.Identity{Cluster: id.c.Cluster, Service: "doctor-" + id.name, Node: id.c.Node}, r.o.Log)
	if err != nil {
		return connection{who: id.label(), url: url, err: err}
	}
	return connection{who: id.label(), url: url, name: b.NC.ConnectedServerName(), b: b}
}

// reportConnections says, per identity, which servers took it, and for
// the others why not: one finding per reason, naming every identity and
// server it holds for (a server that does not answer refuses everyone).
func (r *run) reportConnections(ids []identity, conns [][]connection) {
	type failure struct {
		why, fix string
		who      []string
		urls     []string
	}
	var failures []*failure
	for i, id := range ids {
		var reached []string
		for _, c := range conns[i] {
			if c.err == nil {
				reached = append(reached, c.name)
				continue
			}
			why, fix := connectFailure(c.err, id)
			j := slices.IndexFunc(failures, func(f *failure) bool { return f.why == why && f.fix == fix })
			if j < 0 {
				failures = append(failures, &failure{why: why, fix: fix})
				j = len(failures) - 1
			}
			f := failures[j]
			if !slices.Contains(f.who, id.label()) {
				f.who = append(f.who, id.label())
			}
			if !slices.Contains(f.urls, c.url) {
				f.urls = append(f.urls, c.url)
			}
		}
		if len(reached) == 0 {
			continue
		}
		how := "no identity (loopback)"
		switch {
		case id.c.Bus.NKeySeed != "" && id.c.Bus.TLS.Cert != "":
			how = "TLS with its certificate, nkey"
		case id.c.Bus.NKeySeed != "":
			how = "nkey"
		case id.c.Bus.Creds != "":
			how = "credentials file"
		case id.c.Bus.TLS.Cert != "":
			how = "TLS with its certificate"
		}
		r.out.addf(OK, "bus.connect", id.label(), "", "accepted by %s (%s)", strings.Join(reached, ", "), how)
	}
	for _, f := range failures {
		r.out.addf(Error, "bus.connect", strings.Join(f.who, ", ")+" to "+strings.Join(f.urls, ", "), f.fix, "%s", f.why)
	}
}

// connectFailure classifies a refused connection by what the server said.
func connectFailure(err error, id identity) (why, fix string) {
	msg := err.Error()
	file := id.file
	switch {
	case errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(msg), "authorization violation"):
		return "the server refused the identity (authorization violation): bus.nkey_seed is not the seed the server knows for the service on this host",
			"install this host's own bundle: the " + id.name + ".nk and " + id.name + "-bus.yaml of hosts/" + id.c.Node + " from fanctl nats-config (deploy/systemd/README.md), bus: in " + file
	case strings.Contains(msg, "certificate signed by unknown authority"):
		return "the server's certificate is not signed by bus.tls.ca: " + msg, "bus.tls.ca must be the bundle's ca.pem, from the same fanctl nats-config run as the servers' (" + file + ")"
	case strings.Contains(msg, "bad certificate") || strings.Contains(msg, "certificate required") || strings.Contains(msg, "unknown certificate"):
		return "the server refused this service's TLS certificate: " + msg, "bus.tls.cert and bus.tls.key from this host's bundle, issued by the cluster's CA (" + file + ")"
	case strings.Contains(msg, "certificate has expired"):
		return "a certificate has expired: " + msg, "fanctl nats-config --renew, then copy the certificates (deploy/systemd/README.md, Certificate renewal)"
	case strings.Contains(msg, "connection refused"):
		return "nothing listens there (connection refused)", "start the NATS server there, or fix bus.url in " + file
	case strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "timeout") || strings.Contains(msg, "no servers available"):
		return "not reached (" + lastPart(msg) + ")", "the port checks below say whether the server's port answers from here: start the server, or let its client port through"
	case strings.Contains(msg, "insecure bus refused"):
		return msg, "bus.tls.ca and the identity from this host's bundle (" + file + ")"
	}
	return msg, ""
}

// lastPart is the end of a wrapped error ("bus connect X: dial tcp X: i/o
// timeout" -> "i/o timeout"), the part that says what happened.
func lastPart(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// checkStreams: fan's streams exist (else: provision), and each one's raft
// peers are current.
func (r *run) checkStreams(ctx context.Context, c *connection, ids []identity) {
	calls := events.KVStreamName(events.CallsBucket)
	names := []string{events.EventsStream, events.LiveStream, events.CommandsStream, events.KVStreamName(events.StateBucket), calls}
	// Only the arbiter and the replicator may look at the object stores.
	if slices.ContainsFunc(ids, func(id identity) bool { return id.name == "arbiter" || id.name == "replicator" }) {
		names = append(names, events.ObjectStreamName(events.ReplBlobBucket), events.ObjectStreamName(events.ReplManifestBucket))
	}
	missing := 0
	for _, name := range names {
		sctx, cancel := context.WithTimeout(ctx, r.o.Step)
		st, err := c.b.JS.Stream(sctx, name)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = st.Info(sctx)
		}
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound):
			missing++
			what := "not provisioned: the services wait for it and never become ready"
			if name == calls {
				// A bus provisioned before the bucket of calls existed.
				what = "not provisioned: no call in progress is recorded, so none is carried across a failover"
			}
			r.out.addf(Error, "bus.streams", name, "run fanctl provision with the admin's bundle: fanctl --config <admin bundle>/fanctl.yaml provision --replicas 3 (deploy/systemd/README.md, Provisioning)", "%s", what)
			continue
		case err != nil:
			r.out.addf(Error, "bus.streams", name, "", "could not be read as %s: %v (no permission, or no JetStream leader)", c.who, err)
			continue
		}
		r.checkPeers(name, info.Config.Replicas, info.Cluster)
	}
	if missing == 0 {
		r.out.addf(OK, "bus.streams", strings.Join(names, ", "), "", "provisioned")
	}
}

// checkPeers: a raft group has a leader and every replica current and
// online; else the cluster cannot lose another server without losing it.
func (r *run) checkPeers(group string, replicas int, ci *jetstream.ClusterInfo) {
	if ci == nil || replicas <= 1 && len(ci.Replicas) == 0 {
		r.out.addf(OK, "bus.peers", group, "", "one replica (no raft peers)")
		return
	}
	if ci.Leader == "" {
		r.out.addf(Error, "bus.peers", group, "see which NATS servers are down: fanctl status; the servers' logs", "no leader: nothing can be written to it")
		return
	}
	var offline, behind, current []string
	for _, p := range ci.Replicas {
		if p == nil {
			continue
		}
		switch {
		case p.Offline:
			offline = append(offline, p.Name)
		case !p.Current:
			behind = append(behind, fmt.Sprintf("%s (%d behind, heard %v ago)", p.Name, p.Lag, p.Active.Round(time.Millisecond)))
		default:
			current = append(current, p.Name)
		}
	}
	missing := replicas - 1 - len(ci.Replicas)
	switch {
	case len(offline) > 0 || missing > 0:
		what := strings.Join(offline, ", ")
		if missing > 0 {
			what = strings.TrimPrefix(what+fmt.Sprintf(", %d peer(s) not listed", missing), ", ")
		}
		r.out.addf(Error, "bus.peers", group, "start the NATS server(s) named, and check the routes between the servers (port 6222)",
			"leader %s; offline: %s: one more server lost and the group stops", ci.Leader, what)
	case len(behind) > 0:
		r.out.addf(Warning, "bus.peers", group, "wait and run again: a server that just started catches up within seconds; one that stays behind has a slow disk or link",
			"leader %s; not current: %s", ci.Leader, strings.Join(behind, ", "))
	default:
		r.out.addf(OK, "bus.peers", group, "", "leader %s, current: %s", ci.Leader, strings.Join(current, ", "))
	}
}

// checkMeta: the meta group (which creates every stream and consumer) has
// every peer current, read through the arbiter's system-account identity.
func (r *run) checkMeta(ctx context.Context) {
	a := r.files.arbiter
	if a == nil || a.Bus.System == nil || a.Bus.URL == "" {
		r.out.addf(Skipped, "bus.peers", "meta group", "", "only the arbiter's system-account identity (arbiter.yaml bus.system) may read it, and none is on this host")
		return
	}
	cfg := a.Bus
	sys, err := bus.ConnectSystem(cfg, "fan-doctor-system-"+a.Node, r.o.Log)
	if err != nil {
		r.out.addf(Error, "bus.peers", "meta group", "bus.system from this host's bundle (arbiter-system.nk; deploy/systemd/README.md)", "the system account refused the arbiter's bus.system: %v", err)
		return
	}
	defer sys.Close()
	mctx, cancel := context.WithTimeout(ctx, r.o.Step)
	defer cancel()
	meta, err := bus.MetaCluster(mctx, sys)
	if err != nil {
		r.out.addf(Error, "bus.peers", "meta group", "", "no answer from the meta leader through bus.system: %v", err)
		return
	}
	r.checkPeers("meta group", max(meta.Size, len(meta.Cluster.Replicas)+1), meta.Cluster)
}

// readGroupStatus reads every group status record of the bus, by cluster.
func (r *run) readGroupStatus(ctx context.Context, b *bus.Bus) (map[string][]events.GroupStatus, string) {
	rctx, cancel := context.WithTimeout(ctx, r.o.Step)
	defer cancel()
	records, err := view.Records[events.GroupStatus](rctx, b, view.StatusFilter(""))
	if err != nil {
		return nil, fmt.Sprintf("the group status records could not be read: %v", err)
	}
	out := map[string][]events.GroupStatus{}
	for _, rec := range records {
		c := view.ClusterOfKey(rec.Key)
		out[c] = append(out[c], rec.Value)
	}
	return out, ""
}

// readHeartbeats reads the last heartbeat of every node of this cluster's
// groups (and of the local arbiter.yaml's) from the live stream.
func (r *run) readHeartbeats(ctx context.Context, b *bus.Bus, cluster string, status []events.GroupStatus) (map[string]heartbeat, string) {
	hctx, cancel := context.WithTimeout(ctx, r.o.Step)
	defer cancel()
	if _, err := b.JS.Stream(hctx, bus.LiveStream); err != nil {
		return nil, fmt.Sprintf("the live stream could not be read as the arbiter: %v", err)
	}
	records := make([]view.Keyed[events.GroupStatus], 0, len(status)+1)
	for _, st := range status {
		records = append(records, view.Keyed[events.GroupStatus]{Key: events.GroupStatusKey(cluster, st.Group), Value: st})
	}
	if a := r.files.arbiter; a != nil {
		nodes := map[string]events.NodeStatus{}
		for _, g := range a.Groups {
			for _, n := range g.Nodes {
				nodes[n] = events.NodeStatus{}
			}
		}
		records = append(records, view.Keyed[events.GroupStatus]{Key: events.GroupStatusKey(cluster, "arbiter-yaml"), Value: events.GroupStatus{Nodes: nodes}})
	}
	out := map[string]heartbeat{}
	for key, h := range view.Heartbeats(hctx, b, records) {
		node := key[strings.Index(key, "/")+1:]
		out[node] = heartbeat{name: h.Beat.PBXSystemName, at: h.At}
	}
	return out, ""
}
