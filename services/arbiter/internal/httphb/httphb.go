// Package httphb is the REST layer for hosts that cannot run fan's
// prober: POST /api/servers/heartbeat turns an authenticated JSON body into
// a node.heartbeat event on the bus (so the registry, the sweeper and the
// load ranking treat it like any other), and GET /api/servers lists the
// registry. Every refusal is a 4xx with a JSON error, and publishes nothing.
package httphb

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// DefaultMaxBody bounds a heartbeat body; a real one is about 200 bytes.
const DefaultMaxBody = 4096

// Emitter publishes an event (bus.Bus.Emit).
type Emitter func(ctx context.Context, p events.Payload, opts ...events.Option) (events.Envelope, error)

// Lister returns the registry records (for GET /api/servers).
type Lister func(ctx context.Context) ([]events.NodeRecord, error)

// Config is the endpoint's settings, already validated.
type Config struct {
	Token string
	// Nodes may post heartbeats; any other node name is refused (404). A
	// node whose own prober heartbeats should not be listed: a cron job
	// must not keep a node with a dead prober looking heard.
	Nodes    []string
	MaxBody  int64
	Interval time.Duration // the interval_ms the events carry when the body gives none
}

// Handler serves both routes.
type Handler struct {
	cfg  Config
	emit Emitter
	list Lister
	log  *slog.Logger
	mu   sync.Mutex
	seq  map[string]uint64
}

// New returns the handler.
func New(cfg Config, emit Emitter, list Lister, log *slog.Logger) *Handler {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	return &Handler{cfg: cfg, emit: emit, list: list, log: log, seq: map[string]uint64{}}
}

// Body is what a host posts. Pointers tell "absent" from zero.
type Body struct {
	Node              string   `json:"node"`
	CPUPercent        *float64 `json:"cpu_percent"`
	MemAvailableBytes *uint64  `json:"mem_available_bytes"`
	MemTotalBytes     *uint64  `json:"mem_total_bytes"`
	ActiveChannels    *int     `json:"active_channels,omitempty"`
	ActiveCalls       *int     `json:"active_calls,omitempty"`
	IntervalMS        int64    `json:"interval_ms,omitempty"`
	Version           string   `json:"version,omitempty"`
}

type apiError struct {
	Error string `json:"error"`
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, format string, a ...any) {
	reply(w, code, apiError{Error: fmt.Sprintf(format, a...)})
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/api/servers/heartbeat":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			fail(w, http.StatusMethodNotAllowed, "use POST")
			return
		}
		if h.authorized(w, r) {
			h.heartbeat(w, r)
		}
	case "/api/servers":
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			fail(w, http.StatusMethodNotAllowed, "use GET")
			return
		}
		if h.authorized(w, r) {
			h.servers(w, r)
		}
	default:
		fail(w, http.StatusNotFound, "no such endpoint")
	}
}

func (h *Handler) authorized(w http.ResponseWriter, r *http.Request) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(h.cfg.Token)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fan"`)
		fail(w, http.StatusUnauthorized, "missing or wrong bearer token")
		return false
	}
	return true
}

func (h *Handler) heartbeat(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		fail(w, http.StatusUnsupportedMediaType, "content type %q, want application/json", ct)
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	dec.DisallowUnknownFields()
	var b Body
	if err := dec.Decode(&b); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			fail(w, http.StatusRequestEntityTooLarge, "body larger than %d bytes", h.cfg.MaxBody)
			return
		}
		fail(w, http.StatusBadRequest, "malformed body: %v", err)
		return
	}
	if dec.More() {
		fail(w, http.StatusBadRequest, "malformed body: more than one JSON value")
		return
	}
	if err := events.ValidToken("node", b.Node); err != nil {
		fail(w, http.StatusUnprocessableEntity, "%v", err)
		return
	}
	if !slices.Contains(h.cfg.Nodes, b.Node) {
		fail(w, http.StatusNotFound, "node %q may not post heartbeats here (http_heartbeat.nodes)", b.Node)
		return
	}
	hb, err := h.toEvent(b)
	if err != nil {
		fail(w, http.StatusUnprocessableEntity, "%v", err)
		return
	}
	env, err := h.emit(r.Context(), hb)
	if err != nil {
		h.log.Warn("http heartbeat not published", "node", b.Node, "err", err)
		fail(w, http.StatusServiceUnavailable, "bus unavailable: heartbeat not recorded")
		return
	}
	reply(w, http.StatusAccepted, map[string]any{"event_id": env.ID, "node": hb.Node, "seq": hb.Seq})
}

func (h *Handler) toEvent(b Body) (*events.NodeHeartbeat, error) {
	switch {
	case b.CPUPercent == nil || b.MemAvailableBytes == nil || b.MemTotalBytes == nil:
		return nil, errors.New("cpu_percent, mem_available_bytes and mem_total_bytes are required")
	case math.IsNaN(*b.CPUPercent) || *b.CPUPercent < 0 || *b.CPUPercent > 100:
		return nil, fmt.Errorf("cpu_percent %v out of 0..100", *b.CPUPercent)
	case *b.MemTotalBytes == 0 || *b.MemAvailableBytes > *b.MemTotalBytes:
		return nil, fmt.Errorf("mem_available_bytes %d must not exceed a non-zero mem_total_bytes %d", *b.MemAvailableBytes, *b.MemTotalBytes)
	case b.ActiveChannels != nil && *b.ActiveChannels < 0, b.ActiveCalls != nil && *b.ActiveCalls < 0:
		return nil, errors.New("active_channels and active_calls must not be negative")
	case b.IntervalMS < 0:
		return nil, errors.New("interval_ms must not be negative")
	case len(b.Version) > 64:
		return nil, errors.New("version longer than 64 bytes")
	}
	interval := b.IntervalMS
	if interval == 0 {
		interval = h.cfg.Interval.Milliseconds()
	}
	version := b.Version
	if version == "" {
		version = "http"
	}
	h.mu.Lock()
	h.seq[b.Node]++
	seq := h.seq[b.Node]
	h.mu.Unlock()
	hb := &events.NodeHeartbeat{Node: b.Node, Seq: seq, IntervalMS: interval, CPUPercent: *b.CPUPercent,
		MemAvailableBytes: *b.MemAvailableBytes, MemTotalBytes: *b.MemTotalBytes,
		ActiveChannels: b.ActiveChannels, ActiveCalls: b.ActiveCalls, Version: version}
	if err := hb.Validate(); err != nil {
		return nil, err
	}
	return hb, nil
}

func (h *Handler) servers(w http.ResponseWriter, r *http.Request) {
	recs, err := h.list(r.Context())
	if err != nil {
		h.log.Warn("registry list failed", "err", err)
		fail(w, http.StatusServiceUnavailable, "registry unavailable")
		return
	}
	slices.SortFunc(recs, func(a, b events.NodeRecord) int { return strings.Compare(a.Node, b.Node) })
	if recs == nil {
		recs = []events.NodeRecord{}
	}
	reply(w, http.StatusOK, map[string]any{"servers": recs})
}
