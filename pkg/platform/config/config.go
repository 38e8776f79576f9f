// Package config loads the YAML files every fan service reads, strictly:
// an unknown key, a malformed value or an unreadable file stops start-up.
// Every mistake in a file is reported at once, one per line, each with the
// file, the line and the key's path ("/etc/fan/prober.yaml:23:
// checks[1].timeout: ..."), in the configuration's words rather than Go's.
package config

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// Validator is implemented by config structs that check themselves after
// loading. Validate reports every error it finds (Join), not the first.
type Validator interface {
	Validate() error
}

// HostChecker is implemented by config structs that name things on the
// host they run on: credential and certificate files, directories, network
// interfaces. CheckHost checks them for what they are (a seed parses as a
// seed, a key matches its certificate, an interface exists). It is apart
// from Validate because a configuration is also validated where its paths
// are not the host's (tests, fanctl replay); Check runs both.
type HostChecker interface {
	CheckHost() error
}

// Load reads path into dst (a pointer to a struct with yaml tags). Unknown
// keys are errors: a misspelt "fall" silently ignored would mean a failover
// policy nobody asked for. dst's existing field values act as defaults.
// The error, if any, is an *Errors listing every mistake.
func Load(path string, dst any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return Parse(path, b, dst)
}

// Parse is Load for bytes already read; name is used in error messages.
func Parse(name string, b []byte, dst any) error {
	_, err := parse(name, b, dst, false)
	return err
}

// Check reads path the way -check-config does and a service starts: Load,
// then, when dst is a HostChecker, the checks of what the file names on
// this host. err (an *Errors) lists every error, each on its key's line;
// warnings are lines to print that refuse nothing (a certificate that
// expires within 30 days).
func Check(path string, dst any) (warnings []string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return CheckBytes(path, b, dst)
}

// CheckBytes is Check for bytes already read; name is used in messages.
func CheckBytes(name string, b []byte, dst any) (warnings []string, err error) {
	return parse(name, b, dst, true)
}

func parse(name string, b []byte, dst any, host bool) ([]string, error) {
	doc, ok := Decode(name, b, dst)
	if !ok {
		return doc.Report()
	}
	var errs []error
	if v, ok := dst.(Validator); ok {
		errs = append(errs, v.Validate())
	}
	if h, ok := dst.(HostChecker); ok && host {
		errs = append(errs, h.CheckHost())
	}
	return doc.Report(errs...)
}

// credentialKey matches the names of keys whose values are credentials:
// no message shows such a value.
var credentialKey = regexp.MustCompile(`(?i)(secret|pass|token|credential|seed|key)`)

// Duration is a time.Duration written as "200ms", "5s" or "1h" in YAML.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML accepts Go duration strings; bare numbers are refused because
// "interval: 200" is ambiguous between milliseconds and seconds. A refusal
// is a *yaml.TypeError, so the rest of the file is still read.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	refuse := func(format string, args ...any) error {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: ", n.Line) + fmt.Sprintf(format, args...)}}
	}
	switch n.Kind {
	case yaml.MappingNode:
		return refuse(`want a duration such as "200ms", "5s" or "1h", got a mapping`)
	case yaml.SequenceNode:
		return refuse(`want a duration such as "200ms", "5s" or "1h", got a list`)
	}
	if tag := n.ShortTag(); tag == "!!int" || tag == "!!float" {
		return refuse(`want a duration with its unit, such as "200ms" or "5s" (a bare number could mean either), got %s`, n.Value)
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return refuse(`want a duration such as "200ms", "5s" or "1h", got %q`, n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration back in the same form.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

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
