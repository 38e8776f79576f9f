package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/phone"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/platform/poll"
)

// Calls is the scenario of calls in progress when the holder's PBX dies
// (kill -9 of its process): phones of lab/phone on the lab's phone hosts
// (callers on pa, callees on pb) register through the floating address,
// Direct calls with direct media and Anchored ones with the audio through
// the PBX (direct_media = no) are set up, the holder's PBX is killed, and
// once another node holds the address the calls are kept up for Hold. Then
// every direct call's caller hangs up, and what the callee heard of it
// is timed. Per cycle it counts what a phone's user would: the calls up,
// those still up with their audio flowing after Hold, the longest silence
// of any direction of a direct call from a second before the kill, the
// time from a caller's BYE to the callee's BYE (in its dialog), and the
// legs still up 2 s after the hang-ups (a phone in a call, a channel on
// the new holder's PBX). Anchored calls lose their audio with the PBX;
// their phones hang up after 3 s of silence, as their users would.
const Calls Scenario = "calls"

// CallsConfig sizes the calls scenario.
type CallsConfig struct {
	Direct, Anchored int
	// Hold is how long the calls stay up after the failover (default 10 s).
	Hold time.Duration
	// Settle is how long the calls are up before the kill (default 2 s):
	// fan records a call within about a second of its answer.
	Settle time.Duration
}

// maxCallPairs: the lab's dialplan rings 60XX, two endpoints a call.
const maxCallPairs = 50

// CallEndpoints are the endpoints of the scenario: call i is 60(2i)
// calling 60(2i+1), the anchored calls after the direct ones.
func CallEndpoints(direct, anchored int) ([]stack.Endpoint, error) {
	if direct < 0 || anchored < 0 || direct+anchored == 0 || direct+anchored > maxCallPairs {
		return nil, fmt.Errorf("calls: %d direct and %d anchored calls: between 1 and %d in all", direct, anchored, maxCallPairs)
	}
	var eps []stack.Endpoint
	for i := range direct + anchored {
		for _, u := range []int{2 * i, 2*i + 1} {
			user := fmt.Sprintf("60%02d", u)
			eps = append(eps, stack.Endpoint{User: user, Password: "pw-" + user, Anchored: i >= direct})
		}
	}
	return eps, nil
}

// CallPair is one call of the scenario.
type CallPair struct {
	Caller, Callee *phone.Phone
	Anchored       bool
}

// anchoredSilence is how long an anchored call's phones wait in silence
// before hanging up.
const anchoredSilence = 3 * time.Second

// CallPhones starts the phones of eps (CallEndpoints) on l's phone hosts.
func CallPhones(l *netlab.Lab, eps []stack.Endpoint) ([]CallPair, error) {
	var pairs []CallPair
	closeAll := func() {
		for _, p := range pairs {
			p.Caller.Close()
			p.Callee.Close()
		}
	}
	hosts := netlab.PhoneHosts()
	for i := 0; i+1 < len(eps); i += 2 {
		port := uint16(5100 + i/2)
		anchored := eps[i].Anchored
		tune := func(answer bool) func(*phone.Config) {
			return func(c *phone.Config) {
				c.AutoAnswer, c.AnswerAfter = answer, 50*time.Millisecond
				if anchored {
					c.MediaTimeout = anchoredSilence
				}
			}
		}
		caller, err := stack.NewPhone(l, hosts[0].Name, eps[i], port, tune(false))
		if err != nil {
			closeAll()
			return nil, err
		}
		callee, err := stack.NewPhone(l, hosts[1].Name, eps[i+1], port, tune(true))
		if err != nil {
			caller.Close()
			closeAll()
			return nil, err
		}
		pairs = append(pairs, CallPair{Caller: caller, Callee: callee, Anchored: anchored})
	}
	return pairs, nil
}

// ClosePhones closes every phone of pairs.
func ClosePhones(pairs []CallPair) {
	for _, p := range pairs {
		p.Caller.Close()
		p.Callee.Close()
	}
}

// CallsCycle is one measured kill of the holder's PBX with calls up.
type CallsCycle struct {
	From, To string
	// Failover is the kill to the address on another node alone.
	Failover time.Duration
	// Up counts the calls up before the kill (direct ones with their media
	// direct), DirectUp the direct ones among them.
	Up, DirectUp int
	// Survived counts the direct calls up on both phones after Hold, each
	// phone hearing the other in the last second.
	Survived int
	// LongestGap is the longest silence of any direction of a direct call
	// that was up, from a second before the kill to the end of Hold;
	// SendStall the longest the phones themselves paused in sending (the
	// machine's scheduling: a gap no longer than it is the phones').
	LongestGap, SendStall time.Duration
	// Hangups are the times from a caller's BYE to its callee's BYE, for
	// the direct calls whose callee was told within hangupWait;
	// NotTold counts those whose callee was not.
	Hangups []time.Duration
	NotTold int
	// Orphaned counts the legs still up 2 s after the hang-ups: phones in
	// a call and channels on the new holder's PBX.
	Orphaned int
	// AnchoredLost counts the anchored calls that lost their audio.
	AnchoredLost int
}

// hangupWait is how long a callee is given to hear of its caller's hang-up.
const hangupWait = 5 * time.Second

// RunCalls measures cycles kills of the holder's PBX with calls up on
// sys. Each cycle registers the phones again (with the holder of the
// moment), sets the calls up, kills, measures, hangs up, restores the
// killed node and waits until it is a ready standby.
func RunCalls(ctx context.Context, sys System, l *netlab.Lab, pairs []CallPair, cfg CallsConfig, cycles int, progress func(CallsCycle)) ([]CallsCycle, error) {
	if cfg.Hold <= 0 {
		cfg.Hold = 10 * time.Second
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 2 * time.Second
	}
	var out []CallsCycle
	for i := range cycles {
		cy, err := callsCycle(ctx, sys, l, pairs, cfg)
		if err != nil {
			return out, fmt.Errorf("%s calls cycle %d: %w", sys.Name(), i, err)
		}
		out = append(out, cy)
		if progress != nil {
			progress(cy)
		}
		if err := sys.Restore(ctx, Calls, cy.From); err != nil {
			return out, fmt.Errorf("%s calls cycle %d: restore: %w", sys.Name(), i, err)
		}
		if err := waitReady(ctx, sys, cy.From, 90*time.Second); err != nil {
			return out, fmt.Errorf("%s calls cycle %d: after restore: %w", sys.Name(), i, err)
		}
	}
	return out, nil
}

// soleHolder waits until exactly one node other than not holds the
// floating address and returns it.
func soleHolder(ctx context.Context, l *netlab.Lab, not string, within time.Duration) (string, error) {
	var h []string
	err := poll.Every(ctx, 100*time.Millisecond, within, fmt.Sprintf("a sole holder other than %q", not), func() error {
		var err error
		if h, err = AddressHolders(ctx, l); err != nil {
			return err
		}
		if len(h) != 1 || h[0] == not {
			return fmt.Errorf("holders %v", h)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return h[0], nil
}

// each runs fn on every pair at once and returns the first error.
func each(pairs []CallPair, fn func(CallPair) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, p := range pairs {
		wg.Go(func() {
			if err := fn(p); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func callsCycle(ctx context.Context, sys System, l *netlab.Lab, pairs []CallPair, cfg CallsConfig) (CallsCycle, error) {
	var cy CallsCycle
	holder, err := soleHolder(ctx, l, "", 60*time.Second)
	if err != nil {
		return cy, err
	}
	cy.From = holder
	if err := each(pairs, func(p CallPair) error {
		return errors.Join(stack.RegisterPhone(ctx, p.Caller, 30*time.Second), stack.RegisterPhone(ctx, p.Callee, 30*time.Second))
	}); err != nil {
		return cy, err
	}
	up := make([]bool, len(pairs))
	_ = each(pairs, func(p CallPair) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := p.Caller.Call(cctx, p.Callee.User()); err != nil {
			return err
		}
		sendsTo := func(other *phone.Phone) func(phone.Status) bool {
			return func(s phone.Status) bool { return s.Up() && (p.Anchored || s.Media == other.RTPAddr()) }
		}
		if _, err := p.Callee.Wait(cctx, sendsTo(p.Caller)); err != nil {
			return err
		}
		_, err := p.Caller.Wait(cctx, sendsTo(p.Callee))
		return err
	})
	for i, p := range pairs {
		up[i] = p.Caller.Status().Up() && p.Callee.Status().Up() && (p.Anchored || p.Caller.Status().Media == p.Callee.RTPAddr())
		if up[i] {
			cy.Up++
			if !p.Anchored {
				cy.DirectUp++
			}
		}
	}
	select {
	case <-ctx.Done():
		return cy, ctx.Err()
	case <-time.After(cfg.Settle):
	}

	kill := time.Now()
	if err := sys.Fault(ctx, Calls, holder); err != nil {
		return cy, fmt.Errorf("fault: %w", err)
	}
	to, err := soleHolder(ctx, l, holder, 60*time.Second)
	if err != nil {
		return cy, err
	}
	cy.To, cy.Failover = to, time.Since(kill)
	select {
	case <-ctx.Done():
		return cy, ctx.Err()
	case <-time.After(time.Until(kill.Add(cfg.Hold))):
	}
	end := time.Now()
	for i, p := range pairs {
		if !up[i] {
			continue
		}
		if p.Anchored {
			if g := max(p.Caller.Gap(kill, end).Longest, p.Callee.Gap(kill, end).Longest); g > time.Second {
				cy.AnchoredLost++
			}
			continue
		}
		heard := true
		for _, ph := range []*phone.Phone{p.Caller, p.Callee} {
			cy.LongestGap = max(cy.LongestGap, ph.Gap(kill.Add(-time.Second), end).Longest)
			cy.SendStall = max(cy.SendStall, ph.RTP().SendStall)
			heard = heard && ph.Status().Up() && ph.Gap(end.Add(-time.Second), end).Longest < time.Second
		}
		if heard {
			cy.Survived++
		}
	}

	// Every direct call's caller hangs up; the anchored ones are over.
	var mu sync.Mutex
	_ = each(pairs, func(p CallPair) error {
		if p.Anchored || !p.Caller.Status().Up() {
			return nil
		}
		hangup := time.Now()
		hctx, cancel := context.WithTimeout(ctx, hangupWait)
		defer cancel()
		_ = p.Caller.Hangup(hctx) // answered 481 by the new holder, or not at all
		_, err := p.Callee.Wait(hctx, func(s phone.Status) bool { return !s.Up() })
		told := time.Duration(-1)
		if err == nil {
			for _, ev := range p.Callee.Events() {
				if ev.Dir == "in" && ev.What == "BYE" && ev.InDialog && !ev.At.Before(hangup) {
					told = ev.At.Sub(hangup)
					break
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if told < 0 {
			cy.NotTold++
		} else {
			cy.Hangups = append(cy.Hangups, told)
		}
		return nil
	})
	select {
	case <-ctx.Done():
		return cy, ctx.Err()
	case <-time.After(2 * time.Second):
	}
	for _, p := range pairs {
		for _, ph := range []*phone.Phone{p.Caller, p.Callee} {
			if ph.Status().Up() {
				cy.Orphaned++
			}
		}
	}
	if ch, _, err := stack.PBXChannels(ctx, l, to); err == nil {
		cy.Orphaned += ch
	}
	// What is left is ended from the phones' side before the next cycle.
	_ = each(pairs, func(p CallPair) error {
		hctx, cancel := context.WithTimeout(ctx, hangupWait)
		defer cancel()
		for _, ph := range []*phone.Phone{p.Caller, p.Callee} {
			if ph.Status().State != phone.StateEnded && ph.Status().State != phone.StateIdle {
				_ = ph.Hangup(hctx)
			}
		}
		return nil
	})
	return cy, nil
}

// CallsLine renders a system's cycles of the calls scenario: totals over
// the cycles, the longest gap and the worst p99 over every hang-up (a
// callee never told makes it +Inf).
func CallsLine(system string, pbx stack.PBX, cfg CallsConfig, cs []CallsCycle) string {
	var up, directUp, survived, orphaned, lost, notTold int
	var gap, stall time.Duration
	var hang, fo []time.Duration
	for _, c := range cs {
		up += c.Up
		directUp += c.DirectUp
		survived += c.Survived
		orphaned += c.Orphaned
		lost += c.AnchoredLost
		notTold += c.NotTold
		gap = max(gap, c.LongestGap)
		stall = max(stall, c.SendStall)
		hang = append(hang, c.Hangups...)
		fo = append(fo, c.Failover)
	}
	p99 := durPercentile(hang, notTold, 99)
	kind := string(pbx)
	if kind == "" {
		kind = "kamailio"
	}
	return fmt.Sprintf("calls system=%s pbx=%s cycles=%d direct=%d anchored=%d hold_s=%.0f calls_up=%d/%d calls_survived=%d/%d "+
		"longest_audio_gap_ms=%.0f phones_send_stall_ms=%.0f hangups_propagated=%d/%d hangups_propagated_p99_ms=%s orphaned_legs=%d anchored_lost=%d failover_p50_ms=%s",
		system, kind, len(cs), cfg.Direct, cfg.Anchored, cfg.Hold.Seconds(), up, len(cs)*(cfg.Direct+cfg.Anchored), survived, directUp,
		ms(gap), ms(stall), len(hang), len(hang)+notTold, fmtMS(p99), orphaned, lost, fmtMS(durPercentile(fo, 0, 50)))
}

// durPercentile is the nearest-rank percentile of ds and missing values
// that count as infinite; NaN with none.
func durPercentile(ds []time.Duration, missing int, p float64) float64 {
	n := len(ds) + missing
	if n == 0 {
		return math.NaN()
	}
	rank := min(max(int(math.Ceil(p/100*float64(n))), 1), n)
	if rank > len(ds) {
		return math.Inf(1)
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return ms(s[rank-1])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func fmtMS(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "inf"
	}
	return fmt.Sprintf("%.0f", v)
}

// CallsCycleLine is one cycle, for -v.
func CallsCycleLine(system string, c CallsCycle) string {
	var hs []string
	for _, h := range c.Hangups {
		hs = append(hs, fmt.Sprintf("%.0f", ms(h)))
	}
	return fmt.Sprintf("%s calls %s->%s failover=%v up=%d survived=%d/%d gap_ms=%.0f stall_ms=%.0f hangups_ms=[%s] not_told=%d orphaned=%d anchored_lost=%d",
		system, c.From, c.To, c.Failover.Round(time.Millisecond), c.Up, c.Survived, c.DirectUp, ms(c.LongestGap), ms(c.SendStall),
		strings.Join(hs, " "), c.NotTold, c.Orphaned, c.AnchoredLost)
}
