package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

type probe struct {
	Name      string            `yaml:"name"`
	Kind      string            `yaml:"kind"`
	Rise      int               `yaml:"rise"`
	Fall      int               `yaml:"fall"`
	Interval  Duration          `yaml:"interval"`
	Timeout   Duration          `yaml:"timeout"`
	Secret    string            `yaml:"secret"`
	PassCount int               `yaml:"pass_count"`
	Codes     []string          `yaml:"codes"`
	Share     float64           `yaml:"share"`
	Port      uint16            `yaml:"port"`
	On        *bool             `yaml:"on"`
	Labels    map[string]string `yaml:"labels"`
}

type probeFile struct {
	Node   string  `yaml:"node"`
	URL    string  `yaml:"url"`
	Checks []probe `yaml:"checks"`
}

// Validate reports every error, as the services' Validate functions do.
func (c *probeFile) Validate() error {
	errs := []error{}
	if c.Node == "" {
		errs = append(errs, Errf("node", "required"))
	}
	if c.URL != "" {
		errs = append(errs, Errf("url[0]", "bad server %q", c.URL))
	}
	for i, ch := range c.Checks {
		key := func(k string) string { return fmt.Sprintf("checks[%d].%s", i, k) }
		errs = append(errs,
			IntIn(key("rise"), ch.Rise, 1, 10),
			IntIn(key("fall"), ch.Fall, 1, 10),
			DurationIn(key("timeout"), ch.Timeout.D(), 1e6, 1e10),
		)
		if ch.Kind == "" {
			errs = append(errs, Errf(key("kind"), "required"))
		}
	}
	return Join(errs...)
}

// A file with several mistakes is reported whole: every error on its own
// line, in the file's order, with the file, the line and the key's path;
// an error about a key whose value could not be read is not repeated by
// the checks after the read.
func TestEveryErrorWithLineAndKey(t *testing.T) {
	doc := `url: nats://x
checks:
  - name: ami
    kind: ami
    rsie: 2
    rise: two
    fall: 3
    timeout: 150ms
  - name: sip
    rise: 2
    fall: 0
    timeout: 0s
  - name: tcp
    kind: tcp
    rise: 2
    fall: 3
    timeout: 200
nod: n1
`
	var c probeFile
	err := Parse("/etc/fan/prober.yaml", []byte(doc), &c)
	want := strings.Join([]string{
		`/etc/fan/prober.yaml: node: required`,
		`/etc/fan/prober.yaml:1: url[0]: bad server "nats://x"`,
		`/etc/fan/prober.yaml:5: checks[0].rsie: unknown key; did you mean rise?`,
		`/etc/fan/prober.yaml:6: checks[0].rise: want a whole number, got "two"`,
		`/etc/fan/prober.yaml:9: checks[1].kind: required`,
		`/etc/fan/prober.yaml:11: checks[1].fall: must be between 1 and 10, got 0`,
		`/etc/fan/prober.yaml:12: checks[1].timeout: must be between 1ms and 10s, got 0s`,
		`/etc/fan/prober.yaml:17: checks[2].timeout: want a duration with its unit, such as "200ms" or "5s" (a bare number could mean either), got 200`,
		`/etc/fan/prober.yaml:18: nod: unknown key; did you mean node?`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
	var all *Errors
	if !errors.As(err, &all) || all.Len() != 9 || Count(err) != 9 {
		t.Fatalf("want an *Errors of 9, got %T %d", err, Count(err))
	}
	// The first FieldError is still found by errors.As, with its line.
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Key != "node" || fe.Line != 0 {
		t.Fatalf("first FieldError: %+v", fe)
	}
	if !errors.Is(err, ErrUnknownKey) {
		t.Fatal("an unknown key is ErrUnknownKey")
	}
	// What could be read was: the checks after the mistakes keep their
	// places and values.
	if len(c.Checks) != 3 || c.Checks[0].Fall != 3 || c.Checks[2].Kind != "tcp" || c.Checks[0].Rise != 0 {
		t.Fatalf("read %+v", c.Checks)
	}
}

// A type error says what the key wants in YAML's words, never a Go type.
func TestTypeErrorsInTheConfigurationsWords(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"rise: two", `checks[0].rise: want a whole number, got "two"`},
		{"rise: 2.5", `checks[0].rise: want a whole number, got 2.5`},
		{"rise: 99999999999999999999", `checks[0].rise: want a whole number from -9223372036854775808 to 9223372036854775807, got 99999999999999999999`},
		{"port: -1", `checks[0].port: want a whole number from 0 to 65535, got -1`},
		{"port: 70000", `checks[0].port: want a whole number from 0 to 65535, got 70000`},
		{"share: lots", `checks[0].share: want a number, got "lots"`},
		{"on: maybe", `checks[0].on: want true or false, got "maybe"`},
		{"interval: soon", `checks[0].interval: want a duration such as "200ms", "5s" or "1h", got "soon"`},
		{"interval: [1s]", `checks[0].interval: want a duration such as "200ms", "5s" or "1h", got a list`},
		{"codes: 2xx", `checks[0].codes: want a list ([a, b], or one "- item" per line), got "2xx"`},
		{"name: {a: b}", `checks[0].name: want a single value (text), got a mapping`},
		{"labels: [a, b]", `checks[0].labels: want a mapping (key: value), got a list`},
		{"secret: [hunter2]", `checks[0].secret: want a single value (text), got a list`},
		{"pass_count: hunter2", `checks[0].pass_count: want a whole number, got a value that is not shown (a credential)`},
	} {
		var c probeFile
		err := Parse("p.yaml", []byte("node: n1\nchecks:\n  - {kind: x, rise: 1, fall: 1, timeout: 1s}\n  - "+tc.doc+"\n"), &c)
		// The second item carries the mistake; its other errors (a
		// required kind) may follow, the mistake is on line 4.
		want := "p.yaml:4: " + strings.Replace(tc.want, "checks[0]", "checks[1]", 1)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s:\n got %v\nwant %s", tc.doc, err, want)
		}
		for _, goWords := range []string{"!!", "int64", "uint16", "unmarshal", "config.", "[]string"} {
			if err != nil && strings.Contains(err.Error(), goWords) {
				t.Errorf("%s: %q speaks Go: %v", tc.doc, goWords, err)
			}
		}
		if strings.Contains(fmt.Sprint(err), "hunter2") {
			t.Errorf("%s: a credential's value is shown: %v", tc.doc, err)
		}
	}
}

func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"rsie", "did you mean rise?"},
		{"intreval", "did you mean interval?"},
		{"Timeout", "did you mean timeout?"},
		{"secert", "did you mean secret?"},
		{"codez", "did you mean codes?"},
		{"frobnicate", "unknown key"},
	} {
		var c probeFile
		err := Parse("p.yaml", []byte("node: n1\nchecks:\n  - kind: x\n    "+tc.key+": 1\n"), &c)
		want := "p.yaml:4: checks[0]." + tc.key + ": unknown key"
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q ... %q", tc.key, err, want, tc.want)
		}
		if tc.want == "unknown key" && strings.Contains(err.Error(), "did you mean") {
			t.Errorf("%s: nothing is near it, yet: %v", tc.key, err)
		}
	}
	if got := nearest("rsie", []string{"rise", "fall"}); got != "rise" {
		t.Errorf("nearest(rsie) = %q", got)
	}
}

// What YAML itself refuses, and structures no field can take, are
// reported with their lines too, and nothing panics.
func TestStructuralMistakes(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"node: n1\nchecks: [\n", "p.yaml:2: not valid YAML: did not find expected node content"},
		{"- a\n- b\n", "p.yaml:1: want a mapping (key: value), got a list"},
		{"node: n1\nnode: n2\n", "p.yaml:2: node: given twice (first on line 1)"},
		{"node: n1\nchecks: {kind: x}\n", "p.yaml:2: checks: want a list"},
		{"node: n1\nchecks:\n  - just-a-name\n", `p.yaml:3: checks[0]: want a mapping (key: value), got "just-a-name"`},
		{"base: &b {kind: x, rise: 1, fall: 1, timeout: 1s}\nnode: n1\n", "p.yaml:1: base: unknown key"},
		{"node: n1\nchecks:\n  - <<: [1, 2]\n", "p.yaml:3: checks[0].<<: want a mapping or a list of mappings to merge"},
	} {
		var c probeFile
		err := Parse("p.yaml", []byte(tc.doc), &c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q:\n got %v\nwant %s", tc.doc, err, tc.want)
		}
	}
	// Merges and anchors read as yaml.v3 reads them.
	var c probeFile
	doc := "node: n1\nchecks:\n  - &ami {name: a, kind: ami, rise: 2, fall: 3, timeout: 1s}\n  - <<: *ami\n    name: b\n"
	if err := Parse("p.yaml", []byte(doc), &c); err != nil || len(c.Checks) != 2 || c.Checks[1].Name != "b" || c.Checks[1].Rise != 2 {
		t.Fatalf("merge: %v %+v", err, c.Checks)
	}
}

// Report places the errors of checks made after the read (Validate,
// CheckHost) on their keys' lines, or where SetFrom says a value came
// from; warnings come back apart and refuse nothing.
func TestReportPlacesErrors(t *testing.T) {
	var c probeFile
	doc, ok := Decode("n.yaml", []byte("node: n1\nchecks:\n  - name: a\n    timeout: 1s\n"), &c)
	if !ok {
		t.Fatal("not read")
	}
	doc.SetFrom("url", "flag -url")
	warnings, err := doc.Report(
		Errf("checks[0].timeout", "too long"),
		Join(Errf("url", "bad"), Warnf("checks[0].name", "expires soon")),
		Errf("checks[0].kind", "required"),
		errors.New("no key at all"),
	)
	want := "n.yaml: no key at all\nn.yaml:3: checks[0].kind: required\nn.yaml:4: checks[0].timeout: too long\nflag -url: url: bad"
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
	if len(warnings) != 1 || warnings[0] != "n.yaml:3: checks[0].name: expires soon" {
		t.Fatalf("warnings %q", warnings)
	}
	if _, err := doc.Report(Warnf("node", "only a warning")); err != nil {
		t.Fatalf("a warning alone refused: %v", err)
	}
}
