package notify

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

var testSecret = []byte("0123456789abcdef-shared-secret")

// receiver is a real HTTP receiver that checks every request's signature
// the way a receiver written without this package would, and fails the
// first failFirst requests with status.
type receiver struct {
	failFirst int
	status    int
	hang      bool

	mu       sync.Mutex
	requests int
	attempts []string
	events   []Event
	badSig   int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.requests++
	n := rc.requests
	rc.attempts = append(rc.attempts, r.Header.Get("X-Fan-Attempt"))
	ok := signedBy(r.Header.Get(SignatureHeader), body, testSecret) &&
		Verify(testSecret, body, r.Header.Get(SignatureHeader), time.Now(), 5*time.Minute) == nil
	if !ok {
		rc.badSig++
	}
	rc.mu.Unlock()
	if !ok {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	if rc.hang {
		<-r.Context().Done()
		return
	}
	if n <= rc.failFirst {
		http.Error(w, "not now", rc.status)
		return
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil || r.Header.Get("X-Fan-Event-Id") != ev.ID {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.events = append(rc.events, ev)
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// signedBy checks "t=…,v1=…" with nothing but the standard library: the
// algorithm a receiver in any language implements from the README.
func signedBy(header string, body, secret []byte) bool {
	var ts, v1 string
	for _, p := range strings.Split(header, ",") {
		if v, ok := strings.CutPrefix(p, "t="); ok {
			ts = v
		}
		if v, ok := strings.CutPrefix(p, "v1="); ok {
			v1 = v
		}
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts + "." + string(body)))
	return ts != "" && v1 == hex.EncodeToString(m.Sum(nil))
}

func (rc *receiver) counts() (requests, badSig int, evs []Event, attempts []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.requests, rc.badSig, append([]Event(nil), rc.events...), append([]string(nil), rc.attempts...)
}

func newWebhook(url string, tries int, timeout time.Duration, retries *int) *webhook {
	return &webhook{cfg: WebhookConfig{URL: url, MaxTries: tries, Backoff: config.Duration(10 * time.Millisecond),
		MaxBackoff: config.Duration(40 * time.Millisecond)}, secret: testSecret, client: newClient(), agent: "fan-arbiter/test",
		timeout: timeout, retried: func() { *retries++ }}
}

// The receiver fails the first two requests: the event is sent again,
// signed anew each time, and taken at the third try.
func TestWebhookRetriesWithBackoffUntilTaken(t *testing.T) {
	rc := &receiver{failFirst: 2, status: http.StatusServiceUnavailable}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	retries := 0
	ev := sampleEvent()
	tries, err := newWebhook(srv.URL, 5, 5*time.Second, &retries).deliver(context.Background(), ev)
	if err != nil || tries != 3 {
		t.Fatalf("deliver = %d tries, %v; want taken at the third", tries, err)
	}
	requests, bad, evs, attempts := rc.counts()
	if requests != 3 || bad != 0 || retries != 2 {
		t.Errorf("%d requests, %d badly signed, %d retries counted; want 3, 0, 2", requests, bad, retries)
	}
	if strings.Join(attempts, ",") != "1,2,3" {
		t.Errorf("X-Fan-Attempt %v", attempts)
	}
	if len(evs) != 1 || evs[0] != ev {
		t.Errorf("received %+v, want %+v", evs, ev)
	}
}

// A receiver that keeps failing costs max_tries requests, then the event
// is given up; one that refuses it (4xx) is not asked again.
func TestWebhookGivesUp(t *testing.T) {
	for _, c := range []struct {
		name          string
		status, tries int
		want          int
		permanent     bool
	}{
		{"server error", http.StatusInternalServerError, 3, 3, false},
		{"rate limited", http.StatusTooManyRequests, 2, 2, false},
		{"refused", http.StatusUnprocessableEntity, 5, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc := &receiver{failFirst: 1000, status: c.status}
			srv := httptest.NewServer(rc)
			defer srv.Close()
			retries := 0
			tries, err := newWebhook(srv.URL, c.tries, 5*time.Second, &retries).deliver(context.Background(), sampleEvent())
			requests, _, _, _ := rc.counts()
			if err == nil || tries != c.want || requests != c.want || errors.Is(err, errPermanent) != c.permanent {
				t.Fatalf("deliver = %d tries, %v; receiver saw %d; want %d (permanent %v)", tries, err, requests, c.want, c.permanent)
			}
		})
	}
}

// A receiver that never answers costs one timeout per try.
func TestWebhookAttemptTimesOut(t *testing.T) {
	rc := &receiver{hang: true}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	retries := 0
	tries, err := newWebhook(srv.URL, 2, 200*time.Millisecond, &retries).deliver(context.Background(), sampleEvent())
	if !errors.Is(err, errTimedOut) || tries != 2 {
		t.Fatalf("deliver = %d tries, %v; want 2 timed out", tries, err)
	}
}

// Verify refuses another secret, a changed body and an old timestamp (a
// replay).
func TestVerifyRefusesForgeriesAndReplays(t *testing.T) {
	body := sampleEvent().JSON()
	at := time.Now()
	h := Sign(testSecret, body, at)
	if err := Verify(testSecret, body, h, at.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatalf("genuine request refused: %v", err)
	}
	if !signedBy(h, body, testSecret) {
		t.Fatal("the signature is not HMAC-SHA256 of t.body")
	}
	for name, err := range map[string]error{
		"other secret": Verify([]byte("another secret of some length"), body, h, at, 5*time.Minute),
		"changed body": Verify(testSecret, append([]byte(" "), body...), h, at, 5*time.Minute),
		"no header":    Verify(testSecret, body, "", at, 5*time.Minute),
	} {
		if !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", name, err)
		}
	}
	if err := Verify(testSecret, body, h, at.Add(10*time.Minute), 5*time.Minute); !errors.Is(err, ErrStale) {
		t.Errorf("replayed 10 minutes later: %v, want ErrStale", err)
	}
}
