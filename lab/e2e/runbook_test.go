package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/runbook"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// opsDoc is the operator's runbook; TestRunbook runs its commands.
const opsDoc = "../../docs/operations.md"

// The lab has no systemd. A block's `systemctl` is this test binary under
// that name (TestMain), which asks the running test, over a unix socket, to
// act on the lab's processes of the host the block runs on.
const (
	systemctlSocketEnv = "FAN_LAB_SYSTEMCTL"
	labHostEnv         = "FAN_LAB_HOST"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(systemctlSocketEnv); sock != "" && filepath.Base(os.Args[0]) == "systemctl" {
		os.Exit(systemctlClient(sock, os.Getenv(labHostEnv), os.Args[1:]))
	}
	os.Exit(m.Run())
}

type systemctlRequest struct {
	Host string   `json:"host"`
	Args []string `json:"args"`
}

type systemctlReply struct {
	Output string `json:"output"`
	Code   int    `json:"code"`
}

func systemctlClient(sock, host string, args []string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "systemctl (lab):", err)
		return 1
	}
	defer c.Close()
	if err := json.NewEncoder(c).Encode(systemctlRequest{Host: host, Args: args}); err != nil {
		fmt.Fprintln(os.Stderr, "systemctl (lab):", err)
		return 1
	}
	var r systemctlReply
	if err := json.NewDecoder(c).Decode(&r); err != nil {
		fmt.Fprintln(os.Stderr, "systemctl (lab):", err)
		return 1
	}
	fmt.Print(r.Output)
	return r.Code
}

// runbookLab runs the runbook's blocks in a lab's hosts.
type runbookLab struct {
	t        *testing.T
	ctx      context.Context
	l        *netlab.Lab
	st       *stack.Stack
	doc      *runbook.Doc
	env      []string
	requests chan pendingSystemctl
	ran      []string
	// extra is added to the environment of the blocks run next (the
	// directories a section's variables name in the lab).
	extra []string
}

type pendingSystemctl struct {
	req   systemctlRequest
	reply chan systemctlReply
}

// TestRunbook runs the commands of docs/operations.md (every section but
// install, upgrade, rollback and uninstall, which the package test runs)
// against one secure lab, causing each situation the runbook answers and
// checking what it promises the commands show: last, the recoveries (the
// site directory backed up and restored, the audit trail restored into a
// bus that lost its store, a dead PBX host replaced). The move cap is one
// automatic move an hour, so the second failover freezes the group.
func TestRunbook(t *testing.T) {
	doc, err := runbook.ParseFile(opsDoc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, l, st, p := startLab(t, 4*time.Minute, stack.Options{SecureBus: true, MaxMovesPerHour: 1})
	r := &runbookLab{t: t, ctx: ctx, l: l, st: st, doc: doc, requests: make(chan pendingSystemctl)}
	r.serveSystemctl()
	answer := func(node string) {
		t.Helper()
		if _, err := st.WaitAnswer(ctx, p, node, 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	answer("n1")

	// What healthy looks like.
	r.until(ctl, "status", 20*time.Second, holder("n1"), health("n1", "up"), health("n2", "up"), lacksRE("FROZEN"))
	r.until(ctl, "events", 10*time.Second, has(`pbx PLACE \(none\)->n1`, `claim_ip on n1: applied`))
	vip := regexp.QuoteMeta(" " + l.FloatingIP().Addr().String() + "/")
	r.until("n1", "who-holds", 5*time.Second, has(vip))
	r.until("n2", "who-holds", 5*time.Second, has(`this host does not hold`), lacksRE(vip))

	// Testing a failover by hand.
	r.must("n1", "stop-pbx")
	answer("n2")
	r.until(ctl, "status", 10*time.Second, holder("n2"), health("n1", "down"))
	r.until(ctl, "explain-failover", 10*time.Second, has(`FAILOVER n1->n2`, `n1 asterisk\[self\] up->down`))
	r.must("n1", "start-pbx")
	r.until(ctl, "status", 20*time.Second, holder("n2"), health("n1", "up"),
		has(`preferred n1 is eligible again while n2 holds and is not down: failback needs a permit \(no failback window is open\)`))
	r.must(ctl, "windows")
	r.must(ctl, "switch-back")
	answer("n1")
	r.until(ctl, "status", 10*time.Second, holder("n1"))

	// Needs a human: frozen against flapping. The failover above used the
	// hour's one automatic move, so the next dead holder freezes the group.
	r.must("n1", "stop-pbx")
	r.until(ctl, "status", 20*time.Second, holder("n1"), health("n1", "down"), has(`pbx: FROZEN: group pbx is frozen \(1 automatic moves in the last hour, the most allowed\)`,
		`pbx: NEEDS A HUMAN: holder n1 reports asterisk down; group pbx is frozen .*: not replaced, a human must act`))
	r.until(ctl, "needs-human", 10*time.Second, has(`NEEDS A HUMAN: pbx HOLD \(holder n1\): holder n1 reports asterisk down.*frozen against flapping`))
	r.until(ctl, "flapping-transitions", 10*time.Second, has(`n1 asterisk\[self\] up->down`, `n1 asterisk\[self\] down->up`))
	r.must(ctl, "unfreeze")
	answer("n2")
	r.until(ctl, "status", 10*time.Second, holder("n2"), lacksRE("FROZEN"))
	r.must("n1", "start-pbx")
	r.until(ctl, "status", 20*time.Second, health("n1", "up"))

	// Needs a human: holder down while frozen (maintenance).
	r.must(ctl, "maintenance-on")
	r.must("n2", "stop-pbx")
	r.until(ctl, "status", 20*time.Second, holder("n2"), health("n2", "down"),
		has(`pbx: FROZEN: group pbx is in maintenance`, `holder n2 reports asterisk down.*not replaced, a human must act`))
	r.until(ctl, "needs-human", 10*time.Second, has(`NEEDS A HUMAN: .*holder n2 reports asterisk down.*is in maintenance`))
	r.until("n2", "who-holds", 5*time.Second, has(vip))
	r.must(ctl, "unfreeze-failover")
	answer("n1")
	r.until(ctl, "status", 10*time.Second, holder("n1"), lacksRE("FROZEN"))
	r.until(ctl, "maintenance-off-cluster", 5*time.Second, has(`cluster maintenance already off`))
	r.must("n2", "start-pbx")
	r.until(ctl, "status", 20*time.Second, health("n2", "up"))

	// Not frozen, but no node can take the group: both PBXs down.
	r.must("n2", "stop-pbx")
	r.until(ctl, "status", 20*time.Second, health("n2", "down"))
	r.must("n1", "stop-pbx")
	r.until(ctl, "status", 20*time.Second, holder("n1"), health("n1", "down"), lacksRE("FROZEN"), lacksRE("NEEDS A HUMAN"),
		has(`holder n1 reports asterisk down; no other eligible node \(n2 asterisk down\)`))
	r.must("n1", "start-pbx")
	answer("n1")
	r.must("n2", "start-pbx")
	r.until(ctl, "status", 20*time.Second, holder("n1"), health("n1", "up"), health("n2", "up"))

	r.safetyValve()

	// Needs a human: no holder while frozen. The arbiter finds its state
	// record corrupt and a group status without a holder: it rebuilds its
	// view frozen, while n1 still has the address.
	r.corruptArbiterState()
	r.until(ctl, "status", 20*time.Second, holder(`\(none\)`),
		has(`pbx: FROZEN: group pbx is in maintenance \(arbiter state was corrupt and rebuilt from group status; no known holder: check the group, then unfreeze it\)`))
	r.until(ctl, "needs-human", 10*time.Second,
		has(`NEEDS A HUMAN: pbx HOLD \(no holder\): no holder, and group pbx is in maintenance \(arbiter state was corrupt`))
	r.until("n1", "who-holds", 5*time.Second, has(vip))
	r.until("n2", "who-holds", 5*time.Second, has(`this host does not hold`))
	r.must(ctl, "unfreeze")
	r.until(ctl, "status", 20*time.Second, holder("n1"), lacksRE("FROZEN"))
	answer("n1")

	// Taking a PBX host out of service and back.
	r.must(ctl, "host-out")
	answer("n2")
	r.until(ctl, "status", 10*time.Second, holder("n2"), has(`pbx: n1 is in standby`))
	r.must(ctl, "host-back")
	r.until(ctl, "status", 10*time.Second, holder("n2"), lacksRE(`standby`),
		has(`preferred n1 is eligible again while n2 holds and is not down: failback needs a permit`))

	r.siteDir()
	r.rebuildBus(answer)
	r.replaceHost()

	if missing := doc.Missing(r.ran, "Before you start", "What healthy looks like", "Testing a failover by hand",
		"Taking a PBX host out of service", "Needs a human", "Replication safety valve tripped",
		"Backing up the site directory and its CA", "Backing up the audit trail, and losing every NATS server",
		"Replacing a dead PBX host"); len(missing) > 0 {
		t.Errorf("blocks of docs/operations.md no test ran: %v", missing)
	}
}

// safetyValve: n1 holds and replicates its voicemail to n2; most of it is
// deleted on n1, so n2's replicator refuses the pass. The runbook's "on
// purpose" path lets it through and closes the valve again.
func (r *runbookLab) safetyValve() {
	t := r.t
	src, dst := r.st.ReplicatorTree("n1", "voicemail"), r.st.ReplicatorTree("n2", "voicemail")
	// The messages that go are in a folder of their own, which leaves the
	// tree in one rename: removed one by one, a pass could see the first
	// deletion alone (within allow_deletes, so applied) before the valve
	// trips on the rest, and n2 would rightly lose that one.
	inbox, old := filepath.Join(src, "default", "1000", "INBOX"), filepath.Join(src, "default", "1000", "Old")
	for _, d := range []string{inbox, old} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Every file lands whole, as Asterisk's do (it records into tmp/,
	// which is excluded, and moves the message into place): a file the
	// holder scans half written and then serves whole no longer has the
	// hash its manifest names, so n2 would rightly report it missing once.
	tmp := filepath.Join(src, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	place := func(dir, name string, data []byte) {
		t.Helper()
		staged := filepath.Join(tmp, name)
		if err := os.WriteFile(staged, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(staged, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// A recording larger than the lab's store_pass_mib (1 MiB): n1 serves
	// it to n2 directly, through the generated permissions and TLS of the
	// secure bus, instead of storing it. Were n1's answer refused, n2 would
	// report it missing and n1 would store it (checked below).
	recording := make([]byte, 3<<20+5)
	if _, err := rand.Read(recording); err != nil {
		t.Fatal(err)
	}
	place(inbox, "msg9000.wav", recording)
	const texts, keptTexts = 10, 2
	const files, kept = texts + 1, keptTexts + 1 // and the recording, which stays
	for i := range texts {
		dir := inbox
		if i >= keptTexts {
			dir = old
		}
		place(dir, fmt.Sprintf("msg%04d.txt", i), []byte(fmt.Sprintf("message %d\n", i)))
	}
	r.until(ctl, "repl-status", 30*time.Second, lastLine(`n1->n2 voicemail `, `caught_up=true`))
	waitFiles(t, dst, files)
	if got, err := os.ReadFile(filepath.Join(dst, "default", "1000", "INBOX", "msg9000.wav")); err != nil || !bytes.Equal(got, recording) {
		t.Fatalf("the recording served directly arrived as %d bytes (%v), want n1's %d", len(got), err, len(recording))
	}
	// Had n1 not answered (a permission refused, say), n2 would have
	// confirmed a pass with the recording missing first, and n1 stored it.
	if out := r.fanctl(ctl, "events --since 1h --type replication.applied --json"); strings.Contains(out, `"missing":`) {
		t.Fatalf("n2 lacked contents it should have had from n1 directly:\n%s", out)
	}
	gone := filepath.Join(filepath.Dir(src), "voicemail-removed")
	if err := os.Rename(old, gone); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(gone) })
	r.until(ctl, "valve-alarm", 30*time.Second, has(`"node":"n2"`, `"tree":"voicemail"`, `"reason":"safety_valve"`, `"deletes":\d+,"target_files":\d+,`))
	r.until(ctl, "repl-status", 20*time.Second, lastLine(`n1->n2 voicemail `, `caught_up=false`))
	if n := countFiles(t, dst); n != files {
		t.Fatalf("n2 applied part of a pass its safety valve refused: %d files, want %d", n, files)
	}

	// On purpose: open the valve on the standby, restart, watch it catch up.
	cfg := r.st.ConfigPath("n2", "replicator")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	share, err := r.doc.Block("valve-share")
	if err != nil {
		t.Fatal(err)
	}
	r.ran = append(r.ran, share.Name)
	// The lab's file has no safety section; the shipped example's is replaced.
	if err := os.WriteFile(cfg, append(append([]byte(nil), orig...), share.Text...), 0o644); err != nil {
		t.Fatal(err)
	}
	r.must("n2", "valve-restart")
	waitFiles(t, dst, kept)
	r.until(ctl, "repl-status", 30*time.Second, lastLine(`n1->n2 voicemail `, `caught_up=true`))
	// And close it again.
	if err := os.WriteFile(cfg, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	r.must("n2", "valve-restart")
}

// corruptArbiterState stops the arbiter, overwrites its state record with
// garbage and the group's status with one that names no holder (with the
// arbiter's own credentials), and starts it again.
func (r *runbookLab) corruptArbiterState() {
	t := r.t
	if err := r.st.Proc(ctl, "fan-arbiter").Stop(); err != nil {
		t.Fatal(err)
	}
	nc, js, err := r.st.ConnectAs(ctl, "arbiter")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, events.StateBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.ArbiterStateKey("lab"), []byte("{corrupt")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.GroupStatusKey("lab", "pbx"), []byte(`{"group":"pbx","addresses":[],"epoch":0,"nodes":{},"updated_at":"2026-01-01T00:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	if err := r.st.RestartService(r.ctx, ctl, "fan-arbiter"); err != nil {
		t.Fatal(err)
	}
}

const ctl = netlab.ControlHost

// serveSystemctl listens for the lab's systemctl and puts it on the
// blocks' PATH with fan's binaries.
func (r *runbookLab) serveSystemctl() {
	t := r.t
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(dir, "systemctl")); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "systemctl.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.answerSystemctl(c)
		}
	}()
	bin := stack.BinDirForTest(t)
	r.env = []string{
		"PATH=" + dir + ":" + bin + ":" + os.Getenv("PATH"),
		systemctlSocketEnv + "=" + sock,
		"FANCTL_CONFIG=" + r.st.FanctlConfig(stack.LabOperator),
		"GROUP=pbx", "PBX_A=n1", "PBX_B=n2", "VIP=" + r.l.FloatingIP().Addr().String(),
	}
}

// answerSystemctl hands one request to the test's goroutine (run), which
// alone touches the stack.
func (r *runbookLab) answerSystemctl(c net.Conn) {
	defer c.Close()
	var req systemctlRequest
	if err := json.NewDecoder(c).Decode(&req); err != nil {
		return
	}
	p := pendingSystemctl{req: req, reply: make(chan systemctlReply, 1)}
	select {
	case r.requests <- p:
	case <-r.ctx.Done():
		return
	}
	_ = json.NewEncoder(c).Encode(<-p.reply)
}

// systemctl does what the lab can of what a block asked systemd for:
// stop|start asterisk (the stand-in PBX), and start, stop, restart, enable
// --now and is-enabled of fan's units, which act on the lab's processes of
// the host. A unit the lab does not run on that host (its bus is one
// server on ctl; its PBX hosts run no arbiter) is said so and skipped.
func (r *runbookLab) systemctl(q systemctlRequest) systemctlReply {
	args := q.Args
	quiet := len(args) > 0 && args[0] == "--quiet"
	if quiet {
		args = args[1:]
	}
	if len(args) >= 2 && args[0] == "enable" && args[1] == "--now" {
		args = append([]string{"start"}, args[2:]...)
	}
	var out strings.Builder
	var err error
	switch a := strings.Join(args, " "); {
	case a == "stop asterisk":
		err = r.st.KillPBX(r.ctx, q.Host)
	case a == "start asterisk":
		err = r.st.ThawPBX(r.ctx, q.Host)
	case len(args) == 2 && args[0] == "is-enabled":
		if r.st.Proc(q.Host, args[1]) == nil {
			if !quiet {
				out.WriteString("disabled\n")
			}
			return systemctlReply{Output: out.String(), Code: 1}
		}
		if !quiet {
			out.WriteString("enabled\n")
		}
	case len(args) >= 2 && slices.Contains([]string{"start", "stop", "restart"}, args[0]):
		for _, unit := range args[1:] {
			if err = r.unit(q.Host, args[0], unit, &out); err != nil {
				break
			}
		}
	default:
		err = errors.New("the lab knows only stop|start asterisk, start|stop|restart|enable --now|is-enabled fan-<service>")
	}
	if err != nil {
		fmt.Fprintf(&out, "systemctl %s (lab, %s): %v\n", strings.Join(q.Args, " "), q.Host, err)
		return systemctlReply{Output: out.String(), Code: 1}
	}
	return systemctlReply{Output: out.String()}
}

// unit starts, stops or restarts one of fan's units on host.
func (r *runbookLab) unit(host, verb, unit string, out *strings.Builder) error {
	if !strings.HasPrefix(unit, "fan-") {
		return fmt.Errorf("%s: not a unit of fan's", unit)
	}
	p := r.st.Proc(host, unit)
	if p == nil {
		fmt.Fprintf(out, "systemctl (lab): %s does not run on %s in this lab\n", unit, host)
		return nil
	}
	switch verb {
	case "stop":
		return p.Stop()
	case "restart":
		return r.st.Restart(host, unit)
	}
	if !p.Exited() {
		return nil
	}
	// On a PBX host this starts whatever of the host is not running, as
	// a machine that boots does.
	return r.st.RestartService(r.ctx, host, unit)
}

// run runs block name on host after the env block, as an operator's shell
// would, with the lab's values for the runbook's variables.
func (r *runbookLab) run(host, name string) (string, error) {
	r.t.Helper()
	env, err := r.doc.Shell("env")
	if err != nil {
		r.t.Fatal(err)
	}
	b, err := r.doc.Shell(name)
	if err != nil {
		r.t.Fatal(err)
	}
	r.ran = append(r.ran, env.Name, b.Name)
	argv := append([]string{"env"}, r.env...)
	argv = append(argv, r.extra...)
	argv = append(argv, labHostEnv+"="+host, "REPLICATOR_CONFIG="+r.st.ConfigPath(host, "replicator"),
		"IPMOVER_STATE="+r.ipmoverState(host), "bash", "-euo", "pipefail", "-c", env.Text+b.Text)
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := r.l.Exec(r.ctx, host, argv...)
		done <- result{out, err}
	}()
	for {
		select {
		case res := <-done:
			return string(res.out), res.err
		case p := <-r.requests:
			p.reply <- r.systemctl(p.req)
		}
	}
}

// fanctl runs one fanctl command on host with the runbook's environment,
// for what the test checks beyond the runbook's own blocks.
func (r *runbookLab) fanctl(host, args string) string {
	r.t.Helper()
	env, err := r.doc.Shell("env")
	if err != nil {
		r.t.Fatal(err)
	}
	argv := append([]string{"env"}, r.env...)
	argv = append(argv, labHostEnv+"="+host, "bash", "-euo", "pipefail", "-c", env.Text+"fanctl "+args)
	out, err := r.l.Exec(r.ctx, host, argv...)
	if err != nil {
		r.t.Fatalf("fanctl %s on %s: %v\n%s", args, host, err, out)
	}
	return string(out)
}

// must runs a block that must succeed.
func (r *runbookLab) must(host, name string) string {
	r.t.Helper()
	out, err := r.run(host, name)
	if err != nil {
		r.t.Fatalf("block %s on %s: %v\n%s", name, host, err, out)
	}
	r.t.Logf("block %s on %s:\n%s", name, host, out)
	return out
}

// until runs a block until it succeeds and its output passes every check.
func (r *runbookLab) until(host, name string, within time.Duration, checks ...func(string) error) string {
	r.t.Helper()
	var out string
	waittest.Succeeds(r.t, within, fmt.Sprintf("block %s on %s", name, host), func() error {
		var err error
		out, err = r.run(host, name)
		if err == nil {
			for _, c := range checks {
				if err = c(out); err != nil {
					break
				}
			}
		}
		if err != nil && r.ctx.Err() != nil {
			r.t.Fatalf("block %s on %s: %v (%v)\n%s", name, host, err, r.ctx.Err(), out)
		}
		if err != nil {
			return fmt.Errorf("%w\n%s", err, out)
		}
		return nil
	})
	r.t.Logf("block %s on %s:\n%s", name, host, out)
	return out
}

// has requires every pattern to match the output.
func has(patterns ...string) func(string) error {
	return func(out string) error {
		for _, p := range patterns {
			if !regexp.MustCompile(p).MatchString(out) {
				return fmt.Errorf("output lacks %q", p)
			}
		}
		return nil
	}
}

// lacksRE requires the pattern not to match the output.
func lacksRE(pattern string) func(string) error {
	return func(out string) error {
		if regexp.MustCompile(pattern).MatchString(out) {
			return fmt.Errorf("output matches %q", pattern)
		}
		return nil
	}
}

// holder requires fanctl status's group table to show node holding pbx.
func holder(node string) func(string) error {
	return has(`(?m)^pbx\s+\S+\s+` + node + `\s+\d+\s`)
}

// health requires fanctl status's node table to show node with health h.
func health(node, h string) func(string) error {
	return has(`(?m)^pbx\s+` + node + `\s+\d+\s+` + h + `\s`)
}

// lastLine requires the last line containing key to contain want.
func lastLine(key, want string) func(string) error {
	return func(out string) error {
		last := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, key) {
				last = l
			}
		}
		if !strings.Contains(last, want) {
			return fmt.Errorf("last line with %q is %q, want %q in it", key, last, want)
		}
		return nil
	}
}

func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return n
}

func waitFiles(t *testing.T, dir string, want int) {
	t.Helper()
	waittest.Succeeds(t, 30*time.Second, fmt.Sprintf("%d files in %s", want, dir), func() error {
		if n := countFiles(t, dir); n != want {
			return fmt.Errorf("it holds %d", n)
		}
		return nil
	})
}

// ipmoverState is the ipmover's state_file on host, as its configuration
// names it ("" where no ipmover runs).
func (r *runbookLab) ipmoverState(host string) string {
	b, err := os.ReadFile(r.st.ConfigPath(host, "ipmover"))
	if err != nil {
		return ""
	}
	m := regexp.MustCompile(`(?m)^state_file:\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// labSite is a site file for the lab's hosts, for the blocks about the
// directory fanctl init writes (the lab's bus itself is made by fanctl
// nats-config from the stack).
const labSite = `cluster: lab
hosts:
  - {name: n1, role: pbx, address: 198.51.100.11, interface: eth0}
  - {name: n2, role: pbx, address: 198.51.100.12, interface: eth0}
  - {name: ctl, role: witness, address: 198.51.100.2}
groups:
  - name: pbx
    addresses: [198.51.100.10/24]
    nodes: [n1, n2]
people:
  operators: [alice]
`

// siteDir: the admin's directory (what fanctl init wrote) is backed up,
// lost, and restored on a "new machine": the same CA, every file byte for
// byte, and fanctl init run on it finds every host unchanged. Without it,
// fanctl init starts a new CA and every host needs a new bundle, as the
// runbook says.
func (r *runbookLab) siteDir() {
	t := r.t
	base := t.TempDir()
	fanctl := filepath.Join(stack.BinDirForTest(t), "fanctl")
	siteFile := filepath.Join(base, "site.yaml")
	if err := os.WriteFile(siteFile, []byte(labSite), 0o600); err != nil {
		t.Fatal(err)
	}
	site := filepath.Join(base, "admin", "fan-site")
	if out, err := exec.Command(fanctl, "init", "--site", siteFile, "--out", site).CombinedOutput(); err != nil {
		t.Fatalf("fanctl init: %v\n%s", err, out)
	}
	backups := filepath.Join(base, "backups")
	r.extra = []string{"SITE_DIR=" + site, "BACKUP_DIR=" + backups}
	defer func() { r.extra = nil }()
	out := r.must(ctl, "backup-site")
	seeds := 0
	_ = filepath.WalkDir(site, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".nk") {
			seeds++
		}
		return err
	})
	if err := has(fmt.Sprintf(`(?m)^%d$`, seeds))(out); err != nil || seeds == 0 {
		t.Fatalf("backup-site does not count the %d seeds: %v", seeds, err)
	}
	digest := regexp.MustCompile(`(?m)^([0-9a-f]{64})  \S+/bus/ca/ca.pem$`).FindStringSubmatch(out)
	if digest == nil {
		t.Fatalf("backup-site printed no CA digest:\n%s", out)
	}
	// The old machine's copy, to compare with what the restore brings back.
	orig := filepath.Join(base, "orig")
	if out, err := exec.Command("cp", "-a", site, orig).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if err := os.RemoveAll(filepath.Dir(site)); err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(base, "new-admin", "fan-site")
	r.extra = []string{"SITE_DIR=" + restored, "BACKUP_DIR=" + backups}
	out = r.must(ctl, "restore-site")
	if err := has(regexp.QuoteMeta(digest[1]), `(?m)^\s+n1\s+unchanged$`, `(?m)^\s+n2\s+unchanged$`, `(?m)^\s+ctl\s+unchanged$`,
		`no host needs a new bundle`)(out); err != nil {
		t.Fatalf("restore-site: %v\n%s", err, out)
	}
	sameTree(t, orig, restored)
	sameTree(t, restored, orig)

	// Without the backup: a new CA, and every host needs a new bundle.
	lost := filepath.Join(base, "lost", "fan-site")
	b, err := exec.Command(fanctl, "init", "--site", siteFile, "--out", lost).CombinedOutput()
	if err != nil {
		t.Fatalf("fanctl init: %v\n%s", err, b)
	}
	ca, err := os.ReadFile(filepath.Join(lost, "bus", "ca", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if old, _ := os.ReadFile(filepath.Join(orig, "bus", "ca", "ca.pem")); bytes.Equal(ca, old) {
		t.Fatal("fanctl init into an empty directory kept the lost CA")
	}
	if err := has(`hosts that need the new bundle: n1 n2 ctl`)(string(b)); err != nil {
		t.Fatalf("a new CA does not re-key every host: %v\n%s", err, b)
	}
}

// rebuildBus: the audit trail is backed up, then the bus loses its store
// (the lab's one server stands for all three). The runbook's steps make it
// again with the trail: every record from before is back with its id and
// time, a decision from before still explains, the arbiter places the
// group anew and the trail goes on recording commands.
func (r *runbookLab) rebuildBus(answer func(string)) {
	t := r.t
	r.extra = []string{"BACKUP_DIR=" + t.TempDir(), "ADMIN_CONFIG=" + r.st.FanctlConfig(stack.LabAdmin), "REPLICAS=1"}
	defer func() { r.extra = nil }()
	before, err := r.st.Events(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) == 0 {
		t.Fatal("no trail to back up")
	}
	places := 0
	for _, e := range before {
		if d, ok := e.Payload.(*events.ArbiterDecision); ok && d.Action == events.ActionPlace {
			places++
		}
	}
	// The runbook restarts the host that does not hold the address first.
	holderNow, other := "n1", "n2"
	if gs, err := r.st.Status(r.ctx); err == nil && len(gs) == 1 && gs[0].Holder == "n2" {
		holderNow, other = "n2", "n1"
	}
	backedUp := r.must(ctl, "backup-trail")
	m := regexp.MustCompile(`FAN_EVENTS: (\d+) messages, sequences (\d+)\.\.(\d+),`).FindStringSubmatch(backedUp)
	if m == nil {
		t.Fatalf("backup-trail:\n%s", backedUp)
	}

	r.must(ctl, "rebuild-stop-arbiter")
	// Every server's store is lost, and each is started again empty.
	lost := time.Now()
	if err := r.st.KillNATS(ctl); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(r.st.NATSStore(ctl)); err != nil {
		t.Fatal(err)
	}
	r.must(ctl, "rebuild-start-nats")
	out := r.must(ctl, "restore-trail")
	if err := has(fmt.Sprintf(`FAN_EVENTS restored: %s messages, sequences %s\.\.%s,`, m[1], m[2], m[3]))(out); err != nil {
		t.Fatal(err)
	}
	// A second restore is refused: the audit stream is never replaced.
	if out, err := r.run(ctl, "restore-trail"); err == nil || !strings.Contains(out, "FAN_EVENTS exists on this bus") {
		t.Fatalf("a restore over the existing audit stream was not refused (%v):\n%s", err, out)
	}
	r.must(other, "rebuild-restart-pbx")
	r.must(holderNow, "rebuild-restart-pbx")
	r.must(ctl, "rebuild-start-witness")
	answer("n1")
	r.until(ctl, "status", 30*time.Second, holder("n1"), health("n1", "up"), health("n2", "up"))

	after, err := r.st.Events(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]time.Time{}
	for _, e := range after {
		stored[e.Env.ID] = e.Env.Time
	}
	for _, e := range before {
		if _, ok := stored[e.Env.ID]; !ok {
			t.Fatalf("%s %s (id %s) is not in the restored trail", e.Env.Type, e.Env.Time.Format(time.RFC3339Nano), e.Env.ID)
		}
	}
	// The records keep the times they were stored at, which the stream's
	// age limit counts from.
	r.checkStoredBefore(lost)
	r.until(ctl, "restored-trail", 10*time.Second, func(out string) error {
		if n := len(regexp.MustCompile(` PLACE `).FindAllString(out, -1)); n != places+1 {
			return fmt.Errorf("%d placements, want the %d restored and the new bus's", n, places)
		}
		return has(`FAILOVER n1->n2`)(out)
	}, lastLine(` PLACE `, `PLACE (none)->n1`))
	r.until(ctl, "explain-restored", 10*time.Second, has(`arbiter.decision .* FAILOVER n1->n2`, `n1 asterisk\[self\] up->down`))
	// The restored stream sources the new command stream: the new
	// placement's claim is in the trail.
	claim := "claim " + r.l.FloatingIP().String() + " on n1"
	waittest.Succeeds(t, 30*time.Second, "the new bus's claim ("+claim+") in the audit trail", func() error {
		out := r.fanctl(ctl, "events --since "+time.Since(lost).Round(time.Second).String()+" --type command.claim_ip")
		if !strings.Contains(out, claim) {
			return fmt.Errorf("trail:\n%s", out)
		}
		return nil
	})
}

// checkStoredBefore requires the audit stream's first record to carry the
// time it was first stored, before t.
func (r *runbookLab) checkStoredBefore(t0 time.Time) {
	t := r.t
	nc, js, err := r.st.ConnectAs(ctl, "arbiter")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetMsg(ctx, info.State.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	if !msg.Time.Before(t0) {
		t.Fatalf("the restored stream's first record is stamped %v, after the loss at %v", msg.Time, t0)
	}
}

// replaceHost: n2 dies for good; a new machine with its name, address and
// files but none of its state takes its place, in standby until the
// holder's trees are on it, then back in service as a healthy standby.
func (r *runbookLab) replaceHost() {
	t := r.t
	if _, err := r.st.Lab.KillAll("n2"); err != nil {
		t.Fatal(err)
	}
	r.until(ctl, "status", 10*time.Second, holder("n1"), silent("n2", true))
	r.must(ctl, "replace-standby")
	// The new machine: nothing of the old one's state (trees, the
	// replicator's and the ipmover's records).
	for _, p := range []string{filepath.Dir(r.st.ReplicatorTree("n2", "voicemail")), r.ipmoverState("n2")} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	// Install, step 3 on the new machine: its NATS server (none in this
	// lab: the bus is one server on ctl) and its services start.
	started := time.Now()
	if err := r.st.StartNode(r.ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	r.until(ctl, "replace-status", 30*time.Second, holder("n1"), health("n2", "up"), silent("n2", false), has(`pbx: n2 is in standby`))
	r.until(ctl, "replace-trail", 10*time.Second, hasSince(started, `prober on n2 started`, `ipmover on n2 started`, `replicator on n2 started`,
		`n2 asterisk\[self\] unknown->up`))
	for _, tree := range []string{"asterisk-etc", "voicemail"} {
		src, dst := r.st.ReplicatorTree("n1", tree), r.st.ReplicatorTree("n2", tree)
		waitFiles(t, dst, countFiles(t, src))
		sameTree(t, src, dst)
	}
	r.until(ctl, "replace-caught-up", 30*time.Second, lastLineSince(`n1->n2 asterisk-etc `, `caught_up=true`, started),
		lastLineSince(`n1->n2 voicemail `, `caught_up=true`, started))
	r.must(ctl, "replace-active")
	r.until(ctl, "status", 10*time.Second, holder("n1"), health("n2", "up"), silent("n2", false), lacksRE(`standby`))
	gs, err := r.st.Status(r.ctx)
	if err != nil || len(gs) != 1 {
		t.Fatalf("status: %v %v", gs, err)
	}
	if n := gs[0].Nodes["n2"]; !n.Eligible || n.Standby {
		t.Fatalf("the replaced host is not an eligible standby: %+v", n)
	}
}

// silent requires fanctl status's node table to show node silent or not.
func silent(node string, is bool) func(string) error {
	return has(fmt.Sprintf(`(?m)^pbx\s+%s\s+\d+\s.*\s%v\s*$`, node, is))
}

// lastLineSince requires the last line containing key to contain want and
// to be stamped after t (fanctl events' lines start with their time).
func lastLineSince(key, want string, t time.Time) func(string) error {
	return func(out string) error {
		if err := lastLine(key, want)(out); err != nil {
			return err
		}
		last := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, key) {
				last = l
			}
		}
		at, err := time.Parse("2006-01-02T15:04:05.000Z07:00", strings.Fields(last)[0])
		if err != nil {
			return fmt.Errorf("line %q: %w", last, err)
		}
		if !at.After(t) {
			return fmt.Errorf("last line with %q is from %v, before %v", key, at, t)
		}
		return nil
	}
}

// hasSince requires every pattern to match a line of fanctl events'
// output stamped after t.
func hasSince(t time.Time, patterns ...string) func(string) error {
	return func(out string) error {
		for _, p := range patterns {
			re, found := regexp.MustCompile(p), false
			for _, l := range strings.Split(out, "\n") {
				f := strings.Fields(l)
				if len(f) == 0 || !re.MatchString(l) {
					continue
				}
				if at, err := time.Parse("2006-01-02T15:04:05.000Z07:00", f[0]); err == nil && at.After(t) {
					found = true
					break
				}
			}
			if !found {
				return fmt.Errorf("no line after %v matches %q", t, p)
			}
		}
		return nil
	}
}

// sameTree requires dst to hold every file of src with the same content.
func sameTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(filepath.Join(dst, rel))
		if err != nil || !bytes.Equal(got, want) {
			return fmt.Errorf("%s: %s differs on the replaced host (%v)", filepath.Base(src), rel, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
