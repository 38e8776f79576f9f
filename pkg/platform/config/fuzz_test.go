package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type fuzzSection struct {
	Every Duration          `yaml:"every"`
	Names []string          `yaml:"names"`
	Map   map[string]string `yaml:"map"`
	Ptr   *int              `yaml:"ptr"`
}

type fuzzConfig struct {
	Name    string        `yaml:"name"`
	Count   int           `yaml:"count"`
	Share   float64       `yaml:"share"`
	On      *bool         `yaml:"on"`
	Timeout Duration      `yaml:"timeout"`
	Section fuzzSection   `yaml:"section"`
	List    []fuzzSection `yaml:"list"`
}

func (c *fuzzConfig) Validate() error {
	return Join(
		DurationIn("timeout", c.Timeout.D(), 0, 1<<40),
		IntIn("count", c.Count, -5, 5),
		IntIn("share", c.Share, 0, 1),
		CountIn("list", len(c.List), 0, 10),
	)
}

// FuzzParse: the strict loader must never panic, whatever the file holds
// (anchors, aliases, tags, deep nesting, durations that overflow), and
// what it accepts must survive a write and a second read.
// Run: go test -run '^$' -fuzz FuzzParse ./pkg/platform/config (or make fuzz).
func FuzzParse(f *testing.F) {
	f.Add([]byte("name: a\ncount: 2\nshare: 0.5\ntimeout: 200ms\nsection: {every: 1s, names: [a, b], map: {k: v}, ptr: 3}\nlist: [{every: 1h}]\n"))
	f.Add([]byte("timeout: 200\n"))
	f.Add([]byte("timeout: 9999999999999h\n"))
	f.Add([]byte("a: &x [*x, *x]\n"))
	f.Add([]byte("section: &s {every: 1s}\nlist: [*s, *s, *s]\n"))
	f.Add([]byte("count: !!float 1e400\n"))
	f.Add([]byte("on: yes\nnam: x\n"))
	f.Add([]byte("---\n---\nname: b\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// A hang is a finding too: crash the worker so the input is saved.
		hang := time.AfterFunc(5*time.Second, func() { panic(fmt.Sprintf("FuzzParse hangs on %q", b)) })
		defer hang.Stop()
		// The reading agrees with yaml.v3's own strict decoder: what it
		// reads without a mistake, yaml.v3 reads the same; what yaml.v3
		// reads, it does too, but for what yaml.v3 lets through without a
		// word (a fraction into a whole number, cut short; a key with no
		// name, dropped).
		var walked, strict fuzzConfig
		doc, ok := Decode("fuzz.yaml", b, &walked)
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		strictErr := dec.Decode(&strict)
		if errors.Is(strictErr, io.EOF) {
			strictErr = nil
		}
		read := ok && len(doc.read) == 0
		stricter := false
		for _, fe := range doc.read {
			stricter = stricter || strings.Contains(fe.Error(), "want a whole number") || strings.Contains(fe.Error(), "a key with no name")
		}
		switch {
		case read && strictErr != nil:
			t.Fatalf("read without a mistake, yaml.v3 refuses it: %v", strictErr)
		case !read && strictErr == nil && !stricter:
			_, err := doc.Report()
			t.Fatalf("yaml.v3 reads it, the reading refuses it: %v", err)
		case read && !reflect.DeepEqual(walked, strict):
			t.Fatalf("read as %+v, yaml.v3 reads %+v", walked, strict)
		}

		var c fuzzConfig
		if err := Parse("fuzz.yaml", b, &c); err != nil {
			return
		}
		out, err := yaml.Marshal(&c)
		if err != nil {
			t.Fatalf("accepted config does not marshal: %v", err)
		}
		var again fuzzConfig
		if err := Parse("again.yaml", out, &again); err != nil {
			t.Fatalf("accepted config refused after a round trip: %v\n%s", err, out)
		}
	})
}
