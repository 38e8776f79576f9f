// Command fan-lab runs fan's namespace lab as a demo: the same topology and
// binaries as the end-to-end test (two PBX nodes with Kamailio answering on
// a floating IP, a client, NATS and the arbiter on a control host), then
// kills the primary's PBX and prints the failover as a timeline: what the
// client saw on the floating IP, and every event on the bus. -scenario
// sites and -scenario pool run the other two ways fan moves a service, as
// their end-to-end tests do (sites.go, pool.go).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/cmd/internal/labcmd"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// version is set by the Makefile (-X main.version), as for fan's services.
var version = "dev"

func main() { labcmd.Main("fan-lab", version, run) }

func run(ctx context.Context, args []string) error {
	bin := flag.String("bin", "bin", "directory with fan's binaries (make build)")
	keep := flag.Bool("keep", false, "keep the lab running after the failover until Ctrl-C")
	insecure := flag.Bool("insecure", false, "run the bus without TLS and identities (insecure_lab), as before fan had them; the dedicated topology always does")
	topoFlag := flag.String("topology", "single", "where NATS and the arbiter run: single (one server on ctl), colocated (a server and an arbiter on n1, n2 and the witness ctl), dedicated (three NATS hosts s1-s3)")
	scenario := flag.String("scenario", "failover", "failover (the floating IP), sites (a DNS name between two sites, one of them dark: sites.go) or pool (a Kamailio dispatcher over PBX nodes that post heartbeats: pool.go)")
	if err := flag.CommandLine.Parse(args); err != nil {
		return err
	}
	topo, err := stack.ParseTopology(*topoFlag)
	if err != nil {
		return err
	}
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("the lab builds network namespaces: run it as root")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch *scenario {
	case "failover":
	case "sites":
		return runSites(ctx, absBin, *keep, log)
	case "pool":
		return runPool(ctx, absBin, *keep, log)
	default:
		return fmt.Errorf("-scenario %q: want failover, sites or pool", *scenario)
	}

	tl := &timeline{start: time.Now(), w: os.Stdout}
	tl.say("building the lab: bridge, nodes n1 and n2, client c, control host ctl (198.51.100.0/24)")
	l, err := netlab.Build(ctx, topo.LabSpec(netlab.Spec{Logger: log}))
	if err != nil {
		return err
	}
	defer func() {
		tl.say("tearing the lab down")
		if err := l.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "fan-lab: close:", err)
		}
	}()
	// As an installation runs: `fanctl nats-config` makes the CA, the
	// certificates and one identity per service, host and person.
	secure := !*insecure && topo != stack.TopologyDedicated
	if secure {
		tl.say("bus: TLS and one identity per service per host, from fanctl nats-config (as an installation); fanctl speaks as the operator " + stack.LabOperator)
	}
	st, err := stack.Start(ctx, l, stack.Options{BinDir: absBin, Log: log, Topology: topo, SecureBus: secure})
	if st != nil {
		defer st.Stop()
	}
	if err != nil {
		return err
	}
	switch topo {
	case stack.TopologySingle:
		tl.say("fan is running: fan-nats, fan-arbiter, fan-scheduler on ctl; fan-prober, fan-ipmover, fan-replicator, an AMI peer and Kamailio on each node")
	default:
		tl.say(fmt.Sprintf("fan is running (%s): a three-server NATS cluster on %v (streams at replicas 3), arbiter replicas on %v, fan-scheduler on ctl; fan-prober, fan-ipmover, fan-replicator, an AMI peer and Kamailio on each node",
			topo, st.NATSHosts(), st.ArbiterHosts()))
	}

	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); followEvents(evCtx, l, absBin, st.FanctlArgs(), tl) }()

	p, err := st.Pinger()
	if err != nil {
		return err
	}
	defer p.Close()
	wg.Add(1)
	go func() { defer wg.Done(); watchClient(evCtx, p, tl) }()

	if _, err := st.WaitAnswer(ctx, p, "n1", 30*time.Second); err != nil {
		return fmt.Errorf("no holder: %w", err)
	}
	sleep(ctx, 2*time.Second)
	tl.mark()
	tl.say("FAULT: n1's Asterisk deadlocks (AMI accepts TCP, never answers) and its SIP stops answering")
	if err := st.KillPBX(ctx, "n1"); err != nil {
		return err
	}
	ans, err := st.WaitAnswer(ctx, p, "n2", 20*time.Second)
	if err != nil {
		return err
	}
	tl.say(fmt.Sprintf("RESULT: the floating IP answered from n2 %v after the fault", ans.At.Sub(tl.faultAt()).Round(time.Millisecond)))
	sleep(ctx, 2*time.Second)
	if out, err := st.Fanctl(ctx, "status"); err == nil {
		fmt.Printf("\n%s\n", out)
	}
	if *keep {
		tl.say("lab kept running; Ctrl-C to tear it down. Try: ip netns exec " + mustNS(l, netlab.ControlHost) +
			" " + filepath.Join(absBin, "fanctl") + " " + strings.Join(st.FanctlArgs(), " ") + " events --follow")
		<-ctx.Done()
	}
	stopEvents()
	wg.Wait()
	return nil
}

func mustNS(l *netlab.Lab, host string) string {
	h, _ := l.Host(host)
	return h.NS
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// timeline prints lines stamped relative to the fault (or the start).
type timeline struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
	fault time.Time
}

func (t *timeline) mark() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fault = time.Now()
}

func (t *timeline) faultAt() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fault
}

func (t *timeline) stamp(at time.Time) string {
	if t.fault.IsZero() {
		return fmt.Sprintf("      %8.3fs", at.Sub(t.start).Seconds())
	}
	return fmt.Sprintf("fault%+9.3fs", at.Sub(t.fault).Seconds())
}

func (t *timeline) line(at time.Time, who, text string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "%s  %-18s %s\n", t.stamp(at), who, text)
}

func (t *timeline) say(text string) { t.line(time.Now(), "lab", text) }

// followEvents tails the bus through fanctl on the control host: its own
// one-line rendering of each event, on the timeline at the event's time.
func followEvents(ctx context.Context, l *netlab.Lab, bin string, conn []string, tl *timeline) {
	argv := append([]string{"netns", "exec", mustNS(l, netlab.ControlHost), filepath.Join(bin, "fanctl")}, conn...)
	cmd := exec.CommandContext(ctx, "ip", append(argv, "events", "--follow", "--since", "all")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		tl.say("cannot follow events: " + err.Error())
		return
	}
	if err := cmd.Start(); err != nil {
		tl.say("cannot follow events: " + err.Error())
		return
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if at, source, summary, ok := eventLine(sc.Text()); ok {
			tl.line(at, source, summary)
		}
	}
	_ = cmd.Wait()
}

// eventLine reads one line of `fanctl events` ("2006-01-02T15:04:05.000Z07:00
// type source summary... epoch=… id=… cause=…") into the event's time, its
// source and what the demo prints of it; ok is false for lines the demo
// leaves out (steady-state heartbeats and probe results, anything else).
func eventLine(line string) (at time.Time, source, summary string, ok bool) {
	f := strings.Fields(line)
	if len(f) < 3 {
		return time.Time{}, "", "", false
	}
	switch f[1] {
	case "node.heartbeat", "probe.result":
		return time.Time{}, "", "", false
	}
	at, err := time.Parse(time.RFC3339Nano, f[0])
	if err != nil {
		return time.Time{}, "", "", false
	}
	// The epoch and ids fanctl appends are for explain, not for a demo.
	text := f[3:]
	for len(text) > 0 && (strings.HasPrefix(text[len(text)-1], "id=") || strings.HasPrefix(text[len(text)-1], "cause=") || strings.HasPrefix(text[len(text)-1], "epoch=")) {
		text = text[:len(text)-1]
	}
	return at, f[2], f[1] + ": " + strings.Join(text, " "), true
}

// watchClient probes the floating IP every 10 ms and prints each change of
// who answers, as a phone would experience it.
func watchClient(ctx context.Context, p *sipoptions.Pinger, tl *timeline) {
	last := ""
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		r, err := p.Ping(pctx)
		cancel()
		now := "no answer on the floating IP"
		if err == nil {
			now = "floating IP answered by " + r.ServerNode
		}
		if now != last && ctx.Err() == nil {
			tl.line(time.Now(), "client@c", now)
			last = now
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
