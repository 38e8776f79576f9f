package ipexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/sipoptions"
	"github.com/fanpbx/fan/services/ipmover/internal/answer"
	"github.com/fanpbx/fan/services/ipmover/internal/conflict"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/reconcile"
)

// Step names of a claim, in order (named in events). They are the result
// event's step names and the metric's step label.
const (
	StepReceived      = events.StepReceived
	StepReleased      = events.StepReleasesConfirmed   // every release the claim names was answered
	StepNotReleased   = events.StepReleasesUnconfirmed // claim.release_wait passed first
	StepProbed        = events.StepProbed
	StepAddressAdded  = events.StepAddressAdded
	StepAnnounced     = events.StepAnnounced
	StepGateway       = events.StepGatewayApplied
	StepPBXAnswering  = events.StepPBXAnswering
	StepPBXVerified   = events.StepPBXVerified
	StepAddressRemove = events.StepAddressRemoved
)

// ErrHeldElsewhere refuses a claim whose address another MAC answers for
// while the previous holder is not known to be fenced.
var ErrHeldElsewhere = errors.New("address answered by another host")

// Admit implements execute.Executor: a command is carried out only for
// this node and for a group and addresses its configuration allows.
func (s *Service) Admit(cmd events.Command) ([]string, error) {
	group, node := cmd.Target()
	if node != s.cfg.Node {
		return nil, fmt.Errorf("command for node %s reached the executor of %s: %w", node, s.cfg.Node, execute.ErrNotAllowed)
	}
	switch c := cmd.(type) {
	case *events.ClaimIP:
		if err := s.allow.Check(group, c.Addresses); err != nil {
			return nil, err
		}
		// A claim's addresses are recorded with it, so a release without
		// the bus (ExecStopPost after a crash) knows them.
		return c.Addresses, nil
	case *events.ReleaseIP:
		return nil, s.allow.Check(group, c.Addresses)
	case *events.AnswerPBX:
		return nil, s.allow.Check(group, nil)
	}
	return nil, fmt.Errorf("unsupported command %T: %w", cmd, execute.ErrNotAllowed)
}

func parsePrefixes(addrs []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", a, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Apply implements execute.Executor.
func (s *Service) Apply(ctx context.Context, env events.Envelope, cmd events.Command, tl *execute.Timeline) error {
	switch c := cmd.(type) {
	case *events.ClaimIP:
		return s.claim(ctx, env, c, tl)
	case *events.ReleaseIP:
		prefixes, err := parsePrefixes(c.Addresses)
		if err != nil {
			return err
		}
		if _, others := s.claimedOnly(prefixes); len(others) > 0 {
			s.log.Warn("release names addresses this node never claimed; leaving them", "group", c.Group, "addresses", others)
			s.m.refused.WithLabelValues(refusedUnclaimed).Add(float64(len(others)))
		}
		if err := s.release(ctx, c.Group, prefixes); err != nil {
			return fmt.Errorf("release %v: %w", c.Addresses, err)
		}
		tl.At(StepAddressRemove, time.Now())
	case *events.AnswerPBX:
		modules := c.Modules
		if len(modules) == 0 {
			modules = s.cfg.Answer.Modules
		}
		return s.answer(ctx, c.Group, c.Mode, modules, tl, nil)
	default:
		return fmt.Errorf("unsupported command %T", cmd)
	}
	return nil
}

// claim is the failover critical path: probe only if the previous holder
// is not fenced, add the address and send the first announcement in one
// reconcile pass, then make the PBX answer and prove it. Nothing after the
// first announcement delays it.
func (s *Service) claim(ctx context.Context, env events.Envelope, c *events.ClaimIP, tl *execute.Timeline) error {
	prefixes, err := parsePrefixes(c.Addresses)
	if err != nil {
		return err
	}
	if len(c.AfterReleases) > 0 && s.cfg.Claim.ReleaseWait.D() > 0 {
		if s.awaitReleases(ctx, env, c.AfterReleases) {
			tl.At(StepReleased, time.Now())
		} else {
			// Its executor may be dead with the address still configured; the
			// conflict watch on that node yields once it runs again.
			tl.At(StepNotReleased, time.Now())
			s.log.Warn("releases not answered in time; claiming as the arbiter decided", "group", c.Group,
				"releases", c.AfterReleases, "waited", s.cfg.Claim.ReleaseWait.D())
		}
	}
	if wait := s.cfg.Claim.ProbeWait.D(); wait > 0 && !c.PreviousHolderFenced {
		ip, mac, err := s.probe(ctx, prefixes, wait)
		tl.At(StepProbed, time.Now())
		if err != nil {
			return fmt.Errorf("claim: ARP probe: %w", err)
		}
		if mac != nil {
			prev := c.PreviousHolder
			if prev == "" {
				prev = "none named"
			}
			s.reportConflict(events.AddressConflict{
				Group: c.Group, Node: s.cfg.Node, Address: ip.String(), OwnMAC: s.link.HardwareAddr().String(), OtherMAC: mac.String(),
				Action: events.ConflictRefused, Epoch: env.Epoch, DetectedAt: time.Now(),
				Reason: fmt.Sprintf("ARP probe answered by %s; previous holder (%s) not fenced", mac, prev),
			})
			return fmt.Errorf("claim refused: %s %w (%s) and the previous holder is not fenced", ip, ErrHeldElsewhere, mac)
		}
	}

	s.act.Lock()
	s.setClaim(c.Group, prefixes, conflict.Claim{Group: c.Group, Epoch: env.Epoch, CommandID: env.ID})
	err = s.loop.SetDesiredFor(c.Group, c.Addresses, true)
	var changes []reconcile.Change
	if err == nil {
		changes, err = s.loop.Apply(ctx)
	}
	s.act.Unlock()
	added, announced := time.Time{}, time.Time{}
	for _, ch := range changes {
		if !slices.Contains(prefixes, ch.Prefix) {
			continue
		}
		if (ch.Kind == reconcile.Added || ch.Kind == reconcile.Readded) && (added.IsZero() || ch.At.Before(added)) {
			added = ch.At
		}
		if !ch.AnnouncedAt.IsZero() && (announced.IsZero() || ch.AnnouncedAt.Before(announced)) {
			announced = ch.AnnouncedAt
		}
	}
	if added.IsZero() && err == nil {
		added = time.Now() // already present: ensured, not added
	}
	if !added.IsZero() {
		tl.At(StepAddressAdded, added)
	}
	if !announced.IsZero() {
		tl.At(StepAnnounced, announced)
	}
	if err != nil {
		// Still desired: the loop keeps trying, and the arbiter, seeing the
		// failure, releases this node and tries the next.
		return fmt.Errorf("claim %v: %w", c.Addresses, err)
	}
	if s.gw.Configured() && !s.gw.Applied() {
		if err := s.gw.Apply(); err != nil {
			return fmt.Errorf("claim: gateway role: %w", err)
		}
		tl.At(StepGateway, time.Now())
	}
	// The group's call records are read while the claim proves the PBX
	// answers. Not sooner: on a node of two cores the read's work (the
	// bus's too, when its server runs there) takes the CPU from the
	// address, the first announcement and the PBX's reload (the first
	// announcement left 1.7 ms after receipt without it, 2.9 to 6 ms with
	// it started at receipt, 100 records, in the namespace tests).
	var calls *callsRead
	defer func() {
		if calls != nil { // not handed to the adoption: the claim failed
			calls.cancel()
		}
	}()
	answered := func() {
		if s.keeper != nil {
			calls = s.readCalls(c.Group)
		}
	}
	if err := s.answer(ctx, c.Group, s.cfg.Answer.Mode, s.cfg.Answer.Modules, tl, answered); err != nil {
		return err
	}
	if calls != nil {
		s.adoptAtClaim(env, c.Group, calls, tl)
		calls = nil
	}
	return nil
}

// answer makes the PBX answer, then proves it with SIP OPTIONS to the
// group's first address (IPv4 preferred) from this node. answered, when
// set, runs once the PBX answers, before the proof.
func (s *Service) answer(ctx context.Context, group string, mode events.AnswerMode, modules []string, tl *execute.Timeline, answered func()) error {
	actx, cancel := context.WithTimeout(ctx, s.cfg.Answer.Timeout.D())
	err := s.answerer.Answer(actx, mode, modules)
	cancel()
	if err != nil {
		return err
	}
	tl.At(StepPBXAnswering, time.Now())
	if answered != nil {
		answered()
	}
	if !s.cfg.Verify.On() {
		return nil
	}
	target, ok := s.verifyTarget(group)
	if !ok {
		return fmt.Errorf("verify: group %s is not held here", group)
	}
	var p *sipoptions.Pinger
	if err := s.inNS(func() error {
		var err error
		p, err = sipoptions.NewPinger(target.String())
		return err
	}); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer p.Close()
	vctx, cancel := context.WithTimeout(ctx, s.cfg.Verify.Timeout.D())
	defer cancel()
	r, n, err := answer.Verify(vctx, p, s.cfg.Verify.Every.D())
	if err != nil {
		return fmt.Errorf("verify SIP on %s: %w", target, err)
	}
	tl.At(StepPBXVerified, time.Now())
	s.log.Info("PBX answers on the floating address", "target", target.String(), "status", r.Status, "attempts", n, "rtt", r.RTT)
	return nil
}

func (s *Service) verifyTarget(group string) (netip.AddrPort, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.claims[group]; !ok {
		return netip.AddrPort{}, false
	}
	ps := s.groups[group]
	for _, p := range ps {
		if p.Addr().Is4() {
			return netip.AddrPortFrom(p.Addr(), uint16(s.cfg.Verify.Port)), true
		}
	}
	if len(ps) == 0 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ps[0].Addr(), uint16(s.cfg.Verify.Port)), true
}

// probe asks, for every IPv4 address at once, whether another host answers
// for it. IPv6 addresses are not probed (see README).
func (s *Service) probe(ctx context.Context, prefixes []netip.Prefix, wait time.Duration) (netip.Addr, net.HardwareAddr, error) {
	type found struct {
		ip  netip.Addr
		mac net.HardwareAddr
		err error
	}
	var (
		wg  sync.WaitGroup
		out = make(chan found, len(prefixes))
	)
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			continue
		}
		wg.Go(func() {
			mac, ok, err := s.link.Probe(ctx, p.Addr(), wait)
			if err != nil || ok {
				out <- found{p.Addr(), mac, err}
			}
		})
	}
	wg.Wait()
	close(out)
	for f := range out {
		return f.ip, f.mac, f.err
	}
	return netip.Addr{}, nil, nil
}

// release stops holding group. Caller must not hold act.
func (s *Service) release(ctx context.Context, group string, prefixes []netip.Prefix) error {
	s.act.Lock()
	defer s.act.Unlock()
	s.mu.Lock()
	if len(prefixes) == 0 {
		prefixes = s.groups[group]
	} else {
		s.groups[group] = prefixes
	}
	s.mu.Unlock()
	prefixes, _ = s.claimedOnly(prefixes)
	strs := make([]string, len(prefixes))
	for i, p := range prefixes {
		strs[i] = p.String()
	}
	if err := s.loop.SetDesired(group, strs, false); err != nil {
		return err
	}
	_, err := s.loop.Apply(ctx)
	if s.keeper != nil && s.keeper.Release(group) > 0 {
		// The phones' requests go to the next holder now; the records
		// stay for it, until it has written its own.
		s.noteLeft(group)
	}
	if s.dropClaim(group) {
		if gerr := s.gw.Undo(); gerr != nil {
			err = errors.Join(err, fmt.Errorf("gateway role: %w", gerr))
		}
	}
	return err
}

// claimedOnly keeps the addresses this node ever claimed (the state file's
// record) and returns the others apart: a release, whoever asks for it,
// never removes an address that someone else configured on the interface,
// such as the node's own.
func (s *Service) claimedOnly(prefixes []netip.Prefix) (claimed, others []netip.Prefix) {
	managed := s.fence.Snapshot().Managed
	for _, p := range prefixes {
		if slices.Contains(managed, p.String()) {
			claimed = append(claimed, p)
		} else {
			others = append(others, p)
		}
	}
	return claimed, others
}

func (s *Service) setClaim(group string, prefixes []netip.Prefix, c conflict.Claim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[group] = prefixes
	s.claims[group] = c
	s.m.holder.WithLabelValues(group).Set(1)
}

// dropClaim forgets group's claim and reports whether none is left.
func (s *Service) dropClaim(group string) (none bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.claims, group)
	s.m.holder.WithLabelValues(group).Set(0)
	return len(s.claims) == 0
}

// Holding implements conflict.Holdings.
func (s *Service) Holding(ip netip.Addr) (conflict.Claim, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for g, c := range s.claims {
		for _, p := range s.groups[g] {
			if p.Addr() == ip {
				return c, true
			}
		}
	}
	return conflict.Claim{}, false
}

// Yield implements conflict.Holdings. A yield on a claim that could not be
// confirmed may give up an address the arbiter still names this node the
// holder of: its state was unreadable for a moment, as while a server
// rejoins the cluster. The arbiter, seeing its holder healthy, sends
// nothing, so nothing else would take the address back (a colocated chaos
// run left the phones without it for two minutes). A re-sync does once the
// state reads again, and leaves the group released if the arbiter names
// another holder.
func (s *Service) Yield(ctx context.Context, group string) error {
	err := s.release(ctx, group, nil)
	why := "address conflict: yielded " + group
	s.resyncLater(why, why+"; re-syncing to take it back if the arbiter still names this node holder")
	return err
}

// Reassert implements conflict.Holdings.
func (s *Service) Reassert(ctx context.Context, group string) error {
	s.act.Lock()
	defer s.act.Unlock()
	s.loop.Reannounce(group)
	_, err := s.loop.Apply(ctx)
	return err
}

// onChange reports what the reconcile loop did on its own (Cause Drift).
// Changes that carry out desired state someone set (a command, a policy,
// a re-sync) are that order's own work, reported by it, not corrections.
func (s *Service) onChange(c reconcile.Change) {
	var kind events.CorrectionKind
	switch {
	case c.Kind == reconcile.Readded:
		kind = events.CorrectionReadded
		// Routes through a vanished source address went with it.
		if s.gw.Applied() {
			if err := s.gw.Apply(); err != nil {
				s.log.Warn("gateway role after re-add", "err", err)
			}
		}
	case c.Cause != reconcile.Drift:
		return
	case c.Kind == reconcile.Removed:
		kind = events.CorrectionRemoved
	case c.Kind == reconcile.Failed:
		kind = events.CorrectionFailed
	default:
		return
	}
	ev := events.AddressCorrection{Group: c.Group, Node: s.cfg.Node, Address: c.Prefix.String(), Kind: kind, At: c.At}
	if c.Group == "" {
		ev.Group = "unknown"
	}
	if c.Err != nil {
		ev.Error = c.Err.Error()
	}
	switch kind {
	case events.CorrectionReadded:
		ev.Reason = "held address vanished from " + s.cfg.Interface
	case events.CorrectionRemoved:
		ev.Reason = "address present without the right to hold it"
	}
	s.m.corrections.WithLabelValues(string(kind)).Inc()
	s.emitAsync(ev)
}

func (s *Service) reportConflict(ev events.AddressConflict) {
	s.m.conflicts.WithLabelValues(string(ev.Action)).Inc()
	s.emitAsync(ev)
}

// emitAsync publishes off the caller's path (the reconcile pass, the ARP
// reader). Without a bus it only logs.
func (s *Service) emitAsync(p events.Payload, opts ...events.Option) {
	if s.pub == nil {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := s.pub.Emit(ctx, p, opts...); err != nil {
			s.log.Warn("publish failed", "type", p.EventType(), "err", err)
		}
	}()
}

// releaseForBusLoss is the release policy's action: every held group is
// given up before the arbiter can have told another node to take it. The
// corrections are queued and published when the bus is back.
func (s *Service) releaseForBusLoss(lostFor time.Duration) {
	s.mu.Lock()
	held := make([]string, 0, len(s.claims))
	for g := range s.claims {
		held = append(held, g)
	}
	s.mu.Unlock()
	for _, g := range held {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := s.release(ctx, g, nil)
		cancel()
		s.mu.Lock()
		for _, p := range s.groups[g] {
			ev := events.AddressCorrection{Group: g, Node: s.cfg.Node, Address: p.String(), Kind: events.CorrectionReleased,
				Reason: "bus unreachable for " + lostFor.Round(time.Millisecond).String() + " (policy release)", At: time.Now()}
			if err != nil {
				ev.Kind, ev.Error = events.CorrectionFailed, err.Error()
			}
			s.queued = append(s.queued, ev)
		}
		s.mu.Unlock()
		s.m.corrections.WithLabelValues(string(events.CorrectionReleased)).Inc()
	}
}

// regained publishes what happened while cut off and re-reads desired
// state: the arbiter may have moved the address meanwhile (then a still
// held address must go) or kept it here (then a released one comes back).
func (s *Service) regained(ctx context.Context) {
	s.mu.Lock()
	q := s.queued
	s.queued = nil
	s.mu.Unlock()
	for _, ev := range q {
		s.emitAsync(ev)
	}
	s.resyncOrRetry(ctx, "bus regained")
}

// resync aligns what is held with the arbiter's state. A group held here
// is kept only if its claim is still confirmed; a group the arbiter names
// this node holder of is taken (a restart or a bus-loss release of an
// address that never moved); every other group listed is not held, so an
// address left behind by a killed predecessor is removed.
//
// It returns what it could not do (nil when every group is aligned); the
// caller retries (resyncOrRetry). A held group whose claim cannot be
// confirmed because the state cannot be read is left as it is: neither
// released nor re-taken (see "How it fails" in the README).
func (s *Service) resync(ctx context.Context, why string) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var failed []error
	statuses, err := s.groupStatuses(rctx)
	if err != nil {
		s.log.Warn("resync: cannot read group status", "why", why, "err", err)
		// Listing the keys needs the cluster's meta leader, which a server
		// rejoining the cluster may have just deposed; reading a key does
		// not. The groups held here are the ones a stale holder must give
		// up, so they are aligned now and the rest at the next retry.
		if statuses = s.heldGroupStatuses(rctx); len(statuses) == 0 {
			return fmt.Errorf("read group status: %w", err)
		}
		failed = append(failed, fmt.Errorf("list group status: %w", err))
	}
	confirm := conflict.Confirmer{Cluster: s.cfg.Cluster, Node: s.cfg.Node, Read: s.kv}
	maxEpoch := s.fence.Snapshot().MaxEpoch
	for _, g := range statuses {
		if err := s.allow.Check(g.Group, g.Addresses); err != nil {
			// The state bucket names a group or address this node may not
			// hold: neither take nor touch it.
			s.log.Warn("resync: group status outside this node's groups; ignored", "group", g.Group, "err", err)
			s.m.refused.WithLabelValues(execute.RefusedNotAllowed).Inc()
			continue
		}
		prefixes, err := parsePrefixes(g.Addresses)
		if err != nil {
			s.log.Warn("resync: bad addresses", "group", g.Group, "err", err)
			continue
		}
		s.mu.Lock()
		mine, held := s.claims[g.Group]
		s.mu.Unlock()
		hold := g.Holder == s.cfg.Node && g.Epoch >= maxEpoch
		if held {
			v := confirm.Confirm(rctx, mine)
			if v.ReadErr != nil {
				// Cannot tell: dropping an address nobody else is known to
				// hold cuts the phones off, so it stays as it is until a
				// retry can read the state. A second holder, if there is
				// one, is ended by the conflict watch (which yields when it
				// cannot confirm) and the arbiter's release.
				s.log.Warn("resync: cannot confirm the claim held; leaving the group as it is", "group", g.Group, "err", v.ReadErr)
				failed = append(failed, fmt.Errorf("group %s: confirm claim: %w", g.Group, v.ReadErr))
				continue
			}
			hold = v.Confirmed
		}
		if !hold {
			if err := s.release(rctx, g.Group, prefixes); err != nil {
				s.log.Warn("resync: release", "group", g.Group, "err", err)
				failed = append(failed, fmt.Errorf("group %s: release: %w", g.Group, err))
			}
			continue
		}
		if err := s.fence.Manage(g.Addresses...); err != nil {
			s.log.Warn("resync: cannot record the addresses to hold; not taking them", "group", g.Group, "err", err)
			failed = append(failed, fmt.Errorf("group %s: record the addresses to hold: %w", g.Group, err))
			continue
		}
		s.act.Lock()
		if !held {
			s.setClaim(g.Group, prefixes, conflict.Claim{Group: g.Group, Epoch: g.Epoch})
		}
		err = s.loop.SetDesired(g.Group, g.Addresses, true)
		if err == nil {
			_, err = s.loop.Apply(rctx)
		}
		if err == nil {
			err = s.gw.Apply()
		}
		s.act.Unlock()
		s.log.Info("resynced desired state", "why", why, "group", g.Group, "hold", true, "epoch", g.Epoch, "err", err)
		if err != nil {
			failed = append(failed, fmt.Errorf("group %s: take: %w", g.Group, err))
		} else if !held {
			// Taken back without a claim: the calls this node kept before
			// (or any left by others) are kept again.
			s.adoptAfterResync(g.Group)
		}
	}
	return errors.Join(failed...)
}

// heldGroupStatuses reads the group status of every group held here, one
// key at a time; the ones it cannot read are left out.
func (s *Service) heldGroupStatuses(ctx context.Context) []events.GroupStatus {
	if s.kv == nil {
		return nil
	}
	s.mu.Lock()
	keys := make([]string, 0, len(s.claims))
	for g := range s.claims {
		keys = append(keys, events.GroupStatusKey(s.cfg.Cluster, g))
	}
	s.mu.Unlock()
	slices.Sort(keys)
	out, _ := s.readGroupStatuses(ctx, keys, true)
	return out
}

func (s *Service) groupStatuses(ctx context.Context) ([]events.GroupStatus, error) {
	if s.kv == nil || s.listKeys == nil {
		return nil, errors.New("no state bucket")
	}
	keys, err := s.listKeys(ctx)
	if err != nil {
		return nil, err
	}
	return s.readGroupStatuses(ctx, keys, false)
}

// readGroupStatuses reads the statuses under keys. A missing key is
// skipped, and so is a status that does not decode or names another group
// than its key. A read that fails ends it with the error, unless
// bestEffort, which skips that key too.
func (s *Service) readGroupStatuses(ctx context.Context, keys []string, bestEffort bool) ([]events.GroupStatus, error) {
	var out []events.GroupStatus
	for _, k := range keys {
		b, err := s.kv(ctx, k)
		if err != nil && !bestEffort {
			return nil, fmt.Errorf("read %s: %w", k, err)
		}
		if err != nil || b == nil {
			continue
		}
		var g events.GroupStatus
		if err := json.Unmarshal(b, &g); err != nil {
			s.log.Warn("resync: decode group status", "key", k, "err", err)
			continue
		}
		if events.GroupStatusKey(s.cfg.Cluster, g.Group) != k {
			s.log.Warn("resync: group status names another group than its key; ignored", "key", k, "group", g.Group)
			continue
		}
		out = append(out, g)
	}
	return out, nil
}

// releaseLookBack reaches back before the claim for results published
// before it arrived (the release may be answered first), with room for
// the arbiter's clock running ahead of the server's.
const releaseLookBack = 10 * time.Second

// awaitReleases waits, at most claim.release_wait, for a result of each
// release id: the nodes letting go in the same decision, on their own
// executors. Any outcome counts: a node that failed to release said so and
// the arbiter acts on it. It reports whether every one was answered.
func (s *Service) awaitReleases(ctx context.Context, env events.Envelope, ids []string) bool {
	if s.watch == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Claim.ReleaseWait.D())
	defer cancel()
	var mu sync.Mutex
	pending := make(map[string]bool, len(ids))
	for _, id := range ids {
		pending[id] = true
	}
	answered := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		_ = s.watch(ctx, bus.WatchOptions{Subjects: []string{events.AllCommandResults(s.cfg.Cluster)}, Since: env.Time.Add(-releaseLookBack)},
			func(_ events.Envelope, p events.Decoded, _ uint64) {
				r, ok := p.(*events.CommandResult)
				if !ok {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if pending[r.CommandID] {
					delete(pending, r.CommandID)
					if len(pending) == 0 {
						close(answered)
					}
				}
			})
	}()
	select {
	case <-answered:
		cancel()
		<-watched
		return true
	case <-ctx.Done():
		<-watched
		mu.Lock()
		defer mu.Unlock()
		return len(pending) == 0
	}
}
