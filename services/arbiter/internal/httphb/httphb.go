// Package httphb is the REST layer for hosts that cannot run fan's
// prober: POST /api/servers/heartbeat turns an authenticated JSON body into
// a node.heartbeat event on the bus (so the registry, the sweeper and the
// load ranking treat it like any other), and GET /api/servers lists the
// registry. Every refusal is a 4xx with a JSON error, and publishes nothing.
package httphb

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxBody bounds a heartbeat body; a real one is about 200 bytes.
const DefaultMaxBody = 4096

// Defaults of the per-source rate limit: a host posts once a minute, an
// operator lists now and then; ten at once and one a second is plenty.
const (
	DefaultRate       = 1.0
	DefaultBurst      = 10
	DefaultMaxSources = 10000
)

// Emitter publishes an event (bus.Bus.Emit).
type Emitter func(ctx context.Context, p events.Payload, opts ...events.Option) (events.Envelope, error)

// Lister returns the registry records (for GET /api/servers).
type Lister func(ctx context.Context) ([]events.NodeRecord, error)

// Config is the endpoint's settings, already validated.
type Config struct {
	Token string
	// NodeTokens are tokens of one node each: a node listed here posts
	// its heartbeats with its own token and with no other, and its token
	// posts for no other node nor reads GET /api/servers. A PBX host
	// that is broken into can then keep only itself looking heard.
	NodeTokens map[string]string
	// Nodes may post heartbeats; any other node name is refused (404). A
	// node whose own prober heartbeats should not be listed: a cron job
	// must not keep a node with a dead prober looking heard.
	Nodes    []string
	MaxBody  int64
	Interval time.Duration // the interval_ms the events carry when the body gives none
	// Rate and Burst are each source address's token bucket (requests a
	// second, and at once); MaxSources bounds the addresses tracked.
	Rate       float64
	Burst      int
	MaxSources int
	// Metrics, when set, gets fan_httphb_refused_total.
	Metrics prometheus.Registerer
}

// Handler serves both routes.
type Handler struct {
	cfg     Config
	emit    Emitter
	list    Lister
	log     *slog.Logger
	limit   *limiter
	refused *prometheus.CounterVec
	mu      sync.Mutex
	seq     map[string]uint64
	// tokenNodes are NodeTokens' nodes, in order.
	tokenNodes []string
}

// New returns the handler.
func New(cfg Config, emit Emitter, list Lister, log *slog.Logger) *Handler {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.Rate <= 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.MaxSources <= 0 {
		cfg.MaxSources = DefaultMaxSources
	}
	h := &Handler{cfg: cfg, emit: emit, list: list, log: log, seq: map[string]uint64{},
		tokenNodes: slices.Sorted(maps.Keys(cfg.NodeTokens)),
		limit:      newLimiter(cfg.Rate, cfg.Burst, cfg.MaxSources, time.Now),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_httphb_refused_total",
			Help: "Requests the HTTP heartbeat endpoint refused, by reason (unauthorized, rate_limited, tls, invalid, ...).",
		}, []string{"reason"})}
	for _, r := range refusalReasons {
		h.refused.WithLabelValues(r)
	}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(h.refused)
	}
	return h
}

// Why a request was refused: the label of fan_httphb_refused_total.
const (
	refusedUnauthorized = "unauthorized"
	refusedRateLimited  = "rate_limited"
	refusedMethod       = "method"
	refusedNotFound     = "not_found"
	refusedUnknownNode  = "unknown_node"
	refusedMediaType    = "media_type"
	refusedTooLarge     = "too_large"
	refusedMalformed    = "malformed"
	refusedInvalid      = "invalid"
	refusedTLS          = "tls"
	refusedPlaintext    = "plaintext"
	refusedConns        = "too_many_connections"
)

var refusalReasons = []string{refusedUnauthorized, refusedRateLimited, refusedMethod, refusedNotFound,
	refusedUnknownNode, refusedMediaType, refusedTooLarge, refusedMalformed, refusedInvalid, refusedTLS, refusedPlaintext, refusedConns}

// refuse answers a 4xx, counts it and logs it with the source address.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, reason string, code int, format string, a ...any) {
	h.refused.WithLabelValues(reason).Inc()
	msg := fmt.Sprintf(format, a...)
	h.log.Warn("http heartbeat refused", "source", r.RemoteAddr, "reason", reason, "status", code,
		"method", r.Method, "path", r.URL.Path, "err", msg)
	fail(w, code, "%s", msg)
}

// source is the peer's address; the endpoint trusts no forwarding header
// (behind a proxy every request would share the proxy's bucket).
func source(r *http.Request) netip.Addr { return hostOf(r.RemoteAddr) }

// hostOf is the address of an "address:port" (the zero Addr if it is not one).
func hostOf(addrPort string) netip.Addr {
	ap, err := netip.ParseAddrPort(addrPort)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
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
	switch h.limit.allow(source(r)) {
	case allowed:
	case limitedFirst, tableFull:
		w.Header().Set("Retry-After", "1")
		h.refuse(w, r, refusedRateLimited, http.StatusTooManyRequests, "too many requests from this address")
		return
	case limitedAgain:
		// Counted, not logged: the first refusal of the run was.
		h.refused.WithLabelValues(refusedRateLimited).Inc()
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusTooManyRequests, "too many requests from this address")
		return
	}
	switch r.URL.Path {
	case "/api/servers/heartbeat":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			h.refuse(w, r, refusedMethod, http.StatusMethodNotAllowed, "use POST")
			return
		}
		if who, ok := h.authorized(w, r); ok {
			h.heartbeat(w, r, who)
		}
	case "/api/servers":
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			h.refuse(w, r, refusedMethod, http.StatusMethodNotAllowed, "use GET")
			return
		}
		if who, ok := h.authorized(w, r); ok {
			if who != "" {
				h.refuse(w, r, refusedUnauthorized, http.StatusUnauthorized, "node %s's token posts its heartbeats only", who)
				return
			}
			h.servers(w, r)
		}
	default:
		h.refuse(w, r, refusedNotFound, http.StatusNotFound, "no such endpoint")
	}
}

// bearer returns the token of an Authorization header. The scheme is
// matched without regard to case (RFC 7235 section 2.1: "Bearer", "bearer"
// and "BEARER" are the same scheme).
func bearer(header string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// authorized checks the bearer token and says whose it is: "" for the
// shared token, a node's name for one of NodeTokens.
func (h *Handler) authorized(w http.ResponseWriter, r *http.Request) (string, bool) {
	tok, ok := bearer(r.Header.Get("Authorization"))
	// Compared as digests: ConstantTimeCompare returns at once on a length
	// mismatch, which would tell a guesser the token's length. Every token
	// is compared, so the time taken does not tell which one matched.
	got := sha256.Sum256([]byte(tok))
	match := func(token string) bool {
		want := sha256.Sum256([]byte(token))
		return token != "" && subtle.ConstantTimeCompare(got[:], want[:]) == 1
	}
	who, found := "", false
	if match(h.cfg.Token) {
		found = true
	}
	for _, node := range h.tokenNodes {
		if match(h.cfg.NodeTokens[node]) && !found {
			who, found = node, true
		}
	}
	if !ok || !found {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fan"`)
		h.refuse(w, r, refusedUnauthorized, http.StatusUnauthorized, "missing or wrong bearer token")
		return "", false
	}
	return who, true
}

func (h *Handler) heartbeat(w http.ResponseWriter, r *http.Request, who string) {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		h.refuse(w, r, refusedMediaType, http.StatusUnsupportedMediaType, "content type %q, want application/json", ct)
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	dec.DisallowUnknownFields()
	var b Body
	if err := dec.Decode(&b); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.refuse(w, r, refusedTooLarge, http.StatusRequestEntityTooLarge, "body larger than %d bytes", h.cfg.MaxBody)
			return
		}
		h.refuse(w, r, refusedMalformed, http.StatusBadRequest, "malformed body: %v", err)
		return
	}
	if dec.More() {
		h.refuse(w, r, refusedMalformed, http.StatusBadRequest, "malformed body: more than one JSON value")
		return
	}
	if err := events.ValidToken("node", b.Node); err != nil {
		h.refuse(w, r, refusedInvalid, http.StatusUnprocessableEntity, "%v", err)
		return
	}
	if !slices.Contains(h.cfg.Nodes, b.Node) {
		h.refuse(w, r, refusedUnknownNode, http.StatusNotFound, "node %q may not post heartbeats here (http_heartbeat.nodes)", b.Node)
		return
	}
	// A node with a token of its own posts with it alone; a node's token
	// posts for that node alone.
	if _, own := h.cfg.NodeTokens[b.Node]; (own || who != "") && who != b.Node {
		h.refuse(w, r, refusedUnauthorized, http.StatusUnauthorized, "this token may not post node %q's heartbeats", b.Node)
		return
	}
	hb, err := h.toEvent(b)
	if err != nil {
		h.refuse(w, r, refusedInvalid, http.StatusUnprocessableEntity, "%v", err)
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
	case b.IntervalMS != 0 && events.ValidHeartbeatInterval(b.IntervalMS) != nil:
		// The arbiter counts a node silent after 3 x this: the same bound
		// as every node.heartbeat on the bus.
		return nil, events.ValidHeartbeatInterval(b.IntervalMS)
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

// TLSErrorLog is the http.Server's ErrorLog: a failed TLS handshake
// (plaintext to the TLS port, a scanner, an old client) is a refused
// attempt like any other, logged with its source and counted.
func (h *Handler) TLSErrorLog() *log.Logger {
	return log.New(tlsErrorWriter{h}, "", 0)
}

type tlsErrorWriter struct{ h *Handler }

func (w tlsErrorWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	// net/http writes "http: TLS handshake error from ADDR: ERR".
	if rest, ok := strings.CutPrefix(line, "http: TLS handshake error from "); ok {
		src, msg, _ := strings.Cut(rest, ": ")
		if strings.Contains(msg, "does not look like a TLS handshake") {
			return len(p), nil // counted as plaintext by GuardTLS
		}
		w.h.refused.WithLabelValues(refusedTLS).Inc()
		w.h.log.Warn("http heartbeat refused", "source", src, "reason", refusedTLS, "err", msg)
		return len(p), nil
	}
	w.h.log.Warn("http heartbeat server", "err", line)
	return len(p), nil
}
