package logtest_test

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/logtest"
)

func TestDuplicateKeys(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{`{"msg":"x","node":"ctl","node":"n1"}`, []string{"node"}},
		{`{"msg":"x","self":"ctl","node":"n1"}`, nil},
		{`{"msg":"x","g":{"a":1,"a":2},"a":3}`, []string{"g.a"}},
		{`{"msg":"x","l":[{"a":1,"a":2}]}`, []string{"l.a"}},
	} {
		got, err := logtest.DuplicateKeys([]byte(c.line))
		if err != nil {
			t.Fatalf("%s: %v", c.line, err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: duplicates %v, want %v", c.line, got, c.want)
		}
	}
	if _, err := logtest.DuplicateKeys([]byte(`{"msg":`)); err == nil {
		t.Error("a cut line was read as JSON")
	}
}

// slog's JSON handler writes a key given twice twice: the check is needed.
func TestSlogWritesDuplicates(t *testing.T) {
	var buf logtest.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).With("node", "ctl").Info("x", "node", "n1")
	dups, err := logtest.DuplicateKeys([]byte(buf.String()))
	if err != nil || !slices.Equal(dups, []string{"node"}) {
		t.Fatalf("duplicates %v (%v) in %s", dups, err, buf.String())
	}
}
