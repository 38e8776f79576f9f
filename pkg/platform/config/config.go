// Package config loads the YAML files every fan service reads, strictly:
// an unknown key, a malformed value or an unreadable file stops start-up with
// a message that names the file and the key.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
	return fmt.Sprintf(" (at %q)", strings.TrimSpace(lines[n-1]))
}

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
