// Package configtest walks absurd values through a service's configuration
// loader: each must be refused with the offending key's name, and none may
// panic. Services call it from a table test with a valid file of their own.
package configtest

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/config"
	"go.yaml.in/yaml/v3"
)

// Case sets Key (a path like "bus.ping_interval" or "checks[0].timeout")
// to Value in the valid file; the loader must refuse it naming Want (Key
// when empty).
type Case struct {
	Key   string
	Value any
	Want  string
}

// Loader parses a file the way -check-config does (config.Parse into the
// service's Config).
type Loader func(b []byte) error

// Refuses checks that valid loads, then that every case is refused with a
// config.FieldError whose key is the case's (among every error the loader
// reports: a value out of range may also make a key that depends on it
// wrong).
func Refuses(t *testing.T, valid []byte, load Loader, cases []Case) {
	t.Helper()
	if err := safeLoad(load, valid); err != nil {
		t.Fatalf("the valid file is refused: %v", err)
	}
	for _, c := range cases {
		b, err := Set(valid, c.Key, c.Value)
		if err != nil {
			t.Fatalf("%s: %v", c.Key, err)
		}
		want := c.Want
		if want == "" {
			want = c.Key
		}
		err = safeLoad(load, b)
		keys := refusedKeys(err)
		switch {
		case err == nil:
			t.Errorf("%s: %v accepted", c.Key, c.Value)
		case len(keys) == 0:
			t.Errorf("%s: %v refused without a key: %v", c.Key, c.Value, err)
		case !slices.Contains(keys, want):
			t.Errorf("%s: %v refused naming %q, want %q: %v", c.Key, c.Value, keys, want, err)
		default:
			t.Logf("%s: %v -> %v", c.Key, c.Value, err)
		}
	}
}

// refusedKeys are the keys of every config.FieldError in err that is not a
// warning.
func refusedKeys(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		var fe *config.FieldError
		switch e := err.(type) {
		case nil:
		case *config.FieldError:
			if !e.Warning {
				out = append(out, e.Key)
			}
		case interface{ Unwrap() []error }:
			for _, c := range e.Unwrap() {
				walk(c)
			}
		default:
			if errors.As(err, &fe) && !fe.Warning {
				out = append(out, fe.Key)
			}
		}
	}
	walk(err)
	return out
}

// safeLoad turns a panic into an error: nothing a file says may crash.
func safeLoad(load Loader, b []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("PANIC: %v", r)
		}
	}()
	return load(b)
}

var step = regexp.MustCompile(`^([a-z_]+)(?:\[(\d+)\])?$`)

// Set returns src (YAML) with the value at path replaced (or added).
func Set(src []byte, path string, value any) ([]byte, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	parts := splitPath(path)
	var cur any = doc
	for i, p := range parts {
		m := step.FindStringSubmatch(p)
		if m == nil {
			return nil, fmt.Errorf("path %q: bad step %q", path, p)
		}
		obj, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("path %q: %q is not a mapping", path, p)
		}
		last := i == len(parts)-1
		if m[2] == "" {
			if last {
				obj[m[1]] = value
				break
			}
			next, ok := obj[m[1]]
			if !ok || next == nil {
				next = map[string]any{}
				obj[m[1]] = next
			}
			cur = next
			continue
		}
		list, ok := obj[m[1]].([]any)
		n, _ := strconv.Atoi(m[2])
		if !ok || n >= len(list) {
			return nil, fmt.Errorf("path %q: no %s", path, p)
		}
		if last {
			list[n] = value
			break
		}
		cur = list[n]
	}
	return yaml.Marshal(doc)
}

func splitPath(p string) []string {
	var out []string
	start := 0
	for i := 0; i < len(p); i++ {
		if p[i] == '.' {
			out = append(out, p[start:i])
			start = i + 1
		}
	}
	return append(out, p[start:])
}

// CommonCases are the absurd values of the keys every service shares
// (daemon.Common and the bus section).
func CommonCases() []Case {
	return []Case{
		{Key: "shutdown_timeout", Value: "-5s"},
		{Key: "shutdown_timeout", Value: "1000h"},
		{Key: "http_listen", Value: "nowhere"},
		{Key: "http_listen", Value: "127.0.0.1:70000"},
		{Key: "bus.ping_interval", Value: "-1s"},
		{Key: "bus.ping_interval", Value: "1000h"},
		{Key: "bus.events_max_age", Value: "-1h"},
		{Key: "bus.events_max_age", Value: "1ms"},
		{Key: "bus.replicas", Value: 7},
		{Key: "bus.replicas", Value: -1},
		{Key: "bus.url", Value: "nats://127.0.0.1:99999", Want: "bus.url[0]"},
		{Key: "node", Value: "a.b"},
		{Key: "cluster", Value: ""},
	}
}
