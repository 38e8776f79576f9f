package conflict

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
)

func kv(t *testing.T, entries map[string]any) ReadKey {
	t.Helper()
	raw := map[string][]byte{}
	for k, v := range entries {
		if s, ok := v.(string); ok {
			raw[k] = []byte(s)
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		raw[k] = b
	}
	return func(_ context.Context, key string) ([]byte, error) { return raw[key], nil }
}

func TestConfirm(t *testing.T) {
	gsKey, stKey := events.GroupStatusKey("lab", "pbx"), events.ArbiterStateKey("lab")
	claim := Claim{Group: "pbx", Epoch: 5, CommandID: "c-mine"}
	pending := func(node, id string, epoch uint64) string {
		return `{"epoch":` + itoa(epoch) + `,"groups":[{"name":"pbx","claim":{"command_id":"` + id + `","node":"` + node + `"}}]}`
	}
	cases := []struct {
		name    string
		entries map[string]any
		read    ReadKey
		want    bool
		reason  string
	}{
		{"status names us", map[string]any{gsKey: events.GroupStatus{Group: "pbx", Holder: "n1", Epoch: 5}}, nil, true, "names n1"},
		{"status names us under a newer leader", map[string]any{gsKey: events.GroupStatus{Group: "pbx", Holder: "n1", Epoch: 9}}, nil, true, "epoch 9"},
		{"status names another", map[string]any{gsKey: events.GroupStatus{Group: "pbx", Holder: "n2", Epoch: 5},
			stKey: pending("n1", "c-mine", 5)}, nil, false, "names n2"},
		{"moving, our claim outstanding", map[string]any{gsKey: events.GroupStatus{Group: "pbx", Epoch: 5},
			stKey: pending("n1", "c-mine", 5)}, nil, true, "outstanding"},
		{"moving, another claim of ours outstanding", map[string]any{gsKey: events.GroupStatus{Group: "pbx", Epoch: 5},
			stKey: pending("n1", "c-newer", 5)}, nil, false, "c-newer"},
		{"moving, claim for another node", map[string]any{stKey: pending("n2", "c-theirs", 6)}, nil, false, "on n2"},
		{"arbiter state older than our claim", map[string]any{stKey: pending("n1", "c-mine", 4)}, nil, false, "older"},
		{"nothing in the bucket", map[string]any{}, nil, false, "no holder"},
		{"garbage state", map[string]any{stKey: "{not json"}, nil, false, "decode"},
		{"bus unreachable", nil, func(context.Context, string) ([]byte, error) { return nil, errors.New("no responders") }, false, "cannot read"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			read := tc.read
			if read == nil {
				read = kv(t, tc.entries)
			}
			v := Confirmer{Cluster: "lab", Node: "n1", Read: read}.Confirm(t.Context(), claim)
			if v.Confirmed != tc.want || !strings.Contains(v.Reason, tc.reason) {
				t.Fatalf("Confirm = %+v, want confirmed=%v with reason containing %q", v, tc.want, tc.reason)
			}
		})
	}
}

func itoa(u uint64) string { return strconv.FormatUint(u, 10) }

type fakeHoldings struct {
	mu        sync.Mutex
	held      map[netip.Addr]Claim
	yields    []string
	reasserts []string
}

func (f *fakeHoldings) Holding(ip netip.Addr) (Claim, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.held[ip]
	return c, ok
}

func (f *fakeHoldings) Yield(_ context.Context, g string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.yields = append(f.yields, g)
	for ip, c := range f.held {
		if c.Group == g {
			delete(f.held, ip)
		}
	}
	return nil
}

func (f *fakeHoldings) Reassert(_ context.Context, g string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reasserts = append(f.reasserts, g)
	return nil
}

func TestResolverYieldsKeepsAndDebounces(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.10")
	other := net.HardwareAddr{2, 0, 0, 0, 0, 2}
	for _, confirmed := range []bool{false, true} {
		h := &fakeHoldings{held: map[netip.Addr]Claim{vip: {Group: "pbx", Epoch: 3}}}
		var (
			mu  sync.Mutex
			got []events.AddressConflict
		)
		confirms := 0
		r := NewResolver(h, Config{
			Node: "n1", OwnMAC: "02:00:00:00:00:01", MinInterval: time.Hour,
			Confirm: func(context.Context, Claim) Verdict {
				mu.Lock()
				confirms++
				mu.Unlock()
				return Verdict{Confirmed: confirmed, Holder: "n2", HolderEpoch: 4, Reason: "because"}
			},
			Report: func(c events.AddressConflict) { mu.Lock(); got = append(got, c); mu.Unlock() },
		})
		// A whole burst from the other MAC, and an address we do not hold.
		for range 5 {
			r.Seen(t.Context(), announce.Seen{IP: vip, MAC: other, At: time.Now()})
		}
		r.Seen(t.Context(), announce.Seen{IP: netip.MustParseAddr("192.0.2.99"), MAC: other, At: time.Now()})
		r.Wait()
		if confirms != 1 || len(got) != 1 {
			t.Fatalf("confirmed=%v: %d confirmations and %d reports for one burst, want 1 and 1", confirmed, confirms, len(got))
		}
		ev := got[0]
		if err := ev.Validate(); err != nil {
			t.Fatalf("conflict event invalid: %v", err)
		}
		wantAction, wantYields := events.ConflictYielded, 1
		if confirmed {
			wantAction, wantYields = events.ConflictKept, 0
		}
		if ev.Action != wantAction || len(h.yields) != wantYields || len(h.reasserts) != 1-wantYields {
			t.Fatalf("confirmed=%v: action %s, yields %v, reasserts %v", confirmed, ev.Action, h.yields, h.reasserts)
		}
		if ev.OtherMAC != other.String() || ev.Epoch != 3 || ev.Holder != "n2" || ev.HolderEpoch != 4 {
			t.Fatalf("event %+v", ev)
		}
	}
}
