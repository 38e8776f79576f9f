package check

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"sync"
	"time"
)

// maxBody bounds how much of a response body a body match reads.
const maxBody = 1 << 20

// keepDrain is how much of a body left unread a run reads further to keep
// its connection; a longer rest closes the connection instead.
const keepDrain = 4096

// HTTP fetches a URL (what a wget-based check did): healthy when the status is in codes
// and, if a pattern is given, the body matches it.
//
// A run is one HTTP/1.1 GET on a connection the check keeps, written and
// read by the run's own goroutine. net/http's client hands every request to
// a writer and a reader goroutine of the connection's, two goroutine
// hand-offs a run that were a fifth of the prober's CPU at 200 checks; the
// response is still parsed by net/http (http.ReadResponse). A redirect is
// followed by net/http's client, as wget follows it.
type HTTP struct {
	url string
	// shown is url without credentials: what targets and errors say.
	shown string
	codes Codes
	body  *regexp.Regexp
	// client follows redirects; it sends a copy of req carrying the run's
	// context and only reads it.
	client *http.Client
	req    *http.Request
	// reqErr is why the URL did not make a request; every run reports it.
	reqErr error

	addr  string      // host:port dialled
	tls   *tls.Config // nil for http
	wire  []byte      // the request as written, credentials included
	dials net.Dialer

	mu   sync.Mutex // guards conn and in against a Close during a run
	conn net.Conn   // kept between runs; nil when there is none
	in   *bufio.Reader
	read countingReader
}

// NewHTTP makes the check. insecure skips TLS verification, for a node's own
// self-signed certificate reached by address.
func NewHTTP(url string, codes Codes, body *regexp.Regexp, insecure bool) *HTTP {
	tlsConf := &tls.Config{InsecureSkipVerify: insecure} //nolint:gosec // operator's explicit choice
	tr := &http.Transport{
		// Only redirects go this way: keep one connection, close the rest.
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
		TLSClientConfig:     tlsConf,
	}
	shown, _ := RedactURL(url)
	h := &HTTP{url: url, shown: shown, codes: codes, body: body, client: &http.Client{Transport: tr},
		dials: net.Dialer{KeepAlive: -1}}
	h.req, h.reqErr = http.NewRequest(http.MethodGet, url, nil)
	if h.reqErr != nil {
		return h
	}
	h.req.Header.Set("User-Agent", "fan-prober")
	u := h.req.URL
	port := u.Port()
	switch {
	case u.Scheme == "https":
		if port == "" {
			port = "443"
		}
		h.tls = tlsConf.Clone()
		h.tls.ServerName = u.Hostname()
	case u.Scheme == "http":
		if port == "" {
			port = "80"
		}
	default:
		h.reqErr = fmt.Errorf("unsupported protocol scheme %q", u.Scheme)
		return h
	}
	h.addr = net.JoinHostPort(u.Hostname(), port)
	// The request is the same every run: written out once. Credentials in
	// the URL go as basic authentication, as net/http's client sends them.
	wire := h.req.Clone(context.Background())
	if u.User != nil {
		pw, _ := u.User.Password()
		wire.SetBasicAuth(u.User.Username(), pw)
	}
	var b bytes.Buffer
	if err := wire.Write(&b); err != nil {
		h.reqErr = err
		return h
	}
	h.wire = b.Bytes()
	return h
}

func (h *HTTP) Kind() string   { return "http" }
func (h *HTTP) Target() string { return h.shown }

func (h *HTTP) Run(ctx context.Context) Result {
	start := time.Now()
	if h.reqErr != nil {
		return finish(start, fmt.Errorf("http %s: %w", h.shown, urlErrorCause(h.reqErr)))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	resp, err := h.roundTrip(ctx)
	kept := err == nil
	if err == nil && isRedirect(resp) {
		h.done(resp)
		kept = false
		resp, err = h.client.Do(h.req.WithContext(ctx))
	}
	if err != nil {
		return finish(start, fmt.Errorf("http GET %s: %w", h.shown, urlErrorCause(err)))
	}
	verdict := h.judge(resp)
	if kept {
		h.done(resp)
	} else {
		// Drain a little so net/http's connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, keepDrain))
		_ = resp.Body.Close()
	}
	r := finish(start, verdict)
	r.Figures = map[string]float64{"http_status": float64(resp.StatusCode)}
	return r
}

// judge reads as much of the body as the verdict needs and gives it.
func (h *HTTP) judge(resp *http.Response) error {
	if !h.codes.Has(resp.StatusCode) {
		return fmt.Errorf("http GET %s: status %d: %w", h.shown, resp.StatusCode, ErrUnhealthy)
	}
	if h.body == nil {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("http GET %s: read body: %w", h.shown, err)
	}
	if !h.body.Match(b) {
		return fmt.Errorf("http GET %s: body does not match %q: %w", h.shown, h.body, ErrUnhealthy)
	}
	return nil
}

// roundTrip sends the request on the kept connection, or a new one, and
// reads the response's head. A kept connection the server closed while
// idle fails before any byte of an answer: the request is sent once more on
// a new connection, as net/http's client does for a GET.
func (h *HTTP) roundTrip(ctx context.Context) (*http.Response, error) {
	for {
		if h.conn != nil && h.in.Buffered() > 0 {
			// Bytes after the last answer: not a connection to read the
			// next answer from.
			h.drop()
		}
		reused := h.conn != nil
		if !reused {
			if err := h.dial(ctx); err != nil {
				return nil, err
			}
		}
		stop := h.watch(ctx)
		resp, err := h.exchange()
		if !stop() && ctx.Err() != nil {
			// The context ended the exchange: say so rather than what
			// the dropped deadline made of it.
			h.drop()
			return nil, ctx.Err()
		}
		if err == nil {
			return resp, nil
		}
		h.drop()
		var ne net.Error
		if !reused || h.read.n > 0 || ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			return nil, err
		}
	}
}

// exchange writes the request and reads the answer's head, past any
// informational (1xx) answer, as net/http's client does.
func (h *HTTP) exchange() (*http.Response, error) {
	if _, err := h.conn.Write(h.wire); err != nil {
		return nil, err
	}
	h.read.n = 0
	for {
		resp, err := http.ReadResponse(h.in, h.req)
		if err != nil || resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, err
		}
	}
}

// watch makes the connection give up when ctx ends: its deadline, and at
// once on a cancel. stop reports false when ctx had already ended the
// exchange.
func (h *HTTP) watch(ctx context.Context) (stop func() bool) {
	deadline, _ := ctx.Deadline() // zero, no deadline, when ctx has none
	_ = h.conn.SetDeadline(deadline)
	conn := h.conn
	return context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
}

func (h *HTTP) dial(ctx context.Context) error {
	c, err := h.dials.DialContext(ctx, "tcp", h.addr)
	if err != nil {
		return err
	}
	if h.tls != nil {
		tc := tls.Client(c, h.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = c.Close()
			return err
		}
		c = tc
	}
	h.conn = c
	h.read.r = c
	if h.in == nil {
		h.in = bufio.NewReaderSize(&h.read, 4096)
	} else {
		h.in.Reset(&h.read)
	}
	return nil
}

// done ends a response of the kept connection: the rest of its body is
// read when short, so the connection can carry the next run; otherwise, or
// when the server said it closes, the connection is closed first, so that
// closing the body does not read on to its end.
func (h *HTTP) done(resp *http.Response) {
	rest, err := io.Copy(io.Discard, io.LimitReader(resp.Body, keepDrain+1))
	if err != nil || rest > keepDrain || resp.Close {
		h.drop()
	}
	_ = resp.Body.Close()
}

func (h *HTTP) drop() {
	if h.conn != nil {
		_ = h.conn.Close()
		h.conn = nil
	}
}

func isRedirect(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return resp.Header.Get("Location") != ""
	}
	return false
}

func (h *HTTP) Close() error {
	h.mu.Lock()
	h.drop()
	h.mu.Unlock()
	h.client.CloseIdleConnections()
	return nil
}

// countingReader counts what a response's reading took from the connection:
// a kept connection that failed before any byte is sent again.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
