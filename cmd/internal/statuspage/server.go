// Package statuspage is fan's live status page (fanctl serve): one
// read-only web page, its HTML, script and style embedded in the binary,
// showing every group's holder and epoch, each node's health and checks,
// the failback windows and permit, the arbiter's situation lines, and a
// live timeline of the audit stream (server-sent events) where a click on
// an event shows its causal chain (what fanctl explain prints). Every
// request but the page's static files needs the bearer token or a session
// a login with the token opened.
package statuspage

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

//go:embed web
var web embed.FS

// Time limits of one request.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	statusTimeout     = 10 * time.Second
	explainTimeout    = 30 * time.Second
	// writeTimeout bounds each write to a live stream: a browser that
	// stopped reading is dropped, not waited for.
	writeTimeout = 10 * time.Second
	// keepAlive is how often an idle live stream carries a comment, so
	// proxies do not close it.
	keepAlive = 15 * time.Second
	// explainAtOnce bounds the explanations read from the bus at once:
	// each reads the trail back to the lookback.
	explainAtOnce = 2
	maxLoginBody  = 8 << 10
	maxHeader     = 16 << 10
)

// Server is one status page.
type Server struct {
	cfg     Config
	cluster string
	log     *slog.Logger
	auth    *auth
	explain chan struct{}
	// Set by Serve.
	b    *bus.Bus
	hub  *hub
	stop chan struct{}
}

// New checks cfg and reads the token file; cluster limits the page to one
// cluster (empty: every cluster on the bus). Nothing is read from the bus
// before Serve, so a bad file is reported before the bus is dialled.
func New(cfg Config, cluster string, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tok, err := readToken(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, cluster: cluster, log: log,
		auth:    newAuth(tok, cfg.SessionTTL.D(), !cfg.InsecureCookie, cfg.PathPrefix),
		explain: make(chan struct{}, explainAtOnce),
	}, nil
}

// Listen opens the configured address.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("status page listen %s: %w", s.cfg.Listen, err)
	}
	return ln, nil
}

// Serve serves the page on ln, reading the bus b, until ctx ends, then
// closes the live streams and waits (briefly) for the requests in flight.
// A Server serves once.
func (s *Server) Serve(ctx context.Context, ln net.Listener, b *bus.Bus) error {
	s.b, s.hub, s.stop = b, newHub(b, s.cluster, s.cfg, s.log), make(chan struct{})
	hctx, stopHub := context.WithCancel(ctx)
	hubDone := make(chan struct{})
	go func() {
		defer close(hubDone)
		s.hub.run(hctx)
	}()
	srv := &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeader,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return hctx },
	}
	s.log.Info("status page serving", "addr", ln.Addr().String(), "path_prefix", s.cfg.PathPrefix, "cluster", s.cluster)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	close(s.stop)
	stopHub()
	<-hubDone
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil && err == nil {
		err = fmt.Errorf("status page shutdown: %w", serr)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// handler serves the page under the path prefix.
func (s *Server) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secureHeaders(w.Header())
		prefix := s.cfg.PathPrefix
		if r.URL.Path+"/" == prefix {
			// The page's URLs are relative to a path ending in "/".
			http.Redirect(w, r, path.Base(prefix)+"/", http.StatusPermanentRedirect)
			return
		}
		rel, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		switch rel {
		case "", "app.js", "charts.js", "style.css":
			s.static(w, r, rel)
		case "api/login":
			w.Header().Set("Cache-Control", "no-store")
			s.login(w, r)
		case "api/logout":
			w.Header().Set("Cache-Control", "no-store")
			s.logout(w, r)
		case "api/status", "api/events", "api/explain", "api/history":
			w.Header().Set("Cache-Control", "no-store")
			if !s.auth.admitted(r) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="fan"`)
				writeError(w, http.StatusUnauthorized, "login required")
				return
			}
			if !allow(w, r, http.MethodGet) {
				return
			}
			switch rel {
			case "api/status":
				s.status(w, r)
			case "api/events":
				s.events(w, r)
			case "api/history":
				s.history(w, r)
			default:
				s.explainEvent(w, r)
			}
		default:
			http.NotFound(w, r)
		}
	})
}

// secureHeaders: no script but the page's own file, no framing, no
// sniffing, no referrer leaving the page.
func secureHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "+
		"img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

func (s *Server) static(w http.ResponseWriter, r *http.Request, name string) {
	if !allow(w, r, http.MethodGet, http.MethodHead) {
		return
	}
	if name == "" {
		name = "index.html"
	}
	b, err := web.ReadFile("web/" + name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", mime.TypeByExtension(path.Ext(name)))
	// Always revalidated: a new binary's page must not meet an old script.
	w.Header().Set("Cache-Control", "no-cache")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(b)
}

// allow answers 405 unless r's method is one of methods.
func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	if slices.Contains(methods, r.Method) {
		return true
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, http.StatusMethodNotAllowed, strings.Join(methods, " or ")+" only")
	return false
}

func writeJSON(w http.ResponseWriter, code int, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(data)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(map[string]string{"error": msg})
	writeJSON(w, code, b)
}

// login exchanges the token for a session cookie. It takes JSON only: a
// form on another site cannot send that without the browser asking this
// server first.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send {\"token\": ...} as application/json")
		return
	}
	var req struct {
		Token string `json:"token"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxLoginBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "send {\"token\": ...} as application/json")
		return
	}
	if !s.auth.tokenOK(req.Token) {
		// The peer's own address: a forwarded header is the client's say.
		s.log.Warn("status page login refused", "remote_addr", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, "wrong token")
		return
	}
	c, err := s.auth.open()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "no session")
		return
	}
	http.SetCookie(w, c)
	s.log.Info("status page login", "remote_addr", r.RemoteAddr)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	http.SetCookie(w, s.auth.close(r))
	w.WriteHeader(http.StatusNoContent)
}

// history is what the charts draw: each group's holders, moves, pins and
// failover times over the last week, each node's last hour.
func (s *Server) history(w http.ResponseWriter, _ *http.Request) {
	b, err := json.Marshal(s.hub.hist.view(time.Now()))
	if err != nil {
		writeError(w, http.StatusInternalServerError, "the history does not encode")
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), statusTimeout)
	defer cancel()
	writeJSON(w, http.StatusOK, s.hub.current(ctx))
}

// LinkView is one link of an explanation.
type LinkView struct {
	Depth   int               `json:"depth"`
	ID      string            `json:"id"`
	Missing bool              `json:"missing,omitempty"`
	Repeat  bool              `json:"repeat,omitempty"`
	Event   *EventView        `json:"event,omitempty"`
	Probes  []events.Evidence `json:"probes,omitempty"`
	// Consequence marks what followed the move explained (its claim's
	// result, the adoption of the calls); Calls, on the move, what became
	// of the calls on the holder it left (view.CallsOutcome, as a line).
	Consequence bool   `json:"consequence,omitempty"`
	Calls       string `json:"calls,omitempty"`
}

func (s *Server) explainEvent(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if _, err := view.IDTime(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), explainTimeout)
	defer cancel()
	select {
	case s.explain <- struct{}{}:
		defer func() { <-s.explain }()
	case <-ctx.Done():
		writeError(w, http.StatusServiceUnavailable, "busy explaining other events; try again")
		return
	}
	chain, err := view.Explain(ctx, s.b, s.cluster, id, s.cfg.ExplainLookback.D())
	switch {
	case errors.Is(err, view.ErrNotInTrail):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case err != nil:
		s.log.Warn("status page: explain failed", "id", id, "err", err)
		writeError(w, http.StatusBadGateway, "the trail could not be read: "+err.Error())
		return
	}
	links := make([]LinkView, 0, len(chain))
	for _, l := range chain {
		lv := LinkView{Depth: l.Depth, ID: l.ID, Missing: l.Event == nil, Repeat: l.Repeat, Consequence: l.Consequence}
		if l.Calls != nil {
			lv.Calls = l.Calls.String()
		}
		if l.Event != nil {
			ev := eventView(*l.Event, l.Payload())
			lv.Event = &ev
			if h, ok := l.Payload().(*events.HealthTransition); ok && !l.Repeat {
				lv.Probes = h.Evidence
			}
		}
		links = append(links, lv)
	}
	b, err := json.Marshal(map[string]any{"id": id, "links": links})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "the explanation does not encode")
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// events is the live stream: the latest snapshot and the timeline so far,
// then every new event and snapshot, as server-sent events.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	c, backlog, ok := s.hub.join()
	if !ok {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "too many open live streams")
		return
	}
	defer s.hub.leave(c)
	if len(backlog) == 0 || backlog[0].event != "status" {
		// No snapshot yet: make the first one now, so the page is never
		// empty while the hub's first refresh is due.
		ctx, cancel := context.WithTimeout(r.Context(), statusTimeout)
		first := message{event: "status", data: s.hub.current(ctx)}
		cancel()
		backlog = append([]message{first}, backlog...)
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(ms ...message) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		for _, m := range ms {
			if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", m.event, m.data); err != nil {
				return false
			}
		}
		return rc.Flush() == nil
	}
	if _, err := io.WriteString(w, "retry: 2000\n\n"); err != nil || !send(backlog...) {
		return
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case m, open := <-c.ch:
			if !open || !send(m) {
				return
			}
		case <-tick.C:
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		case <-r.Context().Done():
			return
		case <-s.stop:
			return
		}
	}
}
