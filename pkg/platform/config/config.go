// Package config loads the YAML files every fan service reads, strictly:
// an unknown key, a malformed value or an unreadable file stops start-up with
// a message that names the file and the key.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Validator is implemented by config structs that check themselves after loading.
type Validator interface {
	Validate() error
}

// Load reads path into dst (a pointer to a struct with yaml tags). Unknown
// keys are errors: a misspelt "fall" silently ignored would mean a failover
// policy nobody asked for. dst's existing field values act as defaults.
func Load(path string, dst any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return Parse(path, b, dst)
}

// Parse is Load for bytes already read; name is used in error messages.
func Parse(name string, b []byte, dst any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w%s", name, err, quoteLine(b, err))
	}
	if v, ok := dst.(Validator); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("config %s: %w", name, err)
		}
	}
	return nil
}

var linePattern = regexp.MustCompile(`line (\d+)`)

// quoteLine shows the offending source line, because YAML errors from
// custom types know the line but not the key.
func quoteLine(src []byte, err error) string {
	m := linePattern.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.Split(string(src), "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	line := strings.TrimSpace(lines[n-1])
	// The error goes to stderr and the journal: a misspelt "secert:" must
	// not print the secret with it. An unknown key's value says nothing
	// about the error anyway; a credential's is never shown.
	if k, _, ok := strings.Cut(line, ":"); ok && (credentialKey.MatchString(k) || strings.Contains(err.Error(), "not found in type")) {
		line = k + ": REDACTED"
	}
	return fmt.Sprintf(" (at %q)", line)
}

// credentialKey matches the names of keys whose values are credentials.
var credentialKey = regexp.MustCompile(`(?i)(secret|pass|token|credential|seed|key)`)

// Duration is a time.Duration written as "200ms", "5s" or "1h" in YAML.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML accepts Go duration strings; bare numbers are refused because
// "interval: 200" is ambiguous between milliseconds and seconds.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: duration must be a string like \"200ms\": %w", n.Line, err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration back in the same form.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// FieldError names the key that is wrong, so messages read "bus.url: ...".
type FieldError struct {
	Key string
	Err error
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// Errf builds a FieldError.
func Errf(key, format string, args ...any) error {
	return &FieldError{Key: key, Err: fmt.Errorf(format, args...)}
}

// Bounds are checked where a value enters, by these helpers, so every
// refusal names its key and the range the README documents for it.

// DurationIn refuses v outside [lo, hi].
func DurationIn(key string, v, lo, hi time.Duration) error {
	if v < lo || v > hi {
		return Errf(key, "must be between %v and %v, got %v", lo, hi, v)
	}
	return nil
}

// DurationOrZero is DurationIn for a key whose zero means "use the
// default" (or "off", as the README says); the default is filled later.
func DurationOrZero(key string, v, lo, hi time.Duration) error {
	if v == 0 {
		return nil
	}
	if v < lo || v > hi {
		return Errf(key, "must be 0 (default) or between %v and %v, got %v", lo, hi, v)
	}
	return nil
}

// Number is what IntIn bounds.
type Number interface {
	~int | ~int32 | ~int64 | ~uint | ~uint32 | ~uint64 | ~float64
}

// IntIn refuses v outside [lo, hi] (any integer or float kind).
func IntIn[T Number](key string, v, lo, hi T) error {
	if v != v || v < lo || v > hi { // v != v: NaN
		return Errf(key, "must be between %v and %v, got %v", lo, hi, v)
	}
	return nil
}

// CountIn bounds the length of a list or map.
func CountIn(key string, n, lo, hi int) error {
	if n < lo || n > hi {
		return Errf(key, "must list between %d and %d entries, got %d", lo, hi, n)
	}
	return nil
}

// HostPort requires host:port with a numeric port in 1..65535 (0 too when
// allowZero: "pick a free port", for tests and labs).
func HostPort(key, v string, allowZero bool) error {
	_, p, err := net.SplitHostPort(v)
	if err != nil {
		return Errf(key, "want host:port, got %q: %v", v, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || (n == 0 && !allowZero) {
		return Errf(key, "port %q must be a number in 1..65535", p)
	}
	return nil
}

// First returns the first non-nil error: keys are checked in file order
// and the first one wrong is the one to fix.
func First(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
