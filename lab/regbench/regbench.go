// Package regbench measures how fan-replicator carries PJSIP registrations
// from the holder's Asterisk to the standby's, the way a phone and an
// operator see it: SIPp registers PHONES phones on the holder (distinct
// users and contact ports, Expires 300) and keeps them re-registering, and
// the benchmark reports
//
//   - REGISTER's 200 OK on the holder to the contact in the standby's
//     AstDB (p50, p99, max), and an unregistration's 200 OK to the contact
//     gone from it;
//   - the replicators' CPU and resident memory on each node, and the
//     PBX's, over a steady window;
//   - 30 % of the phones unregistering within a second, then 10 % coming
//     back from new addresses: how long until the standby matches the
//     holder, and how long a registration made meanwhile stayed off it;
//   - after the holder crashes (PBX and replicator killed) and the group
//     moves, the share of phones an INVITE from the new holder reaches
//     (Originate PJSIP/<aor>), and how long after the crash.
//
// Everything runs in the network namespace it is given (loopback only):
// fan-nats, two PBXs (fan-pbxstandin as a registrar, or a real Asterisk 22
// when Options.Asterisk names an install), a fan-replicator for each, SIPp
// and the phones' sockets. The benchmark writes the group status itself,
// as the arbiter would.
package regbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/procstat"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/poll"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options say what to run.
type Options struct {
	// Bin holds fan-nats, fan-replicator and fan-pbxstandin.
	Bin string
	// Asterisk, when set, is a real Asterisk 22 install (sbin/asterisk)
	// to run as both PBXs instead of the stand-in.
	Asterisk string
	// Dir is the work directory (configs, logs, stores).
	Dir    string
	Phones int
	// Refresh is how often each phone registers again (SIPp's rate is
	// Phones/Refresh); Expires is what each asks for.
	Refresh time.Duration
	Expires int
	// Window is the steady window the costs are measured over; Latency
	// the window registrations are timed in.
	Window, Latency time.Duration
	// Debug runs the replicators with -log-level debug (their logs stay
	// in Dir: each delta published and applied, with its age).
	Debug bool
	// Profile, when set, is where the replicators' CPU and allocation
	// profiles over the steady window go (their binaries built with
	// -tags pprof).
	Profile string
	// Out receives progress lines and the figures.
	Out io.Writer
}

const (
	natsAddr  = "127.0.0.1:4222"
	cluster   = "regbench"
	group     = "pbx"
	portBase  = 10000
	sippPorts = 5070
)

// pprofAddr is where a node's replicator serves net/http/pprof.
func pprofAddr(node string) string {
	if node == "n1" {
		return "127.0.0.1:6061"
	}
	return "127.0.0.1:6062"
}

// Run runs the benchmark and prints its figures.
func Run(ctx context.Context, o Options) error {
	if o.Phones <= 0 {
		return errors.New("regbench: no phones")
	}
	if o.Refresh <= 0 {
		o.Refresh = 150 * time.Second
	}
	if o.Expires <= 0 {
		o.Expires = 300
	}
	if o.Window <= 0 {
		o.Window = time.Minute
	}
	if o.Latency <= 0 {
		o.Latency = time.Minute
	}
	b := &bench{o: o, ps: &procs{}}
	defer b.ps.killAll()
	return b.run(ctx)
}

type bench struct {
	o      Options
	ps     *procs
	n1, n2 *pbxNode
	r1, r2 *exec.Cmd
	nc     *nats.Conn
	kv     jetstream.KeyValue
	phones []phone // the phones, by index
	moved  []phone // the 10 % coming back from new addresses
	ears   *phoneListeners
	res    map[string]string
}

func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.o.Out, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (b *bench) figure(k string, v any) {
	if b.res == nil {
		b.res = map[string]string{}
	}
	switch x := v.(type) {
	case float64:
		b.res[k] = strconv.FormatFloat(x, 'f', -1, 64)
	default:
		b.res[k] = fmt.Sprint(v)
	}
}

func (b *bench) run(ctx context.Context) error {
	o := b.o
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	for i := range o.Phones {
		b.phones = append(b.phones, phone{user: strconv.Itoa(portBase + i), port: portBase + i})
	}
	for i := range o.Phones / 10 {
		p := b.phones[i]
		b.moved = append(b.moved, phone{user: p.user, port: portBase + o.Phones + i})
	}
	var ports []int
	for _, p := range append(slices.Clone(b.phones), b.moved...) {
		ports = append(ports, p.port)
	}
	var err error
	if b.ears, err = listenPhones(ports); err != nil {
		return err
	}
	defer b.ears.Close()

	if err := b.startAll(ctx); err != nil {
		return err
	}
	defer b.nc.Close()
	kind := "stand-in (fan-pbxstandin)"
	if o.Asterisk != "" {
		kind = "Asterisk " + o.Asterisk
	}
	b.say("nodes up: n1 holds, n2 stands by; PBX: %s; %d phones, Expires %d, re-registering every %s", kind, o.Phones, o.Expires, o.Refresh)

	// Every phone registers once, fast.
	std, err := newAMIPool(b.n2.amiAddr, amiUser, amiSecret, 4)
	if err != nil {
		return err
	}
	defer std.Close()
	hold, err := newAMIPool(b.n1.amiAddr, amiUser, amiSecret, 2)
	if err != nil {
		return err
	}
	defer hold.Close()
	first, err := runSIPp(o.Dir, "initial", b.n1.sipAddr(), sippPorts, b.phones, o.Expires, 200, len(b.phones))
	if err != nil {
		return err
	}
	if err := first.wait(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	if err := b.waitCount(ctx, std, len(b.phones), 2*time.Minute); err != nil {
		return err
	}
	b.figure("initial_all_on_standby_ms", round1(float64(time.Since(t0).Microseconds())/1000))
	b.say("all %d registered and on the standby (%s after SIPp finished)", len(b.phones), time.Since(t0).Round(time.Millisecond))

	// Phones keep re-registering from now on.
	rate := float64(len(b.phones)) / o.Refresh.Seconds()
	steady, err := runSIPp(o.Dir, "steady", b.n1.sipAddr(), sippPorts+1, b.phones, o.Expires, rate, 0)
	if err != nil {
		return err
	}
	defer steady.stop()
	time.Sleep(2 * time.Second)

	if err := b.measureCosts(ctx); err != nil {
		return err
	}
	if err := b.measureLatency(ctx, std, steady, rate); err != nil {
		return err
	}
	if err := b.measureUnregister(ctx, std); err != nil {
		return err
	}
	steady.stop()
	if err := b.measureChurn(ctx, std, hold); err != nil {
		return err
	}
	if err := b.measureFailover(ctx, std, hold); err != nil {
		return err
	}
	b.print()
	return nil
}

func (b *bench) startAll(ctx context.Context) error {
	o := b.o
	if _, err := b.ps.start(o.Dir, "nats", filepath.Join(o.Bin, "fan-nats"), "-listen", natsAddr,
		"-store", filepath.Join(o.Dir, "nats"), "-name", "regbench"); err != nil {
		return err
	}
	if err := waitTCP(ctx, natsAddr, 20*time.Second); err != nil {
		return err
	}
	b.n1 = &pbxNode{name: "n1", sipPort: 5060, amiAddr: "127.0.0.1:5038"}
	b.n2 = &pbxNode{name: "n2", sipPort: 5062, amiAddr: "127.0.0.1:5039"}
	users := make([]string, len(b.phones))
	for i, p := range b.phones {
		users[i] = p.user
	}
	for _, n := range []*pbxNode{b.n1, b.n2} {
		var err error
		if o.Asterisk != "" {
			err = startAsterisk(b.ps, o.Dir, o.Asterisk, n, users)
		} else {
			err = startStandIn(b.ps, o.Dir, o.Bin, n)
		}
		if err != nil {
			return err
		}
	}
	for _, n := range []*pbxNode{b.n1, b.n2} {
		if err := waitTCP(ctx, n.amiAddr, 60*time.Second); err != nil {
			return fmt.Errorf("%s's PBX: %w", n.name, err)
		}
	}
	for _, n := range []*pbxNode{b.n1, b.n2} {
		cfg, err := replicatorConfig(o.Dir, n.name, "nats://"+natsAddr, n.amiAddr)
		if err != nil {
			return err
		}
		var env []string
		if o.Profile != "" {
			env = []string{"FAN_PPROF=" + pprofAddr(n.name)}
		}
		argv := []string{filepath.Join(o.Bin, "fan-replicator"), "-config", cfg}
		if o.Debug {
			argv = append(argv, "-log-level", "debug")
		}
		cmd, err := b.ps.startEnv(o.Dir, n.name+"-replicator", env, argv...)
		if err != nil {
			return err
		}
		if n == b.n1 {
			b.r1 = cmd
		} else {
			b.r2 = cmd
		}
	}
	var err error
	if b.nc, err = nats.Connect("nats://"+natsAddr, nats.Timeout(5*time.Second)); err != nil {
		return err
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		return err
	}
	// The replicators provision the state bucket as they start.
	if err := poll.Until(ctx, 30*time.Second, "the state bucket (replicator logs in "+o.Dir+")", func() error {
		b.kv, err = js.KeyValue(ctx, events.StateBucket)
		return err
	}); err != nil {
		return err
	}
	return b.setHolder(ctx, "n1", 1)
}

func (b *bench) setHolder(ctx context.Context, holder string, epoch uint64) error {
	v, _ := json.Marshal(events.GroupStatus{Group: group, Holder: holder, Epoch: epoch, Since: time.Now(), UpdatedAt: time.Now()})
	_, err := b.kv.Put(ctx, events.GroupStatusKey(cluster, group), v)
	return err
}

// waitCount waits until the standby holds n contacts.
func (b *bench) waitCount(ctx context.Context, std *amiPool, n int, within time.Duration) error {
	// Each look dumps the standby's whole registrar over AMI.
	return poll.Every(ctx, 100*time.Millisecond, within, fmt.Sprintf("the standby holding %d contacts", n), func() error {
		got := 0
		if err := std.with(func(c *amiConn) error {
			t, err := c.tree("registrar")
			got = len(t)
			return err
		}); err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("it holds %d", got)
		}
		return nil
	})
}

// measureCosts samples the processes' CPU and memory over the window.
func (b *bench) measureCosts(ctx context.Context) error {
	pids := map[string]int{"replicator_n1": b.r1.Process.Pid, "replicator_n2": b.r2.Process.Pid,
		"pbx_n1": b.n1.cmd.Process.Pid, "pbx_n2": b.n2.cmd.Process.Pid}
	start := map[string]procstat.Sample{}
	for k, pid := range pids {
		s, err := procstat.Take(pid)
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		start[k] = s
	}
	b.say("steady window of %s: costs (no other probing)", b.o.Window)
	var profiles sync.WaitGroup
	if b.o.Profile != "" {
		for _, n := range []string{"n1", "n2"} {
			for _, kind := range []string{"profile", "allocs"} {
				profiles.Add(1)
				go func() {
					defer profiles.Done()
					path := filepath.Join(b.o.Profile, "replicator-"+n+"-"+kind+".pb.gz")
					if err := procstat.FetchProfile(pprofAddr(n), kind, b.o.Window, path); err != nil {
						b.say("profile of %s's replicator: %v", n, err)
					}
				}()
			}
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.o.Window):
	}
	profiles.Wait()
	var repCPU, repRSS float64
	for _, k := range []string{"replicator_n1", "replicator_n2", "pbx_n1", "pbx_n2"} {
		s, err := procstat.Take(pids[k])
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		cpu := 100 * procstat.Share(start[k], s)
		rss, _ := procstat.RSS(pids[k])
		b.figure(k+"_cpu_pct", math.Round(cpu*100)/100)
		b.figure(k+"_rss_mib", math.Round(rss*10)/10)
		if strings.HasPrefix(k, "replicator") {
			repCPU, repRSS = max(repCPU, cpu), max(repRSS, rss)
			hwm, _ := procstat.HWM(pids[k])
			b.figure(k+"_peak_rss_mib", math.Round(hwm*10)/10)
		}
	}
	b.figure("replicator_cpu_pct", math.Round(repCPU*100)/100)
	b.figure("replicator_rss_mib", math.Round(repRSS*10)/10)
	return nil
}

// timing follows registrations' 200 OKs (SIPp's log) and times each one
// until the standby has it (or, for an unregistration, no longer has it).
type timing struct {
	mu   sync.Mutex
	ms   []float64
	late []float64 // over the wait: counted at the wait
	wg   sync.WaitGroup
}

const pollEvery = 10 * time.Millisecond

// follow polls the standby for one answered REGISTER.
func (t *timing) follow(ctx context.Context, std *amiPool, a answered, wait time.Duration) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		p := phone{user: a.user, port: a.port}
		want := a.at.Unix() + int64(a.expires) - 1
		deadline := a.at.Add(wait)
		for {
			done := false
			_ = std.with(func(c *amiConn) error {
				v, err := c.get("registrar", p.key())
				switch {
				case a.expires == 0:
					done = errors.Is(err, errNotFound)
				case err == nil:
					var ct struct {
						Exp string `json:"expiration_time"`
					}
					if json.Unmarshal([]byte(v), &ct) == nil {
						n, _ := strconv.ParseInt(ct.Exp, 10, 64)
						done = n >= want
					}
				}
				return nil
			})
			now := time.Now()
			if done || now.After(deadline) || ctx.Err() != nil {
				ms := float64(now.Sub(a.at).Microseconds()) / 1000
				t.mu.Lock()
				if done {
					t.ms = append(t.ms, ms)
				} else {
					t.late = append(t.late, ms)
				}
				t.mu.Unlock()
				return
			}
			// Finer while a delta is due, coarser after, so a burst of
			// pending registrations does not load the standby's AMI.
			if now.Sub(a.at) < 500*time.Millisecond {
				time.Sleep(pollEvery)
			} else {
				time.Sleep(10 * pollEvery)
			}
		}
	}()
}

func (t *timing) result() (all []float64, late int) {
	t.wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	all = append(slices.Clone(t.ms), t.late...)
	slices.Sort(all)
	return all, len(t.late)
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func round1(x float64) float64 { return math.Round(x*10) / 10 }

// measureLatency times the steady re-registrations for a window.
func (b *bench) measureLatency(ctx context.Context, std *amiPool, steady *sipp, rate float64) error {
	b.say("latency window of %s: each re-registration's 200 OK to the standby's AstDB (%.1f a second, polled every %s)", b.o.Latency, rate, pollEvery)
	ans := make(chan answered, 1024)
	tctx, cancel := context.WithTimeout(ctx, b.o.Latency)
	defer cancel()
	go tail(tctx, steady.log, ans)
	t := &timing{}
	skipBefore := time.Now()
	for {
		select {
		case a := <-ans:
			if a.at.Before(skipBefore) {
				continue
			}
			t.follow(ctx, std, a, 10*time.Second)
			continue
		case <-tctx.Done():
		}
		break
	}
	all, late := t.result()
	if len(all) == 0 {
		return errors.New("no registration was timed (SIPp's log: " + steady.log + ")")
	}
	b.figure("registrations_timed", len(all))
	b.figure("registration_to_standby_p50_ms", round1(pct(all, 0.5)))
	b.figure("registration_to_standby_p99_ms", round1(pct(all, 0.99)))
	b.figure("registration_to_standby_max_ms", round1(all[len(all)-1]))
	b.figure("registrations_not_on_standby_in_10s", late)
	return nil
}

// measureUnregister times single unregistrations: 5 % of the phones, one
// every 200 ms, each gone from the standby.
func (b *bench) measureUnregister(ctx context.Context, std *amiPool) error {
	n := max(len(b.phones)/20, 5)
	some := b.phones[len(b.phones)-n:]
	run, err := runSIPp(b.o.Dir, "unregister", b.n1.sipAddr(), sippPorts+2, some, 0, 5, len(some))
	if err != nil {
		return err
	}
	ans := make(chan answered, 1024)
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go tail(tctx, run.log, ans)
	t := &timing{}
	got := 0
	wait := time.After(time.Duration(n)*200*time.Millisecond + 15*time.Second)
	for got < n {
		select {
		case a := <-ans:
			got++
			t.follow(ctx, std, a, 10*time.Second)
		case <-wait:
			return fmt.Errorf("only %d of %d unregistrations answered", got, n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_ = run.wait(ctx)
	all, _ := t.result()
	b.figure("unregister_to_standby_p50_ms", round1(pct(all, 0.5)))
	b.figure("unregister_to_standby_p99_ms", round1(pct(all, 0.99)))
	b.figure("unregister_to_standby_max_ms", round1(all[len(all)-1]))
	// They come back, as the phones would after a moment.
	back, err := runSIPp(b.o.Dir, "reregister", b.n1.sipAddr(), sippPorts+3, some, b.o.Expires, 200, len(some))
	if err != nil {
		return err
	}
	return back.wait(ctx)
}

// measureChurn: 30 % of the phones unregister within a second, then 10 %
// come back from new addresses.
func (b *bench) measureChurn(ctx context.Context, std, hold *amiPool) error {
	time.Sleep(time.Second)
	gone := b.phones[:len(b.phones)*3/10]
	b.say("churn: %d phones unregister within a second, then %d come back from new addresses", len(gone), len(b.moved))
	run, err := runSIPp(b.o.Dir, "churn-unregister", b.n1.sipAddr(), sippPorts+4, gone, 0, float64(len(gone)), len(gone))
	if err != nil {
		return err
	}
	ans := make(chan answered, 4096)
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go tail(tctx, run.log, ans)
	var last time.Time
	for range gone {
		select {
		case a := <-ans:
			last = a.at
		case <-time.After(30 * time.Second):
			return errors.New("churn: unregistrations not all answered")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_ = run.wait(ctx)
	// The standby matches the holder once none of them is left on it.
	// When it does is the figure, hence looks 10 ms apart.
	if err := poll.Every(ctx, 10*time.Millisecond, 60*time.Second, "churn: the unregistered phones gone from the standby", func() error {
		return std.with(func(c *amiConn) error {
			t, err := c.tree("registrar")
			if err != nil {
				return err
			}
			left := 0
			for _, p := range gone {
				if _, ok := t[p.key()]; ok {
					left++
				}
			}
			if left > 0 {
				return fmt.Errorf("%d of %d still on it", left, len(gone))
			}
			return nil
		})
	}); err != nil {
		b.figure("mass_unregister_standby_ms", "never")
		b.say("%v", err)
	} else {
		b.figure("mass_unregister_standby_ms", round1(float64(time.Since(last).Microseconds())/1000))
	}
	back, err := runSIPp(b.o.Dir, "churn-moved", b.n1.sipAddr(), sippPorts+5, b.moved, b.o.Expires, float64(len(b.moved)), len(b.moved))
	if err != nil {
		return err
	}
	bans := make(chan answered, 4096)
	go tail(tctx, back.log, bans)
	t := &timing{}
	for range b.moved {
		select {
		case a := <-bans:
			t.follow(ctx, std, a, 60*time.Second)
		case <-time.After(30 * time.Second):
			return errors.New("churn: new addresses not all answered")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_ = back.wait(ctx)
	all, _ := t.result()
	frozen := math.Max(0, all[len(all)-1]/1000-1)
	b.figure("churn_registration_p99_ms", round1(pct(all, 0.99)))
	b.figure("registrations_frozen_s", math.Round(frozen*10)/10)
	return nil
}

// measureFailover crashes the holder (its PBX and replicator killed), moves
// the group to n2, and has n2 call every phone the holder had registered.
func (b *bench) measureFailover(ctx context.Context, std, hold *amiPool) error {
	time.Sleep(2 * time.Second)
	var registered map[string]string
	if err := hold.with(func(c *amiConn) error {
		var err error
		registered, err = c.tree("registrar")
		return err
	}); err != nil {
		return err
	}
	byKey := map[string]phone{}
	for _, p := range append(slices.Clone(b.phones), b.moved...) {
		byKey[p.key()] = p
	}
	var want []phone
	for k := range registered {
		if p, ok := byKey[k]; ok {
			want = append(want, p)
		}
	}
	b.ears.mark()
	crash := time.Now()
	kill(b.n1.cmd)
	kill(b.r1)
	if err := b.setHolder(ctx, "n2", 2); err != nil {
		return err
	}
	moved := time.Now()
	b.say("failover: n1 crashed, n2 holds; calling the %d phones n1 had registered", len(want))
	var wg sync.WaitGroup
	work := make(chan phone)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dialAMI(b.n2.amiAddr, amiUser, amiSecret)
			if err != nil {
				return
			}
			defer c.Close()
			for p := range work {
				_, _, _ = c.do("Originate", "Channel", "PJSIP/"+p.user, "Application", "Echo", "Async", "true")
			}
		}()
	}
	for _, p := range want {
		work <- p
	}
	close(work)
	wg.Wait()
	// Some never reached is the share below, not a failure.
	var reached int
	var lastAt time.Time
	_ = poll.Until(ctx, 30*time.Second, "every phone reached", func() error {
		reached, lastAt = 0, time.Time{}
		for _, p := range want {
			if t, ok := b.ears.reachedAt(p.port); ok {
				reached++
				if t.After(lastAt) {
					lastAt = t
				}
			}
		}
		if reached < len(want) {
			return fmt.Errorf("%d of %d", reached, len(want))
		}
		return nil
	})
	share := 0.0
	if len(want) > 0 {
		share = float64(reached) / float64(len(want))
	}
	b.figure("phones_registered_at_crash", len(want))
	b.figure("reachable_share", math.Round(share*10000)/10000)
	if !lastAt.IsZero() {
		b.figure("reachable_after_crash_ms", round1(float64(lastAt.Sub(crash).Microseconds())/1000))
		b.figure("reachable_after_failover_ms", round1(float64(lastAt.Sub(moved).Microseconds())/1000))
	}
	return nil
}

// print writes the figures as one key=value line and the targets met.
func (b *bench) print() {
	keys := []string{"registration_to_standby_p50_ms", "registration_to_standby_p99_ms", "registration_to_standby_max_ms",
		"registrations_timed", "registrations_not_on_standby_in_10s", "initial_all_on_standby_ms",
		"unregister_to_standby_p50_ms", "unregister_to_standby_p99_ms", "unregister_to_standby_max_ms",
		"replicator_cpu_pct", "replicator_rss_mib",
		"replicator_n1_cpu_pct", "replicator_n2_cpu_pct", "replicator_n1_rss_mib", "replicator_n2_rss_mib",
		"replicator_n1_peak_rss_mib", "replicator_n2_peak_rss_mib",
		"pbx_n1_cpu_pct", "pbx_n2_cpu_pct", "pbx_n1_rss_mib", "pbx_n2_rss_mib",
		"mass_unregister_standby_ms", "registrations_frozen_s", "churn_registration_p99_ms",
		"phones_registered_at_crash", "reachable_share", "reachable_after_crash_ms", "reachable_after_failover_ms"}
	var line []string
	for _, k := range keys {
		if v, ok := b.res[k]; ok {
			line = append(line, k+"="+v)
		}
	}
	pbx := "standin"
	if b.o.Asterisk != "" {
		pbx = "asterisk"
	}
	fmt.Fprintf(b.o.Out, "phones=%d pbx=%s %s\n", b.o.Phones, pbx, strings.Join(line, " "))
	num := func(k string) float64 {
		f, err := strconv.ParseFloat(b.res[k], 64)
		if err != nil {
			return math.NaN()
		}
		return f
	}
	check := func(name string, ok bool) string {
		if ok {
			return name + " met"
		}
		return name + " NOT met"
	}
	fmt.Fprintf(b.o.Out, "targets: %s; %s; %s; %s; %s; %s; %s\n",
		check("registration p99 <= 250 ms", num("registration_to_standby_p99_ms") <= 250),
		check("unregistration p99 <= 250 ms", num("unregister_to_standby_p99_ms") <= 250),
		check("replicator CPU <= 1 % on each node", num("replicator_cpu_pct") <= 1),
		check("replicator RSS <= 40 MiB on each node", num("replicator_rss_mib") <= 40),
		check("mass unregistration <= 1000 ms", num("mass_unregister_standby_ms") <= 1000),
		check("registrations frozen 0 s", num("registrations_frozen_s") == 0),
		check("reachable_share 1.0", num("reachable_share") == 1))
}
