package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries "t=<unix seconds>,v1=<hex HMAC-SHA256 of
// "<t>.<body>" under the shared secret>". The timestamp is signed with the
// body so a receiver can refuse a replayed request by its age, and each
// attempt is signed anew, so a late retry is not refused as a replay.
const SignatureHeader = "X-Fan-Signature"

// Sign returns the SignatureHeader value for body sent at t.
func Sign(secret, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Errors Verify returns, for a receiver to branch on.
var (
	ErrBadSignature = errors.New("signature does not match")
	ErrStale        = errors.New("signature timestamp outside the tolerance")
)

// Verify checks a SignatureHeader value against body, as a receiver
// written in Go does: the HMAC must match (compared in constant time) and
// the timestamp must be within tolerance of now.
func Verify(secret, body []byte, header string, now time.Time, tolerance time.Duration) error {
	var ts, sig string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q", ErrBadSignature, ts)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, mac(secret, ts, body)) {
		return ErrBadSignature
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: %v old", ErrStale, d)
	}
	return nil
}

// webhook POSTs events to one receiver.
type webhook struct {
	cfg     WebhookConfig
	secret  []byte
	client  *http.Client
	agent   string
	timeout time.Duration
	// retried counts each retry (fan_notify_retries_total).
	retried func()
}

// errPermanent marks a refusal that another try would not change (a 4xx
// other than 408 and 429).
var errPermanent = errors.New("refused by the receiver")

// responseKept bounds what is kept of a refusing receiver's answer for the log.
const responseKept = 512

// deliver POSTs ev until the receiver takes it (2xx), refuses it for good,
// or max_tries attempts have failed, waiting backoff (doubling, at most
// max_backoff, or the receiver's Retry-After within that) between tries.
func (w *webhook) deliver(ctx context.Context, ev Event) (tries int, err error) {
	body := ev.JSON()
	wait := w.cfg.Backoff.D()
	for tries = 1; ; tries++ {
		var after time.Duration
		after, err = w.attempt(ctx, ev, body, tries)
		if err == nil || errors.Is(err, errPermanent) || tries >= w.cfg.MaxTries || ctx.Err() != nil {
			return tries, err
		}
		if after > 0 {
			wait = max(wait, after)
		}
		wait = min(wait, w.cfg.MaxBackoff.D())
		w.retried()
		select {
		case <-ctx.Done():
			return tries, fmt.Errorf("%w (stopped before try %d)", err, tries+1)
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// attempt is one POST; after is the receiver's Retry-After, if any.
func (w *webhook) attempt(ctx context.Context, ev Event, body []byte, try int) (after time.Duration, err error) {
	ctx, cancel := context.WithTimeoutCause(ctx, w.timeout, errTimedOut)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errPermanent, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", w.agent)
	req.Header.Set("X-Fan-Event", string(ev.Kind))
	req.Header.Set("X-Fan-Event-Id", ev.ID)
	req.Header.Set("X-Fan-Attempt", strconv.Itoa(try))
	req.Header.Set(SignatureHeader, Sign(w.secret, body, time.Now()))
	resp, err := w.client.Do(req)
	if err != nil {
		if errors.Is(context.Cause(ctx), errTimedOut) {
			return 0, fmt.Errorf("POST %s: no answer within %v: %w", w.cfg.URL, w.timeout, errTimedOut)
		}
		return 0, fmt.Errorf("POST %s: %w", w.cfg.URL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, responseKept))
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return 0, nil
	case c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500:
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			after = time.Duration(s) * time.Second
		}
		return after, fmt.Errorf("POST %s: %s: %s", w.cfg.URL, resp.Status, strings.TrimSpace(string(msg)))
	default:
		return 0, fmt.Errorf("POST %s: %s: %s: %w", w.cfg.URL, resp.Status, strings.TrimSpace(string(msg)), errPermanent)
	}
}

// newClient refuses redirects: the signature was made for this URL, and a
// redirect would carry the event somewhere the configuration never named.
func newClient() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
