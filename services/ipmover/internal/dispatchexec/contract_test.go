package dispatchexec

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/kamailio"
	"github.com/fanpbx/fan/lab/kamailio/kamailiotest"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/ipmover/internal/dispatcher"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
)

// The dispatcher executor in mode holder keeps the executor contract against
// a real Kamailio: every case starts with n1 the active destination and n2
// disabled, an admitted claim makes n2 the only active one (read back over
// JSON-RPC), a refusal leaves the set as it was, and a duplicate after a
// restart does not set it again.
func TestDispatcherExecutorContract(t *testing.T) {
	kamailiotest.Need(t, "kamailio")
	// Nothing answers at these ports: Kamailio's probes find both
	// destinations down, which leaves fan's own flag (d or not) to read.
	uriA := fmt.Sprintf("sip:127.0.0.1:%d", kamailiotest.FreeUDPPort(t))
	uriB := fmt.Sprintf("sip:127.0.0.1:%d", kamailiotest.FreeUDPPort(t))
	for uriB == uriA {
		uriB = fmt.Sprintf("sip:127.0.0.1:%d", kamailiotest.FreeUDPPort(t))
	}
	list := filepath.Join(t.TempDir(), "dispatcher.list")
	if err := os.WriteFile(list, fmt.Appendf(nil, "1 %s 8 0 duid=n1\n1 %s 8 0 duid=n2\n", uriA, uriB), 0o644); err != nil {
		t.Fatal(err)
	}
	port := porttest.Port(t)
	// One Kamailio for every case, put back to the starting states by each.
	kamailiotest.Start(t, "proxy", kamailio.ProxyConfig(port, list))
	rpcURL := fmt.Sprintf("http://127.0.0.1:%d/RPC", port)
	kam, err := dispatcher.New(dispatcher.Config{URL: rpcURL, Timeout: 2 * time.Second}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	disabled := func(t *testing.T, uri string) bool {
		t.Helper()
		l, err := kam.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range l {
			if d.URI == uri {
				return d.Disabled()
			}
		}
		t.Fatalf("%s not listed", uri)
		return false
	}
	set := func(t *testing.T, want map[string]dispatcher.State) {
		t.Helper()
		// Kamailio may still be starting.
		waittest.Succeeds(t, 10*time.Second, fmt.Sprintf("set %v by hand", want), func() error {
			_, err := kam.Sync(t.Context(), want)
			return err
		})
	}
	start := map[string]dispatcher.State{uriA: dispatcher.Active, uriB: dispatcher.Disabled}

	executetest.Run(t, func(t *testing.T) executetest.Subject {
		set(t, start)
		claim := func(group string) func(time.Time) events.Command {
			return func(notAfter time.Time) events.Command {
				return &events.ClaimIP{Group: group, Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: notAfter,
					PreviousHolder: "n1", PreviousHolderFenced: true}
			}
		}
		return executetest.Subject{
			Node:     "n2",
			Admitted: claim("pbx"),
			// As for DNS, the executor is bounded by its group and its
			// nodes; a node outside them has no consumer.
			NotAllowed:   claim("mail"),
			UnknownGroup: claim("billing"),
			Start: func(t *testing.T, url, stateFile string) func() {
				cfg := Config{
					Common:    daemon.Common{Cluster: executetest.Cluster, Node: "kam1", Bus: bus.Config{URL: url}, ShutdownTimeout: config.Duration(5 * time.Second)},
					StateFile: stateFile,
					Dispatcher: DispatcherConfig{Config: dispatcher.Config{URL: rpcURL, Timeout: 2 * time.Second}, Mode: ModeHolder,
						Group: "pbx", Nodes: map[string]string{"n1": uriA, "n2": uriB}, Resync: config.Duration(time.Second)},
				}
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				s := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
				return executetest.Serve(t, s.Run)
			},
			Effect: func(t *testing.T) bool { return !disabled(t, uriB) && disabled(t, uriA) },
			Undo:   func(t *testing.T) { set(t, start) },
		}
	})
}
