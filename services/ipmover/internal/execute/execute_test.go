package execute_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// memory is an executor whose back end is a list of what it applied: the
// contract's own rules, without a network.
type memory struct {
	mu      sync.Mutex
	applied []string
}

func (m *memory) Admit(cmd events.Command) ([]string, error) {
	if g, _ := cmd.Target(); g != "pbx" {
		return nil, fmt.Errorf("group %s: %w", g, execute.ErrNotAllowed)
	}
	return nil, nil
}

func (m *memory) Apply(_ context.Context, env events.Envelope, _ events.Command, tl *execute.Timeline) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applied = append(m.applied, env.ID)
	tl.At("applied", time.Now())
	return nil
}

func claim(group string) func(time.Time) events.Command {
	return func(notAfter time.Time) events.Command {
		return &events.ClaimIP{Group: group, Node: "n1", Addresses: []string{"198.51.100.10/32"}, NotAfter: notAfter}
	}
}

func TestContract(t *testing.T) {
	executetest.Run(t, func(t *testing.T) executetest.Subject {
		m := &memory{}
		return executetest.Subject{
			Node: "n1", Admitted: claim("pbx"), NotAllowed: claim("other"),
			Start: func(t *testing.T, url, stateFile string) func() {
				return startMemory(t, m, url, stateFile)
			},
		}
	})
}

func startMemory(t *testing.T, m *memory, url, stateFile string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	b, err := bus.Connect(ctx, bus.Config{URL: url}, bus.Identity{Cluster: executetest.Cluster, Service: "ipmover", Node: "n1"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f, err := fence.Open(stateFile, 0)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := b.LeaseRecords(ctx, events.ArbiterLease)
	if err != nil {
		t.Fatal(err)
	}
	c := execute.New(execute.Config{Fence: f, Terms: execute.NewLeaseTerms(leases), Executor: m, Publisher: b, Node: "n1"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.ConsumeCommands(ctx, "n1", c.Handle)
	}()
	return func() { cancel(); <-done; b.Close() }
}
