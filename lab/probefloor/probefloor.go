// Package probefloor is the prober benchmark's two references: the floor,
// the least work a program can do to run the prober's checks (the same
// socket work per check, nothing else: no results kept, nothing published),
// and the process-per-check way keepalived's vrrp_script runs a check (a
// new process per check per interval). Both run the checks the benchmark
// gives them at its interval; the benchmark measures them and fan the same
// way, so fan's CPU reads as a ratio to each.
package probefloor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Kinds are the check kinds of the prober benchmark's mix, in print order.
var Kinds = []string{"ami", "sip", "siptcp", "tcp", "http"}

// Check is one check: its kind and where it goes (host:port; a URL for
// http).
type Check struct {
	Kind, Addr string
}

// Credentials log the ami checks in.
type Credentials struct {
	Username, Secret string
}

// Counts is how many runs of each kind ended, and how many of them failed.
type Counts struct {
	mu     sync.Mutex
	ok, ko map[string]int
}

func (c *Counts) add(kind string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok == nil {
		c.ok, c.ko = map[string]int{}, map[string]int{}
	}
	if err != nil {
		c.ko[kind]++
		return
	}
	c.ok[kind]++
}

// Snapshot is the runs per kind so far, failed ones included, and the
// failures alone.
func (c *Counts) Snapshot() (runs, failed map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	runs, failed = map[string]int{}, map[string]int{}
	for k, n := range c.ok {
		runs[k] += n
	}
	for k, n := range c.ko {
		runs[k] += n
		failed[k] = n
	}
	return runs, failed
}

// Floor runs every check each interval until ctx ends. It is the least a
// program can do for them: one ticker wakes it once an interval for all the
// checks, each run by a goroutine of its own (so that runs overlap as the
// prober's do, and a slow one does not hold the others) under one timeout
// for the turn; the connection an ami, siptcp or http check keeps is
// dialled once and kept, as the prober keeps it. A check still running at
// the next tick skips it.
func Floor(ctx context.Context, checks []Check, cred Credentials, interval, timeout time.Duration, counts *Counts) {
	var wg sync.WaitGroup
	turns := make([]chan context.Context, len(checks))
	for i, c := range checks {
		turns[i] = make(chan context.Context, 1)
		wg.Go(func() {
			p := newProbe(c, cred)
			defer p.close()
			for {
				var turn context.Context
				select {
				case <-ctx.Done():
					return
				case turn = <-turns[i]:
				}
				err := p.run(turn)
				if ctx.Err() != nil {
					return
				}
				counts.add(c.Kind, err)
			}
		})
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	cancel := context.CancelFunc(func() {})
	for {
		cancel() // the last turn's timer; its runs are over or have failed
		var turn context.Context
		turn, cancel = context.WithTimeout(context.WithoutCancel(ctx), timeout)
		for _, ch := range turns {
			select {
			case ch <- turn:
			default:
			}
		}
		select {
		case <-ctx.Done():
			cancel()
			wg.Wait()
			return
		case <-t.C:
		}
	}
}

// Exec runs every check each interval as its own process, self with
// OnceArgs, as keepalived runs a vrrp_script: a check whose last process has
// not ended by its next tick skips that tick. Its CPU is the children's.
func Exec(ctx context.Context, self string, checks []Check, cred Credentials, interval, timeout time.Duration, counts *Counts) {
	var wg sync.WaitGroup
	for i, c := range checks {
		offset := interval * time.Duration(i) / time.Duration(len(checks))
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(offset):
			}
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				err := exec.Command(self, OnceArgs(c, cred, timeout)...).Run()
				if ctx.Err() != nil {
					return
				}
				counts.add(c.Kind, err)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	wg.Wait()
}

// OnceArgs are the arguments of one process-per-check run of c.
func OnceArgs(c Check, cred Credentials, timeout time.Duration) []string {
	return []string{"-once", c.Kind, "-addr", c.Addr, "-user", cred.Username, "-secret", cred.Secret, "-timeout", timeout.String()}
}

// Once runs c once with fresh sockets and exits: the process-per-check
// run, which can keep nothing (an ami check logs in and off every time).
func Once(ctx context.Context, c Check, cred Credentials) error {
	p := newProbe(c, cred)
	defer p.close()
	err := p.run(ctx)
	if c.Kind == "ami" && p.conn != nil && err == nil {
		err = p.amiAction(ctx, "Logoff")
	}
	return err
}

// probe holds what one check keeps between its runs.
type probe struct {
	Check
	cred Credentials
	conn net.Conn // ami, siptcp, http: kept
	in   *bufio.Reader
	udp  *net.UDPConn // sip: one unconnected socket, as the prober's
	dst  *net.UDPAddr
	seq  atomic.Uint64
	req  *http.Request
	buf  []byte
}

func newProbe(c Check, cred Credentials) *probe {
	return &probe{Check: c, cred: cred, buf: make([]byte, 4096)}
}

func (p *probe) close() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	if p.udp != nil {
		_ = p.udp.Close()
	}
}

func (p *probe) run(ctx context.Context) error {
	var err error
	switch p.Kind {
	case "tcp":
		err = p.tcp(ctx)
	case "sip":
		err = p.sipUDP(ctx)
	case "siptcp":
		err = p.kept(ctx, p.sipTCP)
	case "ami":
		err = p.kept(ctx, func(ctx context.Context) error {
			return p.amiAction(ctx, "Command", "Command", "core show channels count")
		})
	case "http":
		err = p.kept(ctx, p.http)
	default:
		return fmt.Errorf("probefloor: unknown kind %q", p.Kind)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", p.Kind, p.Addr, err)
	}
	return nil
}

func (p *probe) tcp(ctx context.Context) error {
	d := net.Dialer{KeepAlive: -1}
	c, err := d.DialContext(ctx, "tcp", p.Addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// kept runs do on the kept connection, dialling it (and logging in, for
// ami) first when there is none, and drops it when do fails.
func (p *probe) kept(ctx context.Context, do func(context.Context) error) error {
	if p.conn == nil {
		addr := p.Addr
		if p.Kind == "http" {
			r, err := http.NewRequest(http.MethodGet, p.Addr, nil)
			if err != nil {
				return err
			}
			r.Header.Set("User-Agent", "fan-probefloor")
			p.req, addr = r, r.URL.Host
		}
		d := net.Dialer{KeepAlive: -1}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		p.conn, p.in = c, bufio.NewReaderSize(c, 4096)
		if p.Kind == "ami" {
			if err := p.amiLogin(ctx); err != nil {
				p.drop()
				return err
			}
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = p.conn.SetDeadline(dl)
	}
	if err := do(ctx); err != nil {
		p.drop()
		return err
	}
	return nil
}

func (p *probe) drop() {
	_ = p.conn.Close()
	p.conn, p.in = nil, nil
}

func (p *probe) amiLogin(ctx context.Context) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = p.conn.SetDeadline(dl)
	}
	if _, err := p.in.ReadString('\n'); err != nil { // the banner
		return fmt.Errorf("banner: %w", err)
	}
	return p.amiAction(ctx, "Login", "Username", p.cred.Username, "Secret", p.cred.Secret)
}

// amiAction sends one action and reads messages until its response,
// skipping events.
func (p *probe) amiAction(_ context.Context, action string, fields ...string) error {
	id := strconv.FormatUint(p.seq.Add(1), 10)
	var b bytes.Buffer
	fmt.Fprintf(&b, "Action: %s\r\nActionID: %s\r\n", action, id)
	for i := 0; i+1 < len(fields); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", fields[i], fields[i+1])
	}
	b.WriteString("\r\n")
	if _, err := p.conn.Write(b.Bytes()); err != nil {
		return err
	}
	for {
		msg, err := readAMIMessage(p.in)
		if err != nil {
			return err
		}
		if msg["ActionID"] != id || msg["Response"] == "" {
			continue
		}
		if msg["Response"] != "Success" && msg["Response"] != "Goodbye" {
			return fmt.Errorf("%s: %s: %s", action, msg["Response"], msg["Message"])
		}
		return nil
	}
}

// readAMIMessage reads one message (header lines up to a blank line); a
// repeated header keeps its first value.
func readAMIMessage(in *bufio.Reader) (map[string]string, error) {
	msg := map[string]string{}
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if len(msg) == 0 {
				continue
			}
			return msg, nil
		}
		k, v, _ := strings.Cut(line, ":")
		if _, dup := msg[k]; !dup {
			msg[k] = strings.TrimSpace(v)
		}
	}
}

// options is one OPTIONS request from local to the target, tagged n.
func options(target, local, transport string, n uint64) []byte {
	return fmt.Appendf(nil, "OPTIONS sip:%[1]s SIP/2.0\r\n"+
		"Via: SIP/2.0/%[3]s %[2]s;branch=z9hG4bKfloor%[4]d;rport\r\n"+
		"Max-Forwards: 70\r\n"+
		"From: <sip:fan@%[2]s>;tag=floor%[4]d\r\n"+
		"To: <sip:%[1]s>\r\n"+
		"Call-ID: floor%[4]d@%[2]s\r\n"+
		"CSeq: %[4]d OPTIONS\r\n"+
		"Content-Length: 0\r\n\r\n", target, local, transport, n)
}

func (p *probe) sipUDP(ctx context.Context) error {
	if p.udp == nil {
		dst, err := net.ResolveUDPAddr("udp", p.Addr)
		if err != nil {
			return err
		}
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: dst.IP})
		if err != nil {
			return err
		}
		p.udp, p.dst = c, dst
	}
	n := p.seq.Add(1)
	if _, err := p.udp.WriteToUDP(options(p.Addr, p.udp.LocalAddr().String(), "UDP", n), p.dst); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = p.udp.SetReadDeadline(dl)
	}
	want := fmt.Appendf(nil, "branch=z9hG4bKfloor%d;", n)
	for {
		m, _, err := p.udp.ReadFromUDP(p.buf)
		if err != nil {
			return err
		}
		if bytes.Contains(p.buf[:m], want) {
			return statusOK(p.buf[:m])
		}
	}
}

func (p *probe) sipTCP(context.Context) error {
	n := p.seq.Add(1)
	if _, err := p.conn.Write(options(p.Addr, p.conn.LocalAddr().String(), "TCP", n)); err != nil {
		return err
	}
	var head []byte
	for {
		line, err := p.in.ReadSlice('\n')
		if err != nil {
			return err
		}
		head = append(head, line...)
		if len(line) <= 2 && strings.TrimSpace(string(line)) == "" {
			return statusOK(head) // no body: the bench's peers answer Content-Length: 0
		}
	}
}

func statusOK(resp []byte) error {
	if !bytes.HasPrefix(resp, []byte("SIP/2.0 2")) {
		line, _, _ := bytes.Cut(resp, []byte("\r\n"))
		return fmt.Errorf("answer %q", line)
	}
	return nil
}

func (p *probe) http(context.Context) error {
	if err := p.req.Write(p.conn); err != nil {
		return err
	}
	resp, err := http.ReadResponse(p.in, p.req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	if resp.Close {
		return errors.New("server closes the connection")
	}
	return nil
}

// Result is one reference's measured window, as its program prints it on
// one line.
type Result struct {
	Mode   string         // floor or exec
	Window time.Duration  // measured wall time
	CPU    time.Duration  // user+system of the program and its children
	Runs   map[string]int // runs ended in the window, per kind
	Failed int            // of which failed
}

// String is the line ParseResult reads.
func (r Result) String() string {
	var kinds []string
	for _, k := range sortedKinds(r.Runs) {
		kinds = append(kinds, fmt.Sprintf("%s:%d", k, r.Runs[k]))
	}
	return fmt.Sprintf("probefloor mode=%s window_ms=%d cpu_us=%d failed=%d runs=%s",
		r.Mode, r.Window.Milliseconds(), r.CPU.Microseconds(), r.Failed, strings.Join(kinds, ","))
}

func sortedKinds(m map[string]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b string) int {
		ia, ib := slices.Index(Kinds, a), slices.Index(Kinds, b)
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a, b)
	})
	return ks
}

// ParseResult reads the result line out of a program's output.
func ParseResult(out string) (Result, error) {
	for line := range strings.Lines(out) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "probefloor ")
		if !ok {
			continue
		}
		r := Result{Runs: map[string]int{}}
		for f := range strings.FieldsSeq(rest) {
			k, v, _ := strings.Cut(f, "=")
			var err error
			var n int64
			switch k {
			case "mode":
				r.Mode = v
			case "window_ms", "cpu_us", "failed":
				if n, err = strconv.ParseInt(v, 10, 64); err != nil {
					return Result{}, fmt.Errorf("probefloor result %s: %w", k, err)
				}
				switch k {
				case "window_ms":
					r.Window = time.Duration(n) * time.Millisecond
				case "cpu_us":
					r.CPU = time.Duration(n) * time.Microsecond
				default:
					r.Failed = int(n)
				}
			case "runs":
				for kv := range strings.SplitSeq(v, ",") {
					if kv == "" {
						continue
					}
					kind, count, ok := strings.Cut(kv, ":")
					c, err := strconv.Atoi(count)
					if !ok || err != nil {
						return Result{}, fmt.Errorf("probefloor result runs %q: not kind:count", kv)
					}
					r.Runs[kind] = c
				}
			}
		}
		if r.Mode == "" || r.Window <= 0 {
			return Result{}, fmt.Errorf("probefloor result %q: no mode or window", line)
		}
		return r, nil
	}
	return Result{}, errors.New("probefloor: no result line in the output")
}

// Total is the runs of every kind together.
func (r Result) Total() int {
	n := 0
	for _, c := range r.Runs {
		n += c
	}
	return n
}

// PerProbeUS is CPU microseconds per run: cpu over runs.
func PerProbeUS(cpu time.Duration, runs int) float64 {
	if runs <= 0 {
		return 0
	}
	return float64(cpu.Nanoseconds()) / 1e3 / float64(runs)
}

// Ratio is fan's CPU per probe over a reference's, 0 when the reference
// has no figure. Per probe rather than per second, so that a reference
// which could not keep the rate (a process per check on a busy machine
// skips ticks) is still compared for the same work.
func Ratio(fanPerProbe, refPerProbe float64) float64 {
	if refPerProbe <= 0 {
		return 0
	}
	return fanPerProbe / refPerProbe
}

// ParseSpec reads "kind,count,address" into count checks of that kind; the
// address is everything after the second comma, so a URL stays whole.
func ParseSpec(s string) ([]Check, error) {
	kind, rest, ok1 := strings.Cut(s, ",")
	count, addr, ok2 := strings.Cut(rest, ",")
	n, err := strconv.Atoi(count)
	if !ok1 || !ok2 || err != nil || n < 0 || addr == "" {
		return nil, fmt.Errorf("probefloor: check %q: want kind,count,address", s)
	}
	if !slices.Contains(Kinds, kind) {
		return nil, fmt.Errorf("probefloor: check %q: kind not one of %s", s, strings.Join(Kinds, ", "))
	}
	return slices.Repeat([]Check{{Kind: kind, Addr: addr}}, n), nil
}
