package bench

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
)

// Spin keeps one core busy until the process is killed: the body of
// `fan-bench hog`, one process per core.
func Spin() {
	runtime.GOMAXPROCS(1)
	x := uint64(1)
	for {
		x = x*6364136223846793005 + 1442695040888963407
		if x == 0 {
			runtime.Gosched() // never in practice; keeps the loop from looking empty
		}
	}
}

// Hog is a busy loop on every core, each a process of its own at normal
// priority, so fan's processes compete for the CPU as they would with a
// runaway process on a PBX host.
type Hog struct {
	cmds []*exec.Cmd
}

// StartHog starts n copies of `self hog` (n < 1: one per core).
func StartHog(self string, n int) (*Hog, error) {
	if n < 1 {
		n = runtime.NumCPU()
	}
	h := &Hog{}
	for range n {
		c := exec.Command(self, "hog")
		// Gone with the benchmark even if it dies without Stop.
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			h.Stop()
			return nil, fmt.Errorf("start CPU hog: %w", err)
		}
		h.cmds = append(h.cmds, c)
	}
	return h, nil
}

// Cores is how many busy loops run.
func (h *Hog) Cores() int { return len(h.cmds) }

// Stop kills every busy loop and reaps it.
func (h *Hog) Stop() {
	for _, c := range h.cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	h.cmds = nil
}

// Idle is what fan did during a window in which nothing failed: every move
// in it is a false failover; the rest says how close it came.
type Idle struct {
	Moves int // failovers, retries, switchovers, failbacks decided in the window
	// PeerDown and SelfDown count transitions to down of peer checks and
	// of the nodes' own checks; Silent counts holds that found the holder
	// silent on the bus (its beacons missed).
	PeerDown, SelfDown, Silent int
	// Gaps counts beacon gaps longer than the silence limit seen from the
	// control host, and MaxGap is the longest gap between two beacons of
	// one node.
	Gaps   int
	MaxGap time.Duration
	// Why holds each move's decision: its action and reason.
	Why []string
}

// IdleFrom reads a window [from, to] of fan's trail and the beacons seen.
func IdleFrom(evs []stack.Event, b *Beacons, from, to time.Time, silence time.Duration) Idle {
	var in []stack.Event
	var r Idle
	for _, e := range evs {
		if e.Env.Time.Before(from) || e.Env.Time.After(to) {
			continue
		}
		in = append(in, e)
		switch v := e.Payload.(type) {
		case *events.HealthTransition:
			if v.To != events.HealthDown {
				continue
			}
			if v.Role == events.RolePeer {
				r.PeerDown++
			} else {
				r.SelfDown++
			}
		case *events.ArbiterDecision:
			if v.Action == events.ActionHold && strings.Contains(v.Reason, "silent") {
				r.Silent++
			}
		}
	}
	r.Moves, _ = CountMoves(in)
	for _, e := range in {
		if d, ok := e.Payload.(*events.ArbiterDecision); ok {
			if n, _ := CountMoves([]stack.Event{e}); n > 0 {
				r.Why = append(r.Why, fmt.Sprintf("%s %s->%s: %s", d.Action, d.From, d.To, d.Reason))
			}
		}
	}
	if b != nil {
		r.Gaps, r.MaxGap = b.gaps(from, to, silence)
	}
	return r
}

// gaps counts, over every node, the intervals between consecutive beacon
// arrivals within [from, to] longer than limit, and returns the longest.
func (b *Beacons) gaps(from, to time.Time, limit time.Duration) (int, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, longest := 0, time.Duration(0)
	for _, a := range b.at {
		for i := 1; i < len(a); i++ {
			if a[i].Before(from) || a[i-1].After(to) {
				continue
			}
			g := a[i].Sub(a[i-1])
			longest = max(longest, g)
			if g > limit {
				n++
			}
		}
	}
	return n, longest
}

// IdleLine renders a fan idle window.
func IdleLine(budget string, d time.Duration, cores int, r Idle) string {
	return fmt.Sprintf("hog system=fan budget=%s duration_s=%.0f hog_cores=%d false_failovers=%d peer_down=%d self_down=%d silent_holds=%d beacon_gaps_over_limit=%d max_beacon_gap_ms=%.0f",
		budget, d.Seconds(), cores, r.Moves, r.PeerDown, r.SelfDown, r.Silent, r.Gaps, math.Round(float64(r.MaxGap.Microseconds())/1000))
}

// MasterEntries counts keepalived's "Entering MASTER STATE" lines in the
// logs given (from byte offsets, so only a window is counted).
func MasterEntries(logs map[string]int64) (int, error) {
	n := 0
	for path, off := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		if off > int64(len(b)) {
			off = 0
		}
		n += bytes.Count(b[off:], []byte("Entering MASTER STATE"))
	}
	return n, nil
}
