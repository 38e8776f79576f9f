package statuspage

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// Token bounds: long enough that guessing is hopeless (32 random bytes in
// base64 is 44), short enough to read in one go.
const (
	minTokenLen = 16
	maxTokenLen = 4096
	// maxSessions bounds the logins kept; the oldest goes first.
	maxSessions = 1024
	cookieName  = "fan_session"
)

// ErrTokenFile is returned for a token file that cannot be used.
var ErrTokenFile = errors.New("token file unusable")

// readToken reads the bearer token: the file's content without the
// surrounding white space. A file others may read is refused, as ssh
// refuses a private key anyone can read.
func readToken(path string) ([]byte, error) {
	if path == "" {
		return nil, config.Errf("serve.token_file", "required: a file holding the page's bearer token (e.g. head -c 32 /dev/urandom | base64)")
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, config.Errf("serve.token_file", "%w: %v", ErrTokenFile, err)
	}
	if fi.Mode().Perm()&0o007 != 0 {
		return nil, config.Errf("serve.token_file", "%w: %s may be read by anyone (mode %v); chmod o-rwx", ErrTokenFile, path, fi.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, config.Errf("serve.token_file", "%w: %v", ErrTokenFile, err)
	}
	tok := []byte(strings.TrimSpace(string(raw)))
	if len(tok) < minTokenLen || len(tok) > maxTokenLen {
		return nil, config.Errf("serve.token_file", "%w: the token must be %d..%d bytes, %s holds %d", ErrTokenFile, minTokenLen, maxTokenLen, path, len(tok))
	}
	for _, r := range string(tok) {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return nil, config.Errf("serve.token_file", "%w: the token in %s holds white space or a control character", ErrTokenFile, path)
		}
	}
	return tok, nil
}

// auth admits a request that carries the token (Authorization: Bearer) or
// the cookie of a session a login with the token opened. The comparison is
// of digests in constant time, so neither the token's bytes nor its length
// show in the answer's timing. Nothing here reads X-Forwarded-* headers:
// whoever can reach the listener can set them.
type auth struct {
	digest [sha256.Size]byte
	ttl    time.Duration
	secure bool
	path   string

	mu       sync.Mutex
	sessions map[string]time.Time // session id -> expiry
	now      func() time.Time
}

func newAuth(token []byte, ttl time.Duration, secure bool, path string) *auth {
	return &auth{digest: sha256.Sum256(token), ttl: ttl, secure: secure, path: path,
		sessions: map[string]time.Time{}, now: time.Now}
}

// tokenOK compares a presented token with the configured one.
func (a *auth) tokenOK(presented string) bool {
	d := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(d[:], a.digest[:]) == 1
}

// admitted reports whether r carries the token or a live session.
func (a *auth) admitted(r *http.Request) bool {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		return ok && strings.EqualFold(scheme, "Bearer") && a.tokenOK(strings.TrimSpace(tok))
	}
	c, err := r.Cookie(cookieName)
	if err != nil || len(c.Value) != 64 {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.sessions[c.Value]
	if ok && a.now().After(exp) {
		delete(a.sessions, c.Value)
		return false
	}
	return ok
}

// open starts a session and returns its cookie.
func (a *auth) open() (*http.Cookie, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("session id: %w", err)
	}
	id := hex.EncodeToString(raw[:])
	now := a.now()
	a.mu.Lock()
	if len(a.sessions) >= maxSessions {
		a.evictLocked(now)
	}
	a.sessions[id] = now.Add(a.ttl)
	a.mu.Unlock()
	return a.cookie(id, int(a.ttl/time.Second)), nil
}

// evictLocked drops the expired sessions, and the one that ends soonest
// if none has.
func (a *auth) evictLocked(now time.Time) {
	var oldest string
	for id, exp := range a.sessions {
		if now.After(exp) {
			delete(a.sessions, id)
			continue
		}
		if oldest == "" || exp.Before(a.sessions[oldest]) {
			oldest = id
		}
	}
	if len(a.sessions) >= maxSessions && oldest != "" {
		delete(a.sessions, oldest)
	}
}

// close ends r's session, if any, and returns the cookie that clears it.
func (a *auth) close(r *http.Request) *http.Cookie {
	if c, err := r.Cookie(cookieName); err == nil {
		a.mu.Lock()
		delete(a.sessions, c.Value)
		a.mu.Unlock()
	}
	return a.cookie("", -1)
}

func (a *auth) cookie(value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: cookieName, Value: value, Path: a.path, MaxAge: maxAge,
		HttpOnly: true, Secure: a.secure, SameSite: http.SameSiteStrictMode}
}
