package dnsexec

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/durablefile"
	"github.com/fanpbx/fan/services/ipmover/internal/dnsupdate"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// Step names of the primaries' mode, each suffixed with ":<server>".
const (
	StepDNSServerAccepted = events.StepDNSUpdateAccepted // the server took the update
	StepDNSServerServed   = events.StepDNSAlreadyServed  // the server served the site already
)

// DefaultResync is dns.resync's default.
const DefaultResync = time.Second

// One primary per site (dns.primaries). Each site runs an authoritative
// server for the zone and nothing transfers the zone between them, so a
// site that goes dark (its uplink lost) takes only its own server with it:
// a claim updates every server it reaches, each with its own signed
// compare-and-swap, and is applied once every server that answered serves
// the new site. A server that did not answer is left for the keepers: one
// per server reads it every dns.resync and, once it answers serving
// another site than the last claim's, brings it in line at once, before
// anything else is done on that server (the claim's own update of a server
// waits for its keeper and the keeper for the claim). The last claim's site
// is the arbiter's choice; it is persisted beside the state file, so a
// restarted executor keeps the servers in line from its first read.

// target is the last claim this executor carried out: the arbiter's choice.
type target struct {
	Site string `json:"site"`
	// Address is the claim's first address, which corrections name.
	Address   string    `json:"address"`
	Epoch     uint64    `json:"epoch"`
	CommandID string    `json:"command_id"`
	At        time.Time `json:"at"`
}

// targetPath is where the last claim is kept: beside the state file.
func targetPath(stateFile string) string { return stateFile + ".target" }

// primary is one authoritative server and what its keeper last saw.
type primary struct {
	addr string
	// mu orders the writes to this server: its keeper's and claims'.
	mu sync.Mutex

	seenMu    sync.Mutex
	answering *bool  // nil before the first read
	failure   string // the last correction failure reported
}

// primariesExecutor carries out a DNS name's commands on one primary per
// site.
type primariesExecutor struct {
	group    string
	log      *slog.Logger
	fence    *fence.Store
	up       *dnsupdate.Updater
	sites    map[string]dnsupdate.Values
	servers  []*primary
	resync   time.Duration
	tgtPath  string
	post     func(events.AddressCorrection)
	targetMu sync.Mutex
	tgt      target
}

func newPrimariesExecutor(cfg Config, log *slog.Logger) (*primariesExecutor, error) {
	f, err := fence.Open(cfg.StateFile, fence.DefaultKeep)
	if err != nil {
		return nil, fmt.Errorf("ipmover state: %w", err)
	}
	up, err := dnsupdate.New(cfg.DNS.Config, log)
	if err != nil {
		return nil, err
	}
	x := &primariesExecutor{group: cfg.DNS.Group, log: log, fence: f, up: up, sites: cfg.DNS.Sites,
		resync: cmp.Or(cfg.DNS.Resync, DefaultResync), tgtPath: targetPath(cfg.StateFile), post: func(events.AddressCorrection) {}}
	for _, a := range up.Primaries() {
		x.servers = append(x.servers, &primary{addr: a})
	}
	b, err := os.ReadFile(x.tgtPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("dns executor: last claim: %w", err)
	default:
		if err := json.Unmarshal(b, &x.tgt); err != nil {
			return nil, fmt.Errorf("dns executor: last claim %s: %w", x.tgtPath, err)
		}
		if _, ok := x.sites[x.tgt.Site]; !ok && x.tgt.Site != "" {
			// A site removed from the configuration since: nothing to keep.
			log.Warn("dns executor: the last claim's site is no longer configured; waiting for a claim", "site", x.tgt.Site)
			x.tgt = target{}
		}
	}
	return x, nil
}

// runPrimaries is Run for dns.primaries.
func (s *Service) runPrimaries(ctx context.Context) error {
	x, err := newPrimariesExecutor(s.cfg, s.log)
	if err != nil {
		return err
	}
	sites := slices.Sorted(maps.Keys(s.cfg.DNS.Sites))
	return daemon.Serve(ctx, s.cfg.Common, "ipmover", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		contract, err := execute.Open(ctx, rt, execute.Config{Fence: x.fence, Executor: x, Logger: x.log})
		if err != nil {
			return err
		}
		x.post = func(c events.AddressCorrection) {
			if _, err := rt.Outbox.Post("", c); err != nil {
				x.log.Error("cannot post the dns correction", "err", err)
			}
		}
		x.logReady(ctx, sites)
		g, _ := daemon.NewGroup(ctx)
		g.Go("commands", func(ctx context.Context) error { return contract.Consume(ctx, rt.Bus, sites...) })
		for _, p := range x.servers {
			g.Go("keep "+p.addr, func(ctx context.Context) error { x.keep(ctx, p); return nil })
		}
		return g.Wait()
	})
}

func (x *primariesExecutor) logReady(ctx context.Context, sites []string) {
	tg := x.target()
	for _, p := range x.servers {
		rctx, cancel := context.WithTimeout(ctx, x.resync)
		sv, err := x.up.Read(rctx, p.addr)
		cancel()
		if err != nil {
			x.log.Warn("dns executor: a primary does not answer", "server", p.addr, "err", err)
			continue
		}
		x.log.Info("dns executor: primary", "server", p.addr, "serves", sv.Values.String(), "site", sv.Site, "serial", sv.Serial)
	}
	x.log.Info("dns executor ready", "group", x.group, "sites", sites, "primaries", len(x.servers), "resync", x.resync,
		"last_claim_site", tg.Site, "last_claim_epoch", tg.Epoch)
}

func (x *primariesExecutor) target() target {
	x.targetMu.Lock()
	defer x.targetMu.Unlock()
	return x.tgt
}

// setTarget records the arbiter's new choice durably before any server is
// changed for it, so a keeper never reverts a move a crash interrupted.
func (x *primariesExecutor) setTarget(t target) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	x.targetMu.Lock()
	defer x.targetMu.Unlock()
	if err := durablefile.Write(x.tgtPath, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("record the claim's site: %w", err)
	}
	x.tgt = t
	return nil
}

// Admit implements execute.Executor: only this name's group, only its sites.
func (x *primariesExecutor) Admit(cmd events.Command) ([]string, error) {
	return admit(cmd, x.group, x.sites)
}

// Apply implements execute.Executor.
func (x *primariesExecutor) Apply(ctx context.Context, env events.Envelope, cmd events.Command, tl *execute.Timeline) error {
	switch c := cmd.(type) {
	case *events.ClaimIP:
		return x.claim(ctx, env, c, tl)
	case *events.ReleaseIP:
		// As with one primary: the claim on the other site swaps the
		// records; an empty name would be cached as such.
		tl.At(StepDNSReleaseNoop, time.Now())
		return nil
	default:
		return fmt.Errorf("unsupported command %T for the dns executor", cmd)
	}
}

// claim points the name at c.Node's records on every primary it reaches.
func (x *primariesExecutor) claim(ctx context.Context, env events.Envelope, c *events.ClaimIP, tl *execute.Timeline) error {
	if c.Group != x.group {
		return fmt.Errorf("group %s is not moved by this dns executor (it serves %s)", c.Group, x.group)
	}
	to := c.Node
	if err := x.setTarget(target{Site: to, Address: c.Addresses[0], Epoch: env.Epoch, CommandID: env.ID, At: time.Now()}); err != nil {
		return fmt.Errorf("claim %s: %w", to, err)
	}
	moves := make([]dnsupdate.ServerMove, len(x.servers))
	var wg sync.WaitGroup
	for i, p := range x.servers {
		wg.Go(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			moves[i] = x.up.MoveOn(ctx, p.addr, c.PreviousHolder, to)
		})
	}
	wg.Wait()

	type step struct {
		name string
		at   time.Time
	}
	var steps []step
	var states []events.DNSServerState
	var inLine, unreachable, refused []string
	for _, mv := range moves {
		states = append(states, serverState(mv))
		switch mv.Outcome {
		case dnsupdate.MoveUpdated:
			inLine = append(inLine, mv.Server)
			steps = append(steps, step{events.StepOn(StepDNSServerAccepted, mv.Server), mv.Sent.Add(mv.Accepted)},
				step{events.StepOn(StepDNSVerified, mv.Server), mv.Sent.Add(mv.Verified)})
		case dnsupdate.MoveAlready:
			inLine = append(inLine, mv.Server)
			steps = append(steps, step{events.StepOn(StepDNSServerServed, mv.Server), time.Now()})
		case dnsupdate.MoveUnreachable:
			unreachable = append(unreachable, fmt.Sprintf("%s (%v)", mv.Server, mv.Err))
		default:
			refused = append(refused, mv.Err.Error())
		}
		x.log.Info("dns claim on a primary", "site", to, "server", mv.Server, "outcome", mv.Outcome.String(),
			"from_site", mv.Before.Site, "serial", mv.After.Serial, "err", mv.Err)
	}
	slices.SortStableFunc(steps, func(a, b step) int { return a.at.Compare(b.at) })
	for _, s := range steps {
		tl.At(s.name, s.at)
	}
	tl.SetDNS(states)
	switch {
	case len(refused) > 0:
		return fmt.Errorf("claim %s: %d of %d primaries not in line: %s", to, len(refused)+len(unreachable), len(moves),
			strings.Join(append(refused, unreachable...), "; "))
	case len(inLine) == 0:
		return fmt.Errorf("claim %s: no primary answered: %s", to, strings.Join(unreachable, "; "))
	case len(unreachable) > 0:
		x.log.Warn("dns claim applied without the primaries that did not answer; they are brought in line when they answer",
			"site", to, "unreachable", unreachable)
	}
	return nil
}

// keep looks at one primary every resync, and every half resync while it
// does not answer (each look dialling within that half, so that a look
// whose first packet was lost in the dark never holds the next one up),
// and brings it in line with the last claim whenever it serves anything
// else: a server whose site comes back is corrected within half a resync
// of answering, plus the round trips of the read and the update.
func (x *primariesExecutor) keep(ctx context.Context, p *primary) {
	for {
		start := time.Now()
		wait := x.resync
		if !x.check(ctx, p) {
			wait = x.resync/2 - time.Since(start)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// check aligns one primary and reports whether it answered.
func (x *primariesExecutor) check(ctx context.Context, p *primary) bool {
	tg := x.target()
	if tg.Site == "" {
		return true // no claim yet: nothing is known of the arbiter's choice
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	tg = x.target() // a claim may have moved the name while this waited
	mv := x.up.Align(ctx, p.addr, tg.Site, x.resync/2)
	if ctx.Err() != nil {
		return true
	}
	st := serverState(mv)
	switch mv.Outcome {
	case dnsupdate.MoveUpdated:
		x.noteAnswering(p, nil)
		p.seenMu.Lock()
		p.failure = ""
		p.seenMu.Unlock()
		reason := fmt.Sprintf("%s served %s at serial %d, not the last claim's %s: brought in line", p.addr,
			orNoSite(mv.Before.Site, mv.Before.Values), mv.Before.Serial, tg.Site)
		x.log.Info("dns primary brought in line", "server", p.addr, "from_site", mv.Before.Site, "site", tg.Site,
			"serial", mv.After.Serial, "claim_epoch", tg.Epoch)
		x.post(events.AddressCorrection{Group: x.group, Node: tg.Site, Address: tg.Address, Kind: events.CorrectionDNSRealigned,
			Reason: reason, At: time.Now(), DNS: []events.DNSServerState{st}})
	case dnsupdate.MoveAlready:
		x.noteAnswering(p, nil)
		p.seenMu.Lock()
		p.failure = ""
		p.seenMu.Unlock()
	case dnsupdate.MoveRefused:
		x.noteAnswering(p, nil)
		p.seenMu.Lock()
		report := p.failure != mv.Err.Error()
		p.failure = mv.Err.Error()
		p.seenMu.Unlock()
		if report {
			// Once per new failure: a server someone else wrote on is
			// looked at every period, and would fill the trail.
			x.log.Warn("dns primary out of line and not corrected", "server", p.addr, "site", tg.Site, "err", mv.Err)
			x.post(events.AddressCorrection{Group: x.group, Node: tg.Site, Address: tg.Address, Kind: events.CorrectionFailed,
				Reason: "a primary serves another site than the last claim's", Error: truncate(mv.Err.Error()), At: time.Now(),
				DNS: []events.DNSServerState{st}})
		}
	case dnsupdate.MoveUnreachable:
		x.noteAnswering(p, mv.Err)
		return false
	}
	return true
}

// noteAnswering logs a primary going silent or answering again, once each.
func (x *primariesExecutor) noteAnswering(p *primary, err error) {
	up := err == nil || dnsupdate.Reachable(err)
	p.seenMu.Lock()
	changed := p.answering == nil || *p.answering != up
	p.answering = &up
	p.seenMu.Unlock()
	switch {
	case !changed:
	case up:
		x.log.Info("dns primary answers", "server", p.addr)
	default:
		x.log.Warn("dns primary does not answer; it is brought in line when it does", "server", p.addr, "err", err)
	}
}

// serverState is one server's part of a result or a correction.
func serverState(mv dnsupdate.ServerMove) events.DNSServerState {
	st := events.DNSServerState{Server: mv.Server}
	switch mv.Outcome {
	case dnsupdate.MoveUpdated:
		st.Outcome = events.DNSUpdated
	case dnsupdate.MoveAlready:
		st.Outcome = events.DNSAlreadyServed
	case dnsupdate.MoveUnreachable:
		st.Outcome = events.DNSUnreachable
	default:
		st.Outcome = events.DNSRefused
	}
	if mv.After.Known {
		st.Site, st.Records, st.Serial = mv.After.Site, mv.After.Values.String(), mv.After.Serial
	}
	if mv.Err != nil {
		st.Error = truncate(mv.Err.Error())
	}
	return st
}

func orNoSite(site string, v dnsupdate.Values) string {
	if site == "" {
		return v.String() + " (no configured site)"
	}
	return site + " " + v.String()
}

// truncate keeps an error within what an event carries.
func truncate(s string) string {
	const max = 1024
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
