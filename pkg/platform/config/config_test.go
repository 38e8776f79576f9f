package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type sample struct {
	Name     string   `yaml:"name"`
	Interval Duration `yaml:"interval"`
	Fall     int      `yaml:"fall"`
}

func (s *sample) Validate() error {
	if s.Fall < 1 {
		return Errf("fall", "must be at least 1, got %d", s.Fall)
	}
	return nil
}

func TestParse(t *testing.T) {
	s := sample{Fall: 3}
	if err := Parse("x.yaml", []byte("name: n1\ninterval: 200ms\n"), &s); err != nil {
		t.Fatal(err)
	}
	if s.Name != "n1" || s.Interval.D() != 200*time.Millisecond || s.Fall != 3 {
		t.Fatalf("got %+v (defaults must survive)", s)
	}
}

func TestParseErrorsNameFileAndKey(t *testing.T) {
	cases := map[string]string{
		"unknown key":     "name: n1\nfal: 3\n",
		"bare number":     "interval: 200\n",
		"bad duration":    "interval: soon\n",
		"validation fail": "fall: 0\n",
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			s := sample{Fall: 3}
			err := Parse("prober.yaml", []byte(doc), &s)
			if err == nil || !strings.Contains(err.Error(), "prober.yaml") {
				t.Fatalf("error %v must name the file", err)
			}
		})
	}
	s := sample{}
	err := Parse("p.yaml", []byte("fall: 0\n"), &s)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Key != "fall" {
		t.Fatalf("want a FieldError naming fall, got %v", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.yaml")
	err := Load(p, &sample{})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), p) {
		t.Fatalf("got %v", err)
	}
}

// A misspelt credential key is refused and named, but its value is not
// shown: -check-config's message ends up in the journal.
func TestErrorsDoNotQuoteCredentials(t *testing.T) {
	for _, line := range []string{"secert: hunter2", "passwd: hunter2", "api_token: hunter2", "nkey_seed_file: hunter2"} {
		var s sample
		err := Parse("x.yaml", []byte("name: n1\n"+line+"\n"), &s)
		key, _, _ := strings.Cut(line, ":")
		if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "x.yaml:2: "+key+": unknown key") {
			t.Errorf("%s: %v", line, err)
		}
	}
	var s sample
	if err := Parse("x.yaml", []byte("name: n1\ninterval: 200\n"), &s); err == nil || !strings.Contains(err.Error(), `x.yaml:2: interval: `) || !strings.Contains(err.Error(), "got 200") {
		t.Errorf("an ordinary key's value must still be shown: %v", err)
	}
}
