package dnsexec

import (
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
)

// The DNS executor keeps the executor contract, against a real BIND: the
// name moves to site B at most once across a restart (a redelivery is a
// duplicate, the same move again is "already served"), and every refusal
// leaves the zone and the state file as they were.
func TestDNSExecutorContract(t *testing.T) {
	executetest.Run(t, func(t *testing.T) executetest.Subject {
		n := startSiteNamed(t)
		claim := func(group string) func(time.Time) events.Command {
			return func(notAfter time.Time) events.Command {
				return &events.ClaimIP{Group: group, Node: "site-b", Addresses: []string{"203.0.113.20/32"}, NotAfter: notAfter,
					PreviousHolder: "site-a", PreviousHolderFenced: true}
			}
		}
		return executetest.Subject{
			Node:     "site-b",
			Admitted: claim("web"),
			// A DNS executor is bounded by its group and its sites; a site
			// outside them has no consumer, so the group is what a command
			// that reaches it can get wrong.
			NotAllowed:   claim("mail"),
			UnknownGroup: claim("billing"),
			Start: func(t *testing.T, url, stateFile string) func() {
				cfg := siteConfig(url, stateFile, n.Addr, n.Secret)
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				s := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
				return executetest.Serve(t, s.Run)
			},
			// The name served at site B, asked of BIND directly; undone by
			// a signed update putting site A back, as another writer would.
			Effect: func(t *testing.T) bool {
				got, _ := n.Lookup(t, "sip.voip.test", dns.TypeA)
				return slices.Equal(got, []string{"30 " + siteBIP})
			},
			Undo: func(t *testing.T) { n.SetA(t, "sip.voip.test", siteAIP) },
		}
	})
}
