package dispatchexec

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/dispatcher"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// Step names of the dispatcher executor's results (mode holder, named in
// events), each noted once Kamailio, read back, shows the states.
const (
	StepHolderActive   = events.StepDispatcherHolderActive
	StepOthersDisabled = events.StepDispatcherOthersDisabled
	StepNodeDisabled   = events.StepDispatcherNodeDisabled
)

// holderExecutor carries out the arbiter's claims and releases for the
// nodes of one group on a dispatcher set: a claim makes its node the only
// active destination, a release disables its node. It consumes the
// commands of every configured node, as the DNS executor does every site's,
// so the group's nodes must run no IP executor for the same commands.
type holderExecutor struct {
	group  string
	nodes  map[string]string
	resync time.Duration
	log    *slog.Logger
	fence  *fence.Store
	kam    *dispatcher.Client

	// mu is held across every sync, so a resync never puts back a state
	// a command is replacing.
	mu sync.Mutex
	// want is what the commands applied since the start asked for, put
	// back at every resync (a state set by hand, a Kamailio restart).
	// Empty after a restart: the set stays as Kamailio has it until the
	// next command, rather than be guessed.
	want map[string]dispatcher.State
}

func newHolderExecutor(cfg Config, log *slog.Logger) (*holderExecutor, error) {
	f, err := fence.Open(cfg.StateFile, fence.DefaultKeep)
	if err != nil {
		return nil, fmt.Errorf("ipmover state: %w", err)
	}
	kam, err := dispatcher.New(cfg.Dispatcher.Config, log)
	if err != nil {
		return nil, err
	}
	return &holderExecutor{group: cfg.Dispatcher.Group, nodes: cfg.Dispatcher.Nodes, resync: cfg.Dispatcher.Resync.D(),
		log: log.With("group", cfg.Dispatcher.Group), fence: f, kam: kam, want: map[string]dispatcher.State{}}, nil
}

// runHolder executes the nodes' commands until ctx ends. The consumer stops
// first (finishing the command in hand), then the resync; nothing is
// released on stop: the set stays as the arbiter last had it set.
func (s *Service) runHolder(ctx context.Context) error {
	x, err := newHolderExecutor(s.cfg, s.log)
	if err != nil {
		return err
	}
	nodes := slices.Sorted(maps.Keys(s.cfg.Dispatcher.Nodes))
	return daemon.Serve(ctx, s.cfg.Common, "ipmover", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		// One contract for every node: their consumers share the fencing
		// state and the set, and it handles one command at a time.
		contract, err := execute.Open(ctx, rt, execute.Config{Fence: x.fence, Executor: x, Logger: x.log})
		if err != nil {
			return err
		}
		g, _ := daemon.NewGroup(ctx)
		g.Go("commands", func(ctx context.Context) error { return contract.Consume(ctx, rt.Bus, nodes...) })
		g.Go("resync", x.keep)
		return g.Wait()
	})
}

// Admit implements execute.Executor: only this group, only its nodes, and
// only the commands that move a set (answer_pbx is the PBX's own).
func (x *holderExecutor) Admit(cmd events.Command) ([]string, error) {
	group, node := cmd.Target()
	if group != x.group {
		return nil, fmt.Errorf("group %s is not steered by this dispatcher executor (it steers %s): %w", group, x.group, execute.ErrNotAllowed)
	}
	if _, ok := x.nodes[node]; !ok {
		return nil, fmt.Errorf("node %s is not in this dispatcher executor's set: %w", node, execute.ErrNotAllowed)
	}
	switch cmd.(type) {
	case *events.ClaimIP, *events.ReleaseIP:
		return nil, nil
	}
	return nil, fmt.Errorf("%T does not move a dispatcher set: %w", cmd, execute.ErrNotAllowed)
}

// Apply implements execute.Executor. A claim activates its node before it
// disables the others: for a moment both may take new calls, never neither.
func (x *holderExecutor) Apply(ctx context.Context, _ events.Envelope, cmd events.Command, tl *execute.Timeline) error {
	switch c := cmd.(type) {
	case *events.ClaimIP:
		uri := x.nodes[c.Node]
		if err := x.set(ctx, map[string]dispatcher.State{uri: dispatcher.Active}); err != nil {
			return fmt.Errorf("claim %s: activate %s: %w", c.Node, uri, err)
		}
		tl.At(StepHolderActive, time.Now())
		others := map[string]dispatcher.State{}
		for n, u := range x.nodes {
			if n != c.Node && u != uri {
				others[u] = dispatcher.Disabled
			}
		}
		if err := x.set(ctx, others); err != nil {
			return fmt.Errorf("claim %s: disable the other nodes: %w", c.Node, err)
		}
		tl.At(StepOthersDisabled, time.Now())
		return nil
	case *events.ReleaseIP:
		uri := x.nodes[c.Node]
		if err := x.set(ctx, map[string]dispatcher.State{uri: dispatcher.Disabled}); err != nil {
			return fmt.Errorf("release %s: disable %s: %w", c.Node, uri, err)
		}
		tl.At(StepNodeDisabled, time.Now())
		return nil
	}
	return fmt.Errorf("unsupported command %T for the dispatcher executor", cmd)
}

// set brings Kamailio to want (read back) and keeps it for the resync.
func (x *holderExecutor) set(ctx context.Context, want map[string]dispatcher.State) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	changes, err := x.kam.Sync(ctx, want)
	if err != nil {
		return err
	}
	maps.Copy(x.want, want)
	logChanges(x.log, "dispatcher set as commanded", changes)
	return nil
}

// keep puts the commanded states back every resync period until ctx ends.
func (x *holderExecutor) keep(ctx context.Context) error {
	t := time.NewTicker(x.resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		x.putBack(ctx)
	}
}

func (x *holderExecutor) putBack(ctx context.Context) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.want) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*x.resync)
	defer cancel()
	changes, err := x.kam.Sync(ctx, x.want)
	if err != nil {
		x.log.Warn("dispatcher resync failed; retrying at the next resync", "err", err)
		return
	}
	logChanges(x.log, "dispatcher set put back as commanded", changes)
}

func logChanges(log *slog.Logger, msg string, changes []dispatcher.Change) {
	if len(changes) == 0 {
		return
	}
	var desc []string
	for _, c := range changes {
		desc = append(desc, fmt.Sprintf("%s %s->%s", c.URI, c.From, c.To))
	}
	log.Info(msg, "changes", strings.Join(desc, ", "))
}
