// Package bench measures failover time the way a phone experiences it: from
// the fault to the first SIP OPTIONS answered through the floating IP, seen
// from a client namespace probing every 10 ms. It runs fan and keepalived
// in the same namespace topology with equal budgets, so the two columns of
// a result line are comparable.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/poll"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// Scenario is a kind of fault.
type Scenario string

const (
	// PBXDeath: the SIP server on the holder is stopped and its AMI frozen;
	// the node itself stays up.
	PBXDeath Scenario = "pbx-death"
	// NodeCrash: every process in the holder's namespace is killed.
	NodeCrash Scenario = "node-crash"
	// LinkCut: the holder's link to the bridge goes down.
	LinkCut Scenario = "link-cut"
)

// Scenarios lists the failover scenarios in report order.
var Scenarios = []Scenario{PBXDeath, NodeCrash, LinkCut}

// System is a failover system under test, running in a lab.
type System interface {
	Name() string
	// Fault injects s on node (the current holder).
	Fault(ctx context.Context, s Scenario, node string) error
	// Restore undoes the fault so node can serve again (as a standby).
	Restore(ctx context.Context, s Scenario, node string) error
	// Ready reports whether node is back to a healthy standby after Restore.
	Ready(ctx context.Context, node string) bool
	Close()
}

// Client probes the floating IP from the client namespace.
type Client struct {
	lab *netlab.Lab
	p   *sipoptions.Pinger
}

// NewClient opens a pinger inside the client namespace.
func NewClient(l *netlab.Lab) (*Client, error) {
	c := &Client{lab: l}
	err := l.Do(netlab.ClientHost, func() error {
		var err error
		c.p, err = sipoptions.NewPinger(netip.AddrPortFrom(l.FloatingIP().Addr(), netlab.SIPPort).String())
		return err
	})
	return c, err
}

// Close releases the socket.
func (c *Client) Close() { c.p.Close() }

// Holder returns the node that answers on the floating IP now, requiring
// several consecutive answers from it so a transient state is not taken
// for the holder.
func (c *Client) Holder(ctx context.Context, within time.Duration) (string, error) {
	last, streak := "", 0
	err := poll.Until(ctx, within, "a stable holder on the floating IP", func() error {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		r, err := c.p.Ping(pctx)
		cancel()
		switch {
		case err != nil:
			streak = 0
			return fmt.Errorf("%w (the last answer from %q)", err, last)
		case r.ServerNode == last:
			streak++
		default:
			last, streak = r.ServerNode, 1
		}
		if streak < 5 {
			return fmt.Errorf("%q answered %d times in a row", last, streak)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return last, nil
}

// FirstAnswerFrom probes every 10 ms (overlapping probes, so a lost one
// never delays the next) until a node other than not answers, and returns
// when that answer arrived and who gave it.
func (c *Client) FirstAnswerFrom(ctx context.Context, not string, within time.Duration) (string, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	type answer struct {
		node string
		at   time.Time
	}
	got := make(chan answer, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer pcancel()
			r, err := c.p.Ping(pctx)
			if err == nil && r.ServerNode != not && r.ServerNode != "" {
				select {
				case got <- answer{r.ServerNode, time.Now()}:
				default:
				}
			}
		}()
		select {
		case a := <-got:
			return a.node, a.at, nil
		case <-ctx.Done():
			return "", time.Time{}, fmt.Errorf("no node other than %s answered within %v", not, within)
		case <-t.C:
		}
	}
}

// Cycle is one measured failover.
type Cycle struct {
	From, To string
	At       time.Time // the fault
	Took     time.Duration
}

// faultPhaseSpread spreads the faults' moments over more than any
// system's probe or advert interval at the budgets compared (50 ms).
const faultPhaseSpread = 100 * time.Millisecond

// Run measures cycles failovers of scenario s on sys. Each cycle finds the
// holder, injects the fault, waits for the first answer from another node,
// restores the faulted node and waits until it is a ready standby again.
func Run(ctx context.Context, sys System, c *Client, s Scenario, cycles int, progress func(Cycle)) ([]Cycle, error) {
	var out []Cycle
	for i := range cycles {
		holder, err := c.Holder(ctx, 30*time.Second)
		if err != nil {
			return out, fmt.Errorf("%s %s cycle %d: %w", sys.Name(), s, i, err)
		}
		// The fault's moment is random against each system's timers. Right
		// after Holder it can keep one phase against them from cycle to
		// cycle (in one run keepalived took over 153 ms after 9 of 10 link
		// cuts, where a random phase spreads them over its advert
		// interval), and the figure would measure that phase, not the
		// system.
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(rand.N(faultPhaseSpread)):
		}
		fault := time.Now()
		if err := sys.Fault(ctx, s, holder); err != nil {
			return out, fmt.Errorf("%s %s cycle %d: fault: %w", sys.Name(), s, i, err)
		}
		to, at, err := c.FirstAnswerFrom(ctx, holder, 30*time.Second)
		if err != nil {
			_ = sys.Restore(ctx, s, holder)
			return out, fmt.Errorf("%s %s cycle %d: %w", sys.Name(), s, i, err)
		}
		cy := Cycle{From: holder, To: to, At: fault, Took: at.Sub(fault)}
		out = append(out, cy)
		if progress != nil {
			progress(cy)
		}
		if err := sys.Restore(ctx, s, holder); err != nil {
			return out, fmt.Errorf("%s %s cycle %d: restore: %w", sys.Name(), s, i, err)
		}
		if err := waitReady(ctx, sys, holder, 60*time.Second); err != nil {
			return out, fmt.Errorf("%s %s cycle %d: after restore: %w", sys.Name(), s, i, err)
		}
	}
	return out, nil
}

// errNotReady is the last word of a wait for System.Ready, which says no
// more than that.
var errNotReady = errors.New("not ready")

// waitReady waits until sys calls node a ready standby. Each look asks
// every node's namespace (and fan's bus), hence a tenth of a second apart.
func waitReady(ctx context.Context, sys System, node string, within time.Duration) error {
	return poll.Every(ctx, 100*time.Millisecond, within, node+" ready as a standby", func() error {
		if !sys.Ready(ctx, node) {
			return errNotReady
		}
		return nil
	})
}

// Percentile is the nearest-rank percentile (p in 0..100) in milliseconds.
func Percentile(cs []Cycle, p float64) float64 {
	if len(cs) == 0 {
		return math.NaN()
	}
	d := make([]time.Duration, len(cs))
	for i, c := range cs {
		d[i] = c.Took
	}
	slices.Sort(d)
	rank := int(math.Ceil(p / 100 * float64(len(d))))
	rank = min(max(rank, 1), len(d))
	return float64(d[rank-1].Microseconds()) / 1000
}

// Line renders one scenario's result in the report format. cycles counts
// the cycles both systems completed, or the one system's that ran (-systems):
// a system that did not run shows NaN, not zero cycles for the other.
func Line(s Scenario, fan, ka []Cycle) string {
	fp99, kp99 := Percentile(fan, 99), Percentile(ka, 99)
	n := min(len(fan), len(ka))
	if len(fan) == 0 || len(ka) == 0 {
		n = max(len(fan), len(ka))
	}
	return fmt.Sprintf("scenario=%s cycles=%d fan_p50_ms=%.0f fan_p99_ms=%.0f keepalived_p50_ms=%.0f keepalived_p99_ms=%.0f ratio_p99=%.2f",
		s, n, Percentile(fan, 50), fp99, Percentile(ka, 50), kp99, fp99/kp99)
}

// CountMoves counts the arbiter's decisions that moved a group (failover,
// switchover, failback, retry) and, among them, the failbacks.
func CountMoves(evs []stack.Event) (moves, failbacks int) {
	for _, e := range evs {
		d, ok := e.Payload.(*events.ArbiterDecision)
		if !ok {
			continue
		}
		switch d.Action {
		case events.ActionFailover, events.ActionSwitchover, events.ActionRetry:
			moves++
		case events.ActionFailback:
			moves++
			failbacks++
		}
	}
	return moves, failbacks
}
