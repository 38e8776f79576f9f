package runbook

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

const doc = "# Operations\n" +
	"Intro with `inline runbook:nothing` code.\n" +
	"```sh runbook:env\n" +
	"export A=1\n" +
	"```\n" +
	"## Testing a failover\n" +
	"```sh\n" +
	"# a plain block is not runnable\n" +
	"## not a heading\n" +
	"```\n" +
	"  ~~~~ sh runbook:status   \n" +
	"  fanctl status\n" +
	"    indented more\n" +
	"  ```\n" +
	"  ~~~~~\n" +
	"## Replication safety valve ##\n" +
	"```yaml runbook:valve-share\n" +
	"safety:\n" +
	"  max_delete_share: 1\n" +
	"```\n" +
	"```sh runbook:empty\n" +
	"```\n"

func TestParse(t *testing.T) {
	d, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{Name: "env", Lang: "sh", Text: "export A=1\n", Line: 3},
		{Name: "status", Lang: "sh", Text: "fanctl status\n  indented more\n```\n", Line: 11, Section: "Testing a failover"},
		{Name: "valve-share", Lang: "yaml", Text: "safety:\n  max_delete_share: 1\n", Line: 17, Section: "Replication safety valve"},
		{Name: "empty", Lang: "sh", Line: 21, Section: "Replication safety valve"},
	}
	if got := d.Blocks(); !reflect.DeepEqual(got, want) {
		t.Fatalf("blocks:\n got %+v\nwant %+v", got, want)
	}
	b, err := d.Shell("status")
	if err != nil || b.Text != want[1].Text {
		t.Fatalf("Shell(status) = %+v, %v", b, err)
	}
	if _, err := d.Shell("valve-share"); !errors.Is(err, ErrNotRunnable) {
		t.Fatalf("Shell of a yaml block: %v, want ErrNotRunnable", err)
	}
	if _, err := d.Block("valve-share"); err != nil {
		t.Fatalf("Block of a yaml block: %v", err)
	}
	for _, name := range []string{"nothing", "Status", ""} {
		if _, err := d.Block(name); !errors.Is(err, ErrUnknown) {
			t.Fatalf("Block(%q): %v, want ErrUnknown", name, err)
		}
	}
	if got := d.Missing([]string{"env"}); !reflect.DeepEqual(got, []string{"status", "empty"}) {
		t.Fatalf("Missing (all sections) = %v", got)
	}
	if got := d.Missing(nil, "Testing a failover"); !reflect.DeepEqual(got, []string{"status"}) {
		t.Fatalf("Missing (one section) = %v", got)
	}
	if got := d.Missing([]string{"env", "status", "empty"}); got != nil {
		t.Fatalf("Missing after every shell block ran = %v", got)
	}
}

func TestParseErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		md   string
		want error
	}{
		"duplicate":      {"```sh runbook:a\nx\n```\n```sh runbook:a\ny\n```\n", ErrDuplicate},
		"duplicate-lang": {"```sh runbook:a\nx\n```\n```yaml runbook:a\ny: 1\n```\n", ErrDuplicate},
		"unclosed":       {"```sh runbook:a\nx\n", ErrMalformed},
		"short-close":    {"````sh runbook:a\nx\n```\n", ErrMalformed},
		"empty-name":     {"```sh runbook:\nx\n```\n", ErrMalformed},
		"bad-name":       {"```sh runbook:a/b\nx\n```\n", ErrMalformed},
		"two-names":      {"```sh runbook:a runbook:b\nx\n```\n", ErrMalformed},
		"no-lang":        {"```runbook:a\nx\n```\n", ErrMalformed},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(tc.md)); !errors.Is(err, tc.want) {
				t.Fatalf("Parse: %v, want %v", err, tc.want)
			}
		})
	}
	// A fence indented four spaces is an indented code block's text, and an
	// unclosed plain block swallows the rest without error (as in markdown).
	d, err := Parse([]byte("    ```sh runbook:a\n```sh\n```sh runbook:b\n"))
	if err != nil || len(d.Blocks()) != 0 {
		t.Fatalf("Parse: %+v, %v; want no blocks", d.Blocks(), err)
	}
}

func TestParseFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ops.md")
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := ParseFile(p)
	if err != nil || len(d.Blocks()) != 4 {
		t.Fatalf("ParseFile: %v, %v", d, err)
	}
	if _, err := ParseFile(filepath.Join(t.TempDir(), "absent.md")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ParseFile of a missing file: %v", err)
	}
	if err := os.WriteFile(p, []byte("```sh runbook:a\n```\n```sh runbook:a\n```\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseFile(p); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("ParseFile of a duplicate: %v", err)
	}
}
