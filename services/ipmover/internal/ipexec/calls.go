package ipexec

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/keeper"
)

// Calls in progress across a move (the keeper package): at a claim, once
// the address is up and the PBX answers, the group's call records are read
// from the calls bucket while the claim proves the PBX answers, and then
// the direct-media calls another node set up or kept are adopted and their
// dialogs kept until a phone hangs up. The claim's result says what was
// adopted and why the rest was not, when the read ended within the claim;
// otherwise it says deferred, and a calls.adopted event citing the claim
// follows.

// CallsConfig is the calls: block.
type CallsConfig struct {
	// Keep defaults to true: calls are adopted at claims and kept.
	Keep *bool `yaml:"keep"`
	// SIPPort is the PBX's UDP SIP port on the floating address, the port
	// of the dialogs kept (verify.port when zero).
	SIPPort int `yaml:"sip_port"`
	// KeepFor is a kept call's lifetime from its first adoption, past which
	// it is ended on both sides (keeper.DefaultKeepFor when zero).
	KeepFor config.Duration `yaml:"keep_for"`
}

// On reports whether calls are adopted and kept.
func (c CallsConfig) On() bool { return c.Keep == nil || *c.Keep }

// Bounds of the read of a group's records.
const (
	// callsReadWindow bounds the whole read after a claim: past it the
	// calls are not adopted (the claim's report says why). Phones hanging
	// up meanwhile are answered 481 and nobody tells the other side.
	callsReadWindow = 30 * time.Second
	// callsReadAttempt bounds one attempt: a watch placed on a server that
	// just died never answers, and the next attempt is placed anew.
	callsReadAttempt = 2 * time.Second
	// maxRecordsRead bounds the records read of each kind (calls, kept):
	// a group never holds more than its nodes may record and keep.
	maxRecordsRead = 2 * events.MaxCallsPerNode
)

// openKeeper prepares the keeper at start: the raw socket now, so that a
// missing CAP_NET_RAW fails the start and not the first hang-up; the
// captures when calls are adopted.
func (s *Service) openKeeper() (func(), error) {
	if !s.cfg.Calls.On() {
		return func() {}, nil
	}
	sender, err := keeper.OpenRawSender(s.inNS)
	if err != nil {
		return nil, fmt.Errorf("ipmover calls: %w", err)
	}
	s.keeper = keeper.New(keeper.Config{
		Cluster: s.cfg.Cluster, Node: s.cfg.Node, Sender: sender, Store: callsStore{s}, Logger: s.log,
		KeepFor: s.cfg.Calls.KeepFor.D(),
		Open: func(addr netip.AddrPort) (keeper.Source, error) {
			return keeper.OpenCapture(s.cfg.Interface, addr, s.inNS)
		},
	})
	return func() { sender.Close() }, nil
}

// callsKV opens the calls bucket on first use and again after a failed
// open: a bus provisioned before the bucket existed gets it at the next
// `fanctl provision`.
func (s *Service) callsKV(ctx context.Context) (jetstream.KeyValue, error) {
	s.callsMu.Lock()
	defer s.callsMu.Unlock()
	if s.callsBucket != nil {
		return s.callsBucket, nil
	}
	if s.openCalls == nil {
		return nil, errors.New("no bus")
	}
	kv, err := s.openCalls(ctx)
	if err != nil {
		return nil, err
	}
	s.callsBucket = kv
	return kv, nil
}

// callsStore writes this node's kept records.
type callsStore struct{ s *Service }

func (c callsStore) Put(ctx context.Context, key string, value []byte) error {
	kv, err := c.s.callsKV(ctx)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, key, value)
	return err
}

func (c callsStore) Delete(ctx context.Context, key string) error {
	kv, err := c.s.callsKV(ctx)
	if err != nil {
		return err
	}
	return kv.Delete(ctx, key)
}

// callsRead is a read of a group's records in progress.
type callsRead struct {
	done   chan struct{}
	recs   []keeper.Stored
	err    error
	cancel context.CancelFunc
}

// readCalls starts reading group's records, off the caller's path.
func (s *Service) readCalls(group string) *callsRead {
	ctx, cancel := context.WithTimeout(s.bgCtx, callsReadWindow)
	r := &callsRead{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(r.done)
		if s.callsReadGate != nil {
			select {
			case <-s.callsReadGate:
			case <-ctx.Done():
			}
		}
		r.recs, r.err = s.readCallRecords(ctx, group)
	}()
	return r
}

// readCallRecords reads every record of group, the calls of each node and
// the calls kept, retrying an attempt that fails or stalls until ctx ends.
func (s *Service) readCallRecords(ctx context.Context, group string) ([]keeper.Stored, error) {
	var last error
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, callsReadAttempt)
		recs, err := s.readCallRecordsOnce(actx, group)
		cancel()
		if err == nil {
			return recs, nil
		}
		last = err
		if errors.Is(err, jetstream.ErrBucketNotFound) || ctx.Err() != nil {
			return nil, fmt.Errorf("read the call records of %s (%d attempts): %w", group, attempt, last)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return nil, fmt.Errorf("read the call records of %s (%d attempts): %w", group, attempt, last)
		}
	}
}

// readCallRecordsOnce reads the current value of every key of the group,
// one watch per key filter (the bus lets an ipmover make consumers of one
// filter within its cluster's records, no more), each ended once it has
// delivered what the bucket held. A watch is a consumer the library makes
// again on its own; it is used here only for a read bounded by
// callsReadAttempt, made anew by the next attempt if it stalls.
func (s *Service) readCallRecordsOnce(ctx context.Context, group string) ([]keeper.Stored, error) {
	return s.readRecords(ctx, group, events.GroupCallKeys(s.cfg.Cluster, group), events.GroupKeptKeys(s.cfg.Cluster, group))
}

// readRecords reads the current records under each key filter, one watch
// per filter, at once.
func (s *Service) readRecords(ctx context.Context, group string, filters ...string) ([]keeper.Stored, error) {
	kv, err := s.callsKV(ctx)
	if err != nil {
		return nil, err
	}
	var (
		mu   sync.Mutex
		out  []keeper.Stored
		wg   sync.WaitGroup
		errs = make([]error, len(filters))
	)
	for i, keys := range filters {
		wg.Go(func() {
			w, err := kv.Watch(ctx, keys, jetstream.IgnoreDeletes())
			if err != nil {
				errs[i] = fmt.Errorf("watch %s: %w", keys, err)
				return
			}
			defer w.Stop()
			n := 0
			for {
				select {
				case e, ok := <-w.Updates():
					if !ok {
						errs[i] = fmt.Errorf("watch %s: closed", keys)
						return
					}
					if e == nil {
						return // every current value delivered
					}
					if n++; n > maxRecordsRead {
						s.log.Warn("more call records than a group can hold; the rest are not read", "group", group, "keys", keys, "read", maxRecordsRead)
						return
					}
					mu.Lock()
					out = append(out, keeper.Stored{Key: e.Key(), Value: e.Value(), Revision: e.Revision()})
					mu.Unlock()
				case <-ctx.Done():
					errs[i] = fmt.Errorf("watch %s: %w", keys, ctx.Err())
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// adoptAtClaim ends a claim's adoption: when the read is over, the calls
// are adopted now and the result says so; otherwise the result says
// deferred and the adoption is reported by its own event once the read
// ends. Only an applied claim adopts.
func (s *Service) adoptAtClaim(env events.Envelope, group string, r *callsRead, tl *execute.Timeline) {
	select {
	case <-r.done:
		rep := s.adopt(group, env.ID, r)
		tl.SetCalls(rep)
	default:
		tl.SetCalls(events.CallsAdoption{Deferred: true})
		s.bg.Go(func() {
			<-r.done
			rep := s.adopt(group, env.ID, r)
			s.emitAsync(events.CallsAdopted{Group: group, Node: s.cfg.Node, CommandID: env.ID, Calls: rep, At: time.Now()},
				events.CausedBy(env))
		})
	}
}

// adoptAfterResync adopts the calls of a group taken back without a claim
// (a restart, the bus back): this node's own kept records are taken up
// again.
func (s *Service) adoptAfterResync(group string) {
	if s.keeper == nil {
		return
	}
	r := s.readCalls(group)
	s.bg.Go(func() {
		<-r.done
		rep := s.adopt(group, "", r)
		if rep.Adopted > 0 || rep.NotAdoptedTotal() > 0 || rep.Error != "" {
			s.emitAsync(events.CallsAdopted{Group: group, Node: s.cfg.Node, Calls: rep, At: time.Now()})
		}
	})
}

// adopt adopts what r read, if this node still holds group under the
// claim commandID (any claim when empty).
func (s *Service) adopt(group, commandID string, r *callsRead) events.CallsAdoption {
	defer r.cancel()
	if r.err != nil {
		s.log.Warn("calls not adopted: their records could not be read", "group", group, "err", r.err)
		return events.CallsAdoption{Error: r.err.Error()}
	}
	s.act.Lock()
	defer s.act.Unlock()
	s.mu.Lock()
	claim, held := s.claims[group]
	s.mu.Unlock()
	if !held || (commandID != "" && claim.CommandID != commandID) {
		return events.CallsAdoption{Error: "the group was released before its calls were read"}
	}
	addr, ok := s.keepAddr(group)
	if !ok {
		return events.CallsAdoption{Error: "the group has no IPv4 address: calls are kept on IPv4 only"}
	}
	plan := keeper.PlanAdoption(keeper.PlanInput{Cluster: s.cfg.Cluster, Group: group, Node: s.cfg.Node,
		Records: r.recs, Keeping: s.keeper.Kept(), Now: time.Now()})
	rep := plan.Report
	if len(plan.Adopt) > 0 {
		kept, err := s.keeper.Keep(group, addr, plan.Adopt)
		if err != nil {
			s.log.Error("calls not adopted: they cannot be kept", "group", group, "err", err)
			rep.Adopted, rep.From, rep.Error = 0, nil, err.Error()
		} else if kept < len(plan.Adopt) {
			if rep.NotAdopted == nil {
				rep.NotAdopted = map[string]int{}
			}
			rep.NotAdopted[events.NotAdoptedOverBound] += len(plan.Adopt) - kept
			rep.Adopted = kept
		}
	}
	s.keeper.Metrics().CountAdoption(rep.Adopted, rep.NotAdopted)
	s.log.Info("calls adopted", "group", group, "command_id", commandID, "adopted", rep.Adopted,
		"not_adopted", rep.NotAdopted, "from", rep.From, "records", len(r.recs))
	return rep
}

// keepAddr is where a group's kept dialogs reach the PBX: its first IPv4
// address and the SIP port.
func (s *Service) keepAddr(group string) (netip.AddrPort, bool) {
	port := s.cfg.Calls.SIPPort
	if port == 0 {
		port = s.cfg.Verify.Port
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.groups[group] {
		if p.Addr().Is4() {
			return netip.AddrPortFrom(p.Addr(), uint16(port)), true
		}
	}
	return netip.AddrPort{}, false
}

// The handover of kept records. A node that releases a group leaves the
// records of the calls it kept for the next holder, which adopts them and
// writes its own. The ones left behind are then stale: if they stayed, the
// call's end (the new keeper deletes its own record) would leave them
// looking like a call still up, which the next claim would adopt and keep
// for ever. So a node that left records looks at the group's kept records
// every handoverEvery (then handoverSlowEvery after the first minute) while
// it does not hold the group, and deletes each of its own that another
// node keeps now (a record adopted from it, or newer), until none is left.
// The delete is conditional on the revision read: a record this node wrote
// again meanwhile (it took the group back) is never deleted.
const (
	handoverEvery     = 2 * time.Second
	handoverSlowEvery = 30 * time.Second
	handoverFast      = time.Minute
)

// noteLeft records that this node may have left kept records in group.
func (s *Service) noteLeft(group string) {
	s.leftMu.Lock()
	defer s.leftMu.Unlock()
	if s.left == nil {
		s.left = map[string]time.Time{}
	}
	if _, ok := s.left[group]; !ok {
		s.left[group] = time.Now()
	}
}

// runHandover deletes the kept records handed over, until ctx ends. At
// start every group is looked at once: records may have been left before a
// restart.
func (s *Service) runHandover(ctx context.Context) {
	for _, g := range s.cfg.Groups {
		s.noteLeft(g.Name)
	}
	t := time.NewTicker(handoverEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.leftMu.Lock()
			due := map[string]time.Time{}
			for g, since := range s.left {
				if now.Sub(since) < handoverFast || now.Sub(s.leftSwept[g]) >= handoverSlowEvery {
					due[g] = since
				}
			}
			s.leftMu.Unlock()
			for g := range due {
				done := s.handover(ctx, g)
				s.leftMu.Lock()
				if s.leftSwept == nil {
					s.leftSwept = map[string]time.Time{}
				}
				s.leftSwept[g] = now
				if done {
					delete(s.left, g)
					delete(s.leftSwept, g)
				}
				s.leftMu.Unlock()
			}
		}
	}
}

// handover deletes this node's kept records of group that another node
// keeps now, and reports whether none of its own is left (or the group is
// held here again, when adoption takes them up).
func (s *Service) handover(ctx context.Context, group string) (done bool) {
	s.mu.Lock()
	_, held := s.claims[group]
	s.mu.Unlock()
	if held {
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, callsReadAttempt)
	defer cancel()
	recs, err := s.readRecords(rctx, group, events.GroupKeptKeys(s.cfg.Cluster, group))
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return true
		}
		s.log.Debug("handover of kept records: read failed; retried", "group", group, "err", err)
		return false
	}
	type kept struct {
		key string
		rev uint64
		rec events.CallRecord
	}
	var own []kept
	newest := map[string]events.CallRecord{} // another node's newest record of each call
	for _, st := range recs {
		rec, err := events.DecodeCallRecord(st.Value)
		if err != nil || events.VerifyCallKey(st.Key, rec) != nil {
			continue
		}
		if rec.Node == s.cfg.Node {
			own = append(own, kept{st.Key, st.Revision, rec})
		} else if n, ok := newest[rec.ID]; !ok || rec.UpdatedAt.After(n.UpdatedAt) {
			newest[rec.ID] = rec
		}
	}
	left := len(own)
	kv, err := s.callsKV(rctx)
	if err != nil {
		return false
	}
	for _, o := range own {
		other, ok := newest[o.rec.ID]
		if !ok || !(other.AdoptedFrom == s.cfg.Node || other.UpdatedAt.After(o.rec.UpdatedAt)) {
			continue
		}
		if err := kv.Delete(rctx, o.key, jetstream.LastRevision(o.rev)); err != nil {
			s.log.Debug("handover of kept records: delete failed; retried", "key", o.key, "err", err)
			continue
		}
		left--
		s.log.Info("kept record handed over", "group", group, "call", o.rec.ID, "keeper", other.Node)
	}
	return left == 0
}
