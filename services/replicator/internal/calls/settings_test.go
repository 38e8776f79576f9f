package calls_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/calls"
)

// TestSummaryReportsTheSettings: the summary says what of the holder's
// PJSIP settings keeps a call from surviving a failover, as the AMI peer
// reports them the way Asterisk 22 does, and follows a change at the next
// reconcile.
func TestSummaryReportsTheSettings(t *testing.T) {
	l := newLab(t)
	l.peer.SetPJSIP([]amipeer.Transport{
		// The node's own transport without the floating address as its
		// external one, beside the floating one on the same port: both
		// write the node's address in dialogs' Contact.
		{ID: "transport-node", Bind: "198.51.100.11:5060"},
		{ID: "transport-float", Bind: "198.51.100.10:5060", ExternalMediaAddress: "198.51.100.10"},
	}, []amipeer.Endpoint{{Name: "6001", Timers: "no"}, {Name: "6002"}, {Name: "6003", Timers: "always"}})
	kv, err := l.bus.StateKV(l.ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := json.Marshal(events.GroupStatus{Group: group, Addresses: []string{"198.51.100.10/24"}, Holder: "n1", Epoch: 3, UpdatedAt: time.Now()})
	if _, err := kv.Put(l.ctx, events.GroupStatusKey(cluster, group), v); err != nil {
		t.Fatal(err)
	}
	r := l.start(func(c *calls.Config) { c.Reconcile = 200 * time.Millisecond })

	var s events.CallsSummary
	waittest.Until(t, 10*time.Second, "a summary with the settings", func() bool {
		s = r.last()
		return s.Holder && s.TimersEndpoints != nil && s.TransportsRead && len(s.ContactNodeAddress) > 0
	})
	if *s.TimersEndpoints != 2 || !slices.Equal(s.TimersSample, []string{"6002", "6003"}) ||
		!slices.Equal(s.ContactNodeAddress, []string{"transport-float", "transport-node"}) ||
		!slices.Equal(s.MediaAddressRewritten, []string{"transport-float"}) {
		t.Fatalf("settings in the summary: timers %d %v, contact %v, media %v", *s.TimersEndpoints, s.TimersSample, s.ContactNodeAddress, s.MediaAddressRewritten)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}

	// What deploy/asterisk ships: the floating address on every UDP
	// transport, no external media address, timers off.
	l.peer.SetPJSIP([]amipeer.Transport{
		{ID: "transport-node", Bind: "198.51.100.11:5060", ExternalSignalingAddress: "198.51.100.10"},
		{ID: "transport-float", Bind: "198.51.100.10:5060", ExternalSignalingAddress: "198.51.100.10"},
	}, []amipeer.Endpoint{{Name: "6001", Timers: "no"}, {Name: "6002", Timers: "no"}})
	waittest.Until(t, 10*time.Second, "a summary with nothing to warn of", func() bool {
		s = r.last()
		return s.TimersEndpoints != nil && *s.TimersEndpoints == 0 && s.TransportsRead && len(s.ContactNodeAddress) == 0 &&
			len(s.MediaAddressRewritten) == 0 && len(s.TimersSample) == 0
	})
}
