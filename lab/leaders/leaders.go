// Package leaders finds and moves the raft leaders of a NATS JetStream
// cluster for fan's tests, benchmarks and chaos runs: every stream and
// every durable consumer is a raft group of its own, and where its leader
// sits decides what a server's crash costs. nats-server moves a leader only
// on request (a step-down naming a preferred server, since 2.11); this
// package sends those requests and waits for them to take effect. It also
// reads who holds the arbiter's lease.
package leaders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Group is one raft group: a stream, or a durable consumer of one.
type Group struct {
	Stream   string
	Consumer string // empty for the stream itself
	// Leader is the name of the server leading it ("" while electing).
	Leader string
	// Current is true when every replica is current with the leader.
	Current bool
}

func (g Group) String() string {
	if g.Consumer == "" {
		return "stream " + g.Stream
	}
	return "consumer " + g.Stream + "/" + g.Consumer
}

// List returns every replicated stream of the account and every durable
// consumer on them, with their current leaders. Ephemeral consumers (an
// ordered Watch) are left out: they are recreated, not elected.
func List(ctx context.Context, js jetstream.JetStream) ([]Group, error) {
	// A JetStream API request whose reply is lost (its server restarted, the
	// meta leader moved) waits out its context: bound each listing so that a
	// caller polling until a deadline polls again instead of waiting past it.
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	var out []Group
	streams := js.ListStreams(ctx)
	for info := range streams.Info() {
		if info.Config.Replicas < 2 {
			continue
		}
		out = append(out, Group{Stream: info.Config.Name, Leader: leaderOf(info.Cluster), Current: current(info.Cluster)})
		st, err := js.Stream(ctx, info.Config.Name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", info.Config.Name, err)
		}
		consumers := st.ListConsumers(ctx)
		for ci := range consumers.Info() {
			if ci.Config.Durable == "" {
				continue
			}
			out = append(out, Group{Stream: info.Config.Name, Consumer: ci.Name, Leader: leaderOf(ci.Cluster), Current: current(ci.Cluster)})
		}
		if err := consumers.Err(); err != nil {
			return nil, fmt.Errorf("consumers of %s: %w", info.Config.Name, err)
		}
	}
	if err := streams.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	return out, nil
}

// listTimeout bounds one listing; on a healthy cluster it takes milliseconds.
const listTimeout = 5 * time.Second

func leaderOf(c *jetstream.ClusterInfo) string {
	if c == nil {
		return ""
	}
	return c.Leader
}

// The JetStream API's step-down subjects (nats-server's
// JSApiStreamLeaderStepDownT and JSApiConsumerLeaderStepDownT): NATS's own
// names, not fan's.
const (
	streamStepDownT   = "$JS.API.STREAM.LEADER.STEPDOWN.%s"
	consumerStepDownT = "$JS.API.CONSUMER.LEADER.STEPDOWN.%s.%s"
)

func current(c *jetstream.ClusterInfo) bool {
	if c == nil || c.Leader == "" {
		return false
	}
	for _, r := range c.Replicas {
		if r == nil || !r.Current || r.Offline {
			return false
		}
	}
	return true
}

// Settled is true when every group has a leader and current replicas: the
// cluster can lose any one server without losing a group.
func Settled(gs []Group) bool {
	if len(gs) == 0 {
		return false
	}
	for _, g := range gs {
		if !g.Current {
			return false
		}
	}
	return true
}

// stepDownRequest is the body of a leader step-down request.
type stepDownRequest struct {
	Placement struct {
		Preferred string `json:"preferred,omitempty"`
	} `json:"placement"`
}

type apiResponse struct {
	Success bool `json:"success"`
	Error   *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error,omitempty"`
}

// StepDown asks g's leader to hand the group to preferred ("" lets the
// group elect anyone else). The new leader is elected after the reply.
func StepDown(ctx context.Context, nc *nats.Conn, g Group, preferred string) error {
	subject := fmt.Sprintf(streamStepDownT, g.Stream)
	if g.Consumer != "" {
		subject = fmt.Sprintf(consumerStepDownT, g.Stream, g.Consumer)
	}
	var req stepDownRequest
	req.Placement.Preferred = preferred
	body, _ := json.Marshal(req)
	msg, err := nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return fmt.Errorf("step down %s: %w", g, err)
	}
	var resp apiResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("step down %s: reply %q: %w", g, msg.Data, err)
	}
	if !resp.Success {
		if resp.Error != nil {
			return fmt.Errorf("step down %s to %q: %s (%d)", g, preferred, resp.Error.Description, resp.Error.ErrCode)
		}
		return fmt.Errorf("step down %s to %q: refused", g, preferred)
	}
	return nil
}

// MoveAll moves the leader of every group List finds onto server, retrying
// (a step-down is refused while a group is electing, or while the
// preferred server is not current), until all are there or ctx ends. It
// returns the groups as last seen.
func MoveAll(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, server string) ([]Group, error) {
	var lastErr error
	for {
		gs, err := List(ctx, js)
		if err != nil {
			lastErr = err
		}
		off := Off(gs, server)
		if err == nil && len(gs) > 0 && len(off) == 0 {
			return gs, nil
		}
		for _, g := range off {
			if g.Leader == "" {
				continue // electing: ask again once it has a leader
			}
			if err := StepDown(ctx, nc, g, server); err != nil {
				lastErr = err
			}
		}
		select {
		case <-ctx.Done():
			return gs, fmt.Errorf("leaders not all on %s (%s): %w (last error: %v)", server, Describe(off), ctx.Err(), lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitAllOn waits, without moving anything, until every group is led by
// one of servers.
func WaitAllOn(ctx context.Context, js jetstream.JetStream, servers ...string) ([]Group, error) {
	for {
		gs, err := List(ctx, js)
		off := Off(gs, servers...)
		if err == nil && len(gs) > 0 && len(off) == 0 {
			return gs, nil
		}
		select {
		case <-ctx.Done():
			return gs, fmt.Errorf("leaders not all on %v (%s): %w (last error: %v)", servers, Describe(off), ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Off returns the groups not led by one of servers.
func Off(gs []Group, servers ...string) []Group {
	var out []Group
	for _, g := range gs {
		if !slices.Contains(servers, g.Leader) {
			out = append(out, g)
		}
	}
	return out
}

// On returns the groups led by server.
func On(gs []Group, server string) []Group {
	var out []Group
	for _, g := range gs {
		if g.Leader == server {
			out = append(out, g)
		}
	}
	return out
}

// Describe prints groups as "stream X@leader, ...".
func Describe(gs []Group) string {
	var parts []string
	for _, g := range gs {
		l := g.Leader
		if l == "" {
			l = "(electing)"
		}
		parts = append(parts, g.String()+"@"+l)
	}
	return strings.Join(parts, ", ")
}

// Lease is the arbiter lease's last record.
type Lease struct {
	// Holder is the replica's name: "<node>/<host>/<pid>".
	Holder string    `json:"holder"`
	Epoch  uint64    `json:"epoch"`
	At     time.Time `json:"at"`
}

// Node is the node part of the holder's name (the arbiter's node key).
func (l Lease) Node() string {
	node, _, _ := strings.Cut(l.Holder, "/")
	return node
}

// ErrNoLease is returned while no replica holds the lease.
var ErrNoLease = errors.New("no arbiter lease record")

// ArbiterLease reads the arbiter lease's last record for cluster. A record
// lives for the lease's TTL (a message TTL), so one that is found is
// current, give or take a renewal.
func ArbiterLease(ctx context.Context, js jetstream.JetStream, cluster string) (Lease, error) {
	st, err := js.Stream(ctx, events.CommandsStream)
	if err != nil {
		return Lease{}, fmt.Errorf("arbiter lease: %w", err)
	}
	msg, err := st.GetLastMsgForSubject(ctx, events.LeaseSubject(cluster, "arbiter"))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Lease{}, ErrNoLease
	}
	if err != nil {
		return Lease{}, fmt.Errorf("arbiter lease: %w", err)
	}
	var l Lease
	if err := json.Unmarshal(msg.Data, &l); err != nil {
		return Lease{}, fmt.Errorf("arbiter lease record %q: %w", msg.Data, err)
	}
	if l.Holder == "" {
		return Lease{}, ErrNoLease
	}
	return l, nil
}
