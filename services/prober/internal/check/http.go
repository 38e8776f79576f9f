package check

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"time"
)

// maxBody bounds how much of a response body a body match reads.
const maxBody = 1 << 20

// HTTP fetches a URL (what a wget-based check did): healthy when the status is in codes
// and, if a pattern is given, the body matches it.
type HTTP struct {
	url string
	// shown is url without credentials: what targets and errors say.
	shown  string
	codes  Codes
	body   *regexp.Regexp
	client *http.Client
	// req is parsed once; each run sends a copy carrying its context. The
	// client and transport only read it.
	req *http.Request
	// reqErr is why the URL did not make a request; every run reports it.
	reqErr error
}

// NewHTTP makes the check. insecure skips TLS verification, for a node's own
// self-signed certificate reached by address.
func NewHTTP(url string, codes Codes, body *regexp.Regexp, insecure bool) *HTTP {
	tr := &http.Transport{
		// One probe at a time per check: keep its connection, close the rest.
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: insecure}, //nolint:gosec // operator's explicit choice
	}
	shown, _ := RedactURL(url)
	h := &HTTP{url: url, shown: shown, codes: codes, body: body, client: &http.Client{Transport: tr}}
	h.req, h.reqErr = http.NewRequest(http.MethodGet, url, nil)
	if h.reqErr == nil {
		h.req.Header.Set("User-Agent", "fan-prober")
	}
	return h
}

func (h *HTTP) Kind() string   { return "http" }
func (h *HTTP) Target() string { return h.shown }

func (h *HTTP) Run(ctx context.Context) Result {
	start := time.Now()
	if h.reqErr != nil {
		return finish(start, fmt.Errorf("http %s: %w", h.shown, urlErrorCause(h.reqErr)))
	}
	resp, err := h.client.Do(h.req.WithContext(ctx))
	if err != nil {
		return finish(start, fmt.Errorf("http GET %s: %w", h.shown, urlErrorCause(err)))
	}
	defer resp.Body.Close()
	fig := map[string]float64{"http_status": float64(resp.StatusCode)}
	if !h.codes.Has(resp.StatusCode) {
		// Drain a little so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		r := finish(start, fmt.Errorf("http GET %s: status %d: %w", h.shown, resp.StatusCode, ErrUnhealthy))
		r.Figures = fig
		return r
	}
	if h.body != nil {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		if err != nil {
			r := finish(start, fmt.Errorf("http GET %s: read body: %w", h.shown, err))
			r.Figures = fig
			return r
		}
		if !h.body.Match(b) {
			r := finish(start, fmt.Errorf("http GET %s: body does not match %q: %w", h.shown, h.body, ErrUnhealthy))
			r.Figures = fig
			return r
		}
	} else {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
	}
	r := finish(start, nil)
	r.Figures = fig
	return r
}

func (h *HTTP) Close() error {
	h.client.CloseIdleConnections()
	return nil
}
