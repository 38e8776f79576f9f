package httphb

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// FuzzHeartbeatBody: whatever body an authenticated host posts, the
// endpoint answers 202 or a 4xx and never panics, and what it publishes
// passes the same Validate as every node.heartbeat on the bus (interval_ms
// 9223372036854775807 used to be accepted).
// Run: go test -run '^$' -fuzz FuzzHeartbeatBody ./internal/httphb (or make fuzz).
func FuzzHeartbeatBody(f *testing.F) {
	f.Add(`{"node":"legacy1","cpu_percent":12.5,"mem_available_bytes":700,"mem_total_bytes":1000,"active_channels":3}`)
	f.Add(`{"node":"legacy1","cpu_percent":0,"mem_available_bytes":0,"mem_total_bytes":1,"interval_ms":9223372036854775807}`)
	f.Add(`{"node":"legacy1","cpu_percent":1e308,"mem_available_bytes":18446744073709551615,"mem_total_bytes":18446744073709551615,"active_calls":-1}`)
	f.Add(`{"node":"legacy1","cpu_percent":1,"mem_available_bytes":1,"mem_total_bytes":1,"version":"` + strings.Repeat("v", 70) + `"}`)
	f.Add(`{"node":"a.b"}{}`)
	f.Add(`[]`)
	f.Add(`{"node":"legacy1","node":"other","cpu_percent":-0}`)
	var published *events.NodeHeartbeat
	emit := func(_ context.Context, p events.Payload, _ ...events.Option) (events.Envelope, error) {
		hb := p.(*events.NodeHeartbeat)
		if err := hb.Validate(); err != nil {
			return events.Envelope{}, err
		}
		published = hb
		return events.Envelope{ID: "x"}, nil
	}
	list := func(context.Context) ([]events.NodeRecord, error) { return nil, nil }
	h := New(Config{Token: "0123456789abcdef", Nodes: []string{"legacy1"}, Interval: time.Minute, Rate: 1000, Burst: 1 << 20},
		emit, list, slog.New(slog.DiscardHandler))
	f.Fuzz(func(t *testing.T, body string) {
		published = nil
		req := httptest.NewRequest(http.MethodPost, "/api/servers/heartbeat", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer 0123456789abcdef")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch {
		case rec.Code == http.StatusAccepted:
			if published == nil {
				t.Fatalf("202 without a heartbeat: %s", body)
			}
			if err := published.Validate(); err != nil {
				t.Fatalf("published an invalid heartbeat: %v", err)
			}
		case rec.Code >= 400 && rec.Code < 500:
			if published != nil {
				t.Fatalf("%d but published %+v", rec.Code, published)
			}
		default:
			t.Fatalf("status %d for %q", rec.Code, body)
		}
	})
}
