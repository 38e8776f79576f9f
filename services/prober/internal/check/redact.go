package check

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Mask replaces every secret in what a check shows: its target, its errors,
// and so the results, transitions, logs and metrics built from them.
const Mask = "REDACTED"

// secretName matches query parameters and NAME=VALUE arguments whose value
// is a credential whether or not the check says so.
var secretName = regexp.MustCompile(`(?i)(pass|pwd|secret|token|api[_-]?key|apikey|auth|credential|signature|sig$|private)`)

// RedactURL returns raw as it may be shown (the userinfo password and every
// password-like query value replaced) and the secret values it found.
func RedactURL(raw string) (shown string, secrets []string) {
	u, err := url.Parse(raw)
	if err != nil {
		// An unparsable URL is refused by the configuration; show nothing
		// of it rather than risk a credential.
		return Mask, []string{raw}
	}
	if p, ok := u.User.Password(); ok {
		secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
		u.User = url.UserPassword(u.User.Username(), Mask)
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k, vs := range q {
			if !secretName.MatchString(k) {
				continue
			}
			for i, v := range vs {
				if v != "" {
					secrets = append(secrets, v, url.QueryEscape(v))
				}
				vs[i] = Mask
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.String(), secrets
}

// ValidateSecretArgs checks an exec check's secret_args against its
// command: an entry is an argument index (1 is the first argument after the
// program) or a non-empty prefix such as "--db-password=".
func ValidateSecretArgs(marks []string, argc int) error {
	for i, m := range marks {
		if m == "" {
			return fmt.Errorf("secret_args[%d]: empty (want an argument index or a prefix)", i)
		}
		if n, err := strconv.Atoi(m); err == nil && (n < 1 || n >= argc) {
			return fmt.Errorf("secret_args[%d]: index %d is not an argument of the command (1..%d)", i, n, argc-1)
		}
	}
	return nil
}

// RedactArgs returns argv as it may be shown and the secret values in it.
// An argument is secret when secret_args lists its index; when it starts
// with a listed prefix the rest of it is secret, and when it equals one the
// next argument is ("--password" "hunter2"). Without any listing, the value
// of a NAME=VALUE argument whose name looks like a password is secret too
// (--db-password=hunter2), and URLs in arguments lose their credentials.
func RedactArgs(argv []string, marks []string) (shown []string, secrets []string) {
	shown = append([]string(nil), argv...)
	secret := func(i int, keep string) {
		if v := strings.TrimPrefix(argv[i], keep); v != "" {
			secrets = append(secrets, v)
		}
		shown[i] = keep + Mask
	}
	for _, m := range marks {
		if n, err := strconv.Atoi(m); err == nil {
			if n >= 1 && n < len(argv) {
				secret(n, "")
			}
			continue
		}
		for i := 1; i < len(argv); i++ {
			switch {
			case argv[i] == m && i+1 < len(argv):
				secret(i+1, "")
			case strings.HasPrefix(argv[i], m) && argv[i] != m:
				secret(i, m)
			}
		}
	}
	for i := 1; i < len(argv); i++ {
		if shown[i] != argv[i] {
			continue
		}
		if name, _, ok := strings.Cut(argv[i], "="); ok && secretName.MatchString(name) {
			secret(i, name+"=")
			continue
		}
		if at := strings.Index(argv[i], "://"); at > 0 {
			// The URL may follow a NAME= (DSN=postgres://u:pw@db/x).
			start := strings.LastIndexAny(argv[i][:at], "=:") + 1
			if s, found := RedactURL(argv[i][start:]); len(found) > 0 {
				shown[i], secrets = argv[i][:start]+s, append(secrets, found...)
			}
		}
	}
	return shown, secrets
}

// Redactor removes known secret values from any text: the last line of
// defence for what a checked program printed or an error quoted.
type Redactor struct{ r *strings.Replacer }

// NewRedactor replaces each of secrets (longest first, so one secret that
// contains another goes whole) with Mask.
func NewRedactor(secrets []string) *Redactor {
	var pairs []string
	seen := map[string]bool{}
	for _, s := range secrets {
		if s != "" && !seen[s] {
			seen[s] = true
			pairs = append(pairs, s)
		}
	}
	// strings.Replacer tries the old strings in argument order at each
	// position: the longest must come first.
	slices.SortStableFunc(pairs, func(a, b string) int { return len(b) - len(a) })
	args := make([]string, 0, 2*len(pairs))
	for _, p := range pairs {
		args = append(args, p, Mask)
	}
	return &Redactor{r: strings.NewReplacer(args...)}
}

// String returns s without any known secret.
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	return r.r.Replace(s)
}

// Error is String for an error's text (nil stays nil).
func (r *Redactor) Error(err error) error {
	if err == nil || r == nil {
		return err
	}
	if s := r.String(err.Error()); s != err.Error() {
		return &redactedError{msg: s, err: err}
	}
	return err
}

// redactedError keeps errors.Is working on the original while its text
// shows no secret.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// urlErrorCause strips net/http's *url.Error, whose text repeats the URL
// (with the query, and so any token in it); the check prefixes its own
// redacted form instead.
func urlErrorCause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
