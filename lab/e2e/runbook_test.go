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
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/runbook"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
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
}

type pendingSystemctl struct {
	req   systemctlRequest
	reply chan systemctlReply
}

// TestRunbook runs the commands of docs/operations.md (every section but
// install, upgrade, rollback and uninstall, which the package test runs)
// against one secure lab, causing each situation the runbook answers and
// checking what it promises the commands show. The move cap is one
// automatic move an hour, so the second failover freezes the group.
func TestRunbook(t *testing.T) {
	doc, err := runbook.ParseFile(opsDoc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, l, st, p := startLab(t, 3*time.Minute, stack.Options{SecureBus: true, MaxMovesPerHour: 1})
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
	r.until(ctl, "explain-failover", 10*time.Second, has(`FAILOVER n1->n2`, `n1 pbx\[self\] up->down`))
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
		`pbx: NEEDS A HUMAN: holder n1 reports pbx down; group pbx is frozen .*: not replaced, a human must act`))
	r.until(ctl, "needs-human", 10*time.Second, has(`NEEDS A HUMAN: pbx HOLD \(holder n1\): holder n1 reports pbx down.*frozen against flapping`))
	r.until(ctl, "flapping-transitions", 10*time.Second, has(`n1 pbx\[self\] up->down`, `n1 pbx\[self\] down->up`))
	r.must(ctl, "unfreeze")
	answer("n2")
	r.until(ctl, "status", 10*time.Second, holder("n2"), lacksRE("FROZEN"))
	r.must("n1", "start-pbx")
	r.until(ctl, "status", 20*time.Second, health("n1", "up"))

	// Needs a human: holder down while frozen (maintenance).
	r.must(ctl, "maintenance-on")
	r.must("n2", "stop-pbx")
	r.until(ctl, "status", 20*time.Second, holder("n2"), health("n2", "down"),
		has(`pbx: FROZEN: group pbx is in maintenance`, `holder n2 reports pbx down.*not replaced, a human must act`))
	r.until(ctl, "needs-human", 10*time.Second, has(`NEEDS A HUMAN: .*holder n2 reports pbx down.*is in maintenance`))
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
		has(`holder n1 reports pbx down; no other eligible node \(n2 pbx down\)`))
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

	if missing := doc.Missing(r.ran, "Before you start", "What healthy looks like", "Testing a failover by hand",
		"Taking a PBX host out of service", "Needs a human", "Replication safety valve tripped"); len(missing) > 0 {
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

// systemctl does what the lab can of what a block asked systemd for.
func (r *runbookLab) systemctl(q systemctlRequest) systemctlReply {
	var err error
	switch a := strings.Join(q.Args, " "); {
	case a == "stop asterisk":
		err = r.st.KillPBX(r.ctx, q.Host)
	case a == "start asterisk":
		err = r.st.ThawPBX(r.ctx, q.Host)
	case len(q.Args) == 2 && q.Args[0] == "restart" && strings.HasPrefix(q.Args[1], "fan-"):
		err = r.st.Restart(q.Host, q.Args[1])
	default:
		err = errors.New("the lab knows only stop|start asterisk and restart fan-<service>")
	}
	if err != nil {
		return systemctlReply{Output: fmt.Sprintf("systemctl %s (lab, %s): %v\n", strings.Join(q.Args, " "), q.Host, err), Code: 1}
	}
	return systemctlReply{}
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
	argv = append(argv, labHostEnv+"="+host, "REPLICATOR_CONFIG="+r.st.ConfigPath(host, "replicator"),
		"bash", "-euo", "pipefail", "-c", env.Text+b.Text)
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
	deadline := time.Now().Add(within)
	for {
		out, err := r.run(host, name)
		if err == nil {
			for _, c := range checks {
				if err = c(out); err != nil {
					break
				}
			}
		}
		if err == nil {
			r.t.Logf("block %s on %s:\n%s", name, host, out)
			return out
		}
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			r.t.Fatalf("block %s on %s within %v: %v\n%s", name, host, within, err, out)
		}
		time.Sleep(300 * time.Millisecond)
	}
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
	deadline := time.Now().Add(30 * time.Second)
	for n := countFiles(t, dir); n != want; n = countFiles(t, dir) {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d files, want %d", dir, n, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
