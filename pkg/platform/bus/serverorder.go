package bus

import (
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// serverOrder chooses the server a connection dials: bus.url's servers in
// the order given, the first of them that has not just failed. A server
// fails when a dial to it fails or when the connection to it is lost: one
// that went silent (a frozen process, a host cut off) is not dialled again
// first, which would cost a whole connect timeout before the next server.
//
// nats.go shuffles its server list and, on a lost connection, takes the
// next server of the shuffle. In the witness topology that puts a PBX
// host's services on the other PBX host's server half the time, and when
// that host dies they lose the bus with it (until the dead connection is
// noticed, three ping intervals): the one prober that must report the
// dead node unreachable is then silent, and the arbiter, which never
// replaces a holder only because it fell silent, waits. Listing this
// host's server first and the witness's second, and dialling in that
// order, keeps them off the other PBX host's server while either of the
// two is up.
type serverOrder struct {
	prefer    []string // host:port, in bus.url's order
	urls      []string // the bus.url entry of each of prefer, as written (home dials it)
	failedFor time.Duration
	retryWait time.Duration
	now       func() time.Time

	mu      sync.Mutex
	failed  map[string]time.Time // host:port -> last failed dial or lost connection
	tried   string               // the dial in flight, "" once connected
	current string               // host:port connected to, "" once lost
	moveTo  string               // host:port a deliberate move (home) dials next
}

// serverFailedFor is how long a server whose dial failed is passed over
// for one that has not failed.
const serverFailedFor = 5 * time.Second

func newServerOrder(urls string, retryWait time.Duration) *serverOrder {
	o := &serverOrder{failedFor: serverFailedFor, retryWait: retryWait, now: time.Now, failed: map[string]time.Time{}}
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if h := serverHost(u); h != "" {
			o.prefer = append(o.prefer, h)
			o.urls = append(o.urls, u)
		}
	}
	return o
}

// serverHost is the host:port of a bus.url entry (serverURL; port 4222
// when left out), as nats.go keeps it in its pool; "" when it does not parse.
func serverHost(s string) string {
	u, err := serverURL(s)
	if err != nil {
		return ""
	}
	if u.Port() == "" {
		return u.Host + ":4222"
	}
	return u.Host
}

// rank orders a server: its place in bus.url, and servers the cluster
// advertised (not configured) after every configured one.
func (o *serverOrder) rank(host string, i int) int {
	for r, h := range o.prefer {
		if h == host {
			return r
		}
	}
	return len(o.prefer) + i
}

// pick is nats.go's ReconnectToServer callback: it is called before each
// dial of a reconnect, so being called while a dial was in flight means
// that dial failed, and being called while connected means that connection
// was lost.
func (o *serverOrder) pick(pool []nats.Server, _ nats.ServerInfo) (*nats.Server, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	if o.tried != "" {
		o.failed[o.tried] = now
	}
	if o.current != "" {
		if o.moveTo == "" {
			o.failed[o.current] = now
		}
		o.current = ""
	}
	if to := o.moveTo; to != "" {
		o.moveTo = ""
		for i := range pool {
			if pool[i].URL != nil && pool[i].URL.Host == to {
				o.tried = to
				return &pool[i], 0
			}
		}
	}
	best, oldest := -1, -1
	for i := range pool {
		if pool[i].URL == nil {
			continue
		}
		h := pool[i].URL.Host
		at, ok := o.failed[h]
		if !ok || now.Sub(at) >= o.failedFor {
			if best < 0 || o.rank(h, i) < o.rank(pool[best].URL.Host, best) {
				best = i
			}
			continue
		}
		if oldest < 0 || at.Before(o.failed[pool[oldest].URL.Host]) {
			oldest = i
		}
	}
	switch {
	case best >= 0:
		o.tried = pool[best].URL.Host
		return &pool[best], 0
	case oldest >= 0:
		// Every server failed a moment ago: the least recent, after the
		// usual reconnect wait, so that a dead cluster is not dialled in
		// a tight loop.
		o.tried = pool[oldest].URL.Host
		return &pool[oldest], o.retryWait
	}
	return nil, 0 // nats.go's own choice
}

// move makes the next reconnect a deliberate move to host, which has just
// answered (home's probe): it is dialled first even if it failed a moment
// ago, and the server left behind is not counted as failed. Without this,
// a move home within serverFailedFor of the home server's restart passed
// over that server (it had failed) and the one left (it was "lost"), and
// went to the only other: in the colocated chaos a PBX host's prober, sent
// home 3 s after its own server came back, landed on the other PBX host's
// server, lost the bus with that host's link cut a few seconds later, and
// the arbiter, hearing no peer report on the cut holder, held for 6 s.
// cancel undoes a move whose reconnect could not start.
func (o *serverOrder) move(host string) (cancel func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.moveTo = host
	delete(o.failed, host)
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.moveTo == host {
			o.moveTo = ""
		}
	}
}

// options make a connection dial in this order. Its reconnect handler must
// call connected; a first connection made by retrying (RetryOnFailedConnect)
// ends in the connect handler set here.
func (o *serverOrder) options() []nats.Option {
	return []nats.Option{nats.DontRandomize(), nats.ReconnectToServer(o.pick),
		nats.ConnectHandler(func(nc *nats.Conn) { o.connected(nc.ConnectedUrl()) })}
}

// connected ends a reconnect: the dial in flight succeeded, to url (the
// connection's ConnectedUrl).
func (o *serverOrder) connected(url string) {
	o.mu.Lock()
	o.tried = ""
	o.current = serverHost(url)
	o.mu.Unlock()
}
