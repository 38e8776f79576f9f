package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/fanpbx/fan/lab/leaders"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// nsDialer dials from inside a lab host's namespace, for every connection
// and reconnection of a client running in the test process.
type nsDialer struct {
	s    *Stack
	host string
}

func (d nsDialer) Dial(network, address string) (net.Conn, error) {
	var c net.Conn
	err := d.s.Lab.Do(d.host, func() error {
		var err error
		c, err = net.DialTimeout(network, address, 2*time.Second)
		return err
	})
	return c, err
}

// Connect opens a NATS connection from host's namespace to the servers in
// the order host's services use; the caller closes it.
func (s *Stack) Connect(host string) (*nats.Conn, jetstream.JetStream, error) {
	return s.connect(host, s.NATSURLFor(host))
}

// ConnectAs is Connect with the bus identity of host's service svc
// (arbiter, prober, ...): its nkey and certificate on a SecureBus lab, where
// a client without one is refused; the same as Connect on a plain bus. A
// test uses it to do what that service's credentials allow, such as
// corrupting the record the service keeps.
func (s *Stack) ConnectAs(host, svc string) (*nats.Conn, jetstream.JetStream, error) {
	auth := s.busAuth(host, svc)
	url, _ := auth["NATS"].(string)
	if url == "" {
		return s.Connect(host)
	}
	var opts []nats.Option
	if seed, _ := auth["BusSeed"].(string); seed != "" {
		o, err := nats.NkeyOptionFromSeed(seed)
		if err != nil {
			return nil, nil, fmt.Errorf("nats from %s as %s: %w", host, svc, err)
		}
		pub, err := seedPublicKey(seed)
		if err != nil {
			return nil, nil, fmt.Errorf("nats from %s as %s: %w", host, svc, err)
		}
		// Replies come only to the identity's own inbox (its permissions).
		opts = append(opts, o, nats.CustomInboxPrefix(events.InboxPrefix(pub)))
	}
	if ca, _ := auth["BusCA"].(string); ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	if cert, _ := auth["BusCert"].(string); cert != "" {
		key, _ := auth["BusKey"].(string)
		opts = append(opts, nats.ClientCert(cert, key))
	}
	return s.connect(host, url, opts...)
}

// seedPublicKey reads an nkey seed file and returns its public key.
func seedPublicKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(b))
	if err != nil {
		return "", err
	}
	return kp.PublicKey()
}

func (s *Stack) connect(host, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts = append(opts, nats.SetCustomDialer(nsDialer{s, host}),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Name("fan-lab-"+host))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("nats from %s: %w", host, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// ForceOnto puts every raft leader (fan's streams, the state bucket's
// stream, every durable consumer) on host's NATS server and the arbiter's
// lease on host's arbiter replica: the worst place for them when host
// dies. The lease moves by stopping every replica and starting host's
// alone; the others return once it holds the lease. The leaders move last,
// and never against a steward in its steady state: the new holder's steward
// moves every leader to bus.leader_servers the moment it takes the lease
// and then leaves each group it moved alone for its minimum gap (5 s), the
// window in which they are moved here. Nothing keeps them there afterwards.
func (s *Stack) ForceOnto(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, host string) error {
	before, err := leaders.ArbiterLease(ctx, js, s.opts.Cluster)
	if err != nil && !errors.Is(err, leaders.ErrNoLease) {
		return err
	}
	hosts := s.ArbiterHosts()
	for _, h := range hosts {
		if p := s.Proc(h, "fan-arbiter"); p != nil && !p.Exited() {
			if err := p.Stop(); err != nil {
				return fmt.Errorf("stop arbiter on %s: %w", h, err)
			}
		}
	}
	if err := s.startControl(host, "fan-arbiter"); err != nil {
		return err
	}
	var last error
	for {
		l, err := leaders.ArbiterLease(ctx, js, s.opts.Cluster)
		if err == nil && l.Node() == host && l.Epoch > before.Epoch {
			break
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("arbiter lease did not move to %s: %w (last: %v)", host, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
	var errs []error
	for _, h := range hosts {
		if h != host {
			errs = append(errs, s.startControl(h, "fan-arbiter"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err = leaders.MoveAll(ctx, nc, js, s.ServerName(host))
	return err
}
