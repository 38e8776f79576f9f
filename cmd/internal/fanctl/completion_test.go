package fanctl_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// buildFanctl builds the fanctl binary the completion scripts call for
// names from the bus.
func buildFanctl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fanctl")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/fanpbx/fan/cmd/fanctl").CombinedOutput()
	if err != nil {
		t.Fatalf("go build fanctl: %v\n%s", err, out)
	}
	return bin
}

// completionFixture is a directory with the files and a directory the file
// flags complete, and a bus whose status names nodes n1, n2 of group pbx
// in cluster lab.
func completionFixture(t *testing.T) (dir, url string) {
	t.Helper()
	dir = t.TempDir()
	for _, f := range []string{"arbiter.yaml", "cluster.yaml", "page.token"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "fan-bus"), 0o700); err != nil {
		t.Fatal(err)
	}
	s := bustest.Server(t)
	putStatus(t, s, events.GroupStatus{Group: "pbx", UpdatedAt: time.Now(), Nodes: map[string]events.NodeStatus{"n1": {}, "n2": {}}})
	return dir, s.ClientURL()
}

// TestBashCompletion runs the generated script in a real bash with the
// real fanctl: files for file flags, directories for directory flags,
// event types, and nodes, groups and clusters from the bus (nothing, and
// at once, when the bus is not there); each command's flags are exactly
// its FlagSet's.
func TestBashCompletion(t *testing.T) {
	bin := buildFanctl(t)
	dir, url := completionFixture(t)
	code, script, errOut := run("completion", "bash")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	path := filepath.Join(t.TempDir(), "fanctl.bash")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) []string {
		t.Helper()
		var quoted []string
		for _, w := range append([]string{bin}, words...) {
			quoted = append(quoted, "'"+w+"'")
		}
		prog := "source " + path + "; COMP_WORDS=(" + strings.Join(quoted, " ") + "); COMP_CWORD=" + strconv.Itoa(len(words)) +
			"; _fanctl; printf '%s\\n' \"${COMPREPLY[@]}\""
		cmd := exec.Command("bash", "-c", prog)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		got := strings.Fields(string(out))
		sort.Strings(got)
		return got
	}
	is := func(what string, got []string, want ...string) {
		t.Helper()
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	has := func(what string, got []string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("%s: %v lacks %s", what, got, w)
			}
		}
	}
	is("--config arb<TAB>", complete("--config", "arb"), "arbiter.yaml")
	is("replay --arbiter-config <TAB>", complete("replay", "--arbiter-config", ""), "arbiter.yaml", "cluster.yaml", "fan-bus", "page.token")
	is("serve --token-file p<TAB>", complete("serve", "--token-file", "p"), "page.token")
	is("nats-config --out <TAB>", complete("nats-config", "--out", ""), "fan-bus")
	// bash splits --flag=value at the "=" (COMP_WORDBREAKS).
	is("nats-config --cluster-file=clu<TAB>", complete("nats-config", "--cluster-file", "=", "clu"), "cluster.yaml")
	is("install-host f<TAB>", complete("install-host", "f"), "fan-bus")
	is("events --type health.t<TAB>", complete("events", "--type", "health.t"), "health.transition")
	is("events --live --type node.<TAB>", complete("events", "--live", "--type", "node."), "node.heartbeat", "node.presence")
	is("help sw<TAB>", complete("help", "sw"), "switchover")
	is("completion <TAB> (words)", complete("completion", "z"), "zsh")
	// From the bus, with the connection flags on the line.
	is("node standby n<TAB>", complete("--url", url, "--cluster", "lab", "node", "standby", "n"), "n1", "n2")
	has("node standby <TAB>", complete("--url="+url, "node", "standby", ""), "n1", "n2", "--reason", "--within")
	is("switchover --to <TAB>", complete("--url", url, "switchover", "--to", ""), "n1", "n2")
	is("switchover --group <TAB>", complete("switchover", "--url", url, "--group", ""), "pbx")
	is("--cluster <TAB>", complete("--url", url, "--cluster", ""), "lab")
	// The bus not there: no names, and no wait beyond the script's own short timeout.
	start := time.Now()
	is("switchover --to <TAB> without a bus", complete("--url", "nats://127.0.0.1:1", "switchover", "--to", ""))
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("completing without a bus took %v", d)
	}
	// Each command's flags are its FlagSet's (and fanctl's own), no more.
	globals := complete("--")
	for cmd, flags := range fanctl.CommandFlags() {
		var want []string
		for _, f := range flags {
			want = append(want, "--"+f)
		}
		is(cmd+" --<TAB>", complete(cmd, "--"), append(want, globals...)...)
	}
	has("-- (global flags)", globals, "--config", "--url", "--cluster", "--timeout", "--operator")
	if slices.Contains(complete(""), "__complete") {
		t.Error("the hidden __complete is offered")
	}
	// Every global file flag completes files.
	for _, f := range []string{"--config", "--creds", "--nkey", "--tls-ca", "--tls-cert", "--tls-key"} {
		is(f+" c<TAB>", complete("status", f, "c"), "cluster.yaml")
	}
}

// TestZshCompletion runs the generated zsh script in a real zsh: the
// completion system's builtins (compadd, _files, compset, compdef) record
// what they are asked for, the script's own logic runs as it would on TAB.
func TestZshCompletion(t *testing.T) {
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		prereq.SkipOrFail(t, "zsh not installed (Debian package zsh)")
	}
	bin := buildFanctl(t)
	dir, url := completionFixture(t)
	_, script, _ := run("completion", "zsh")
	path := filepath.Join(t.TempDir(), "_fanctl")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	stubs := `compadd() { [[ $1 == -- ]] && shift; print -r -- "compadd $*"; }
_files() { print -r -- "_files $*"; }
compset() { print -r -- "compset $*"; }
compdef() { :; }
`
	complete := func(words ...string) string {
		t.Helper()
		var quoted []string
		for _, w := range append([]string{bin}, words...) {
			quoted = append(quoted, "'"+w+"'")
		}
		prog := stubs + "source " + path + "\nwords=(" + strings.Join(quoted, " ") + "); CURRENT=" + strconv.Itoa(len(words)+1) + "; _fanctl\n"
		cmd := exec.Command(zsh, "-f", "-c", prog)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("zsh: %v\n%s", err, out)
		}
		return string(out)
	}
	for _, c := range []struct {
		words []string
		want  []string
	}{
		{[]string{"sta"}, []string{"compadd ", " status ", " events "}},
		{[]string{"--config", ""}, []string{"_files \n"}},
		{[]string{"nats-config", "--out", ""}, []string{"_files -/"}},
		{[]string{"install-host", ""}, []string{"_files -/"}},
		{[]string{"events", "--type=health"}, []string{"compset -P *=", " health.transition "}},
		{[]string{"--url", url, "node", "standby", ""}, []string{" n1 n2 ", " --within "}},
		{[]string{"--url=" + url, "switchover", "--group", ""}, []string{"compadd pbx"}},
		{[]string{"maintenance", ""}, []string{" on off ", " --group "}},
	} {
		got := complete(c.words...)
		for _, w := range c.want {
			if !strings.Contains(got+" ", w) {
				t.Errorf("zsh %q: %q lacks %q", c.words, got, w)
			}
		}
	}
	if got := complete("--url", "nats://127.0.0.1:1", "switchover", "--to", ""); strings.TrimSpace(got) != "compadd" {
		t.Errorf("zsh switchover --to <TAB> without a bus: %q", got)
	}
	if out, err := exec.Command(zsh, "-n", path).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n: %v\n%s", err, out)
	}
	// The real completion system takes it both ways: from fpath (where the
	// package installs it, #compdef) and sourced after compinit.
	for _, prog := range []string{
		"fpath=(" + filepath.Dir(path) + " $fpath); autoload -Uz compinit; compinit -u -D; print -r -- ${_comps[fanctl]}",
		"autoload -Uz compinit; compinit -u -D; source " + path + "; print -r -- ${_comps[fanctl]}",
	} {
		out, err := exec.Command(zsh, "-f", "-c", prog).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "_fanctl" {
			t.Errorf("zsh %q: %v %q: fanctl does not complete with _fanctl", prog, err, out)
		}
	}
}
