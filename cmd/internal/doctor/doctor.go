// Package doctor checks, on one host, what breaks a fan installation:
// the host's interface, floating addresses, ip_nonlocal_bind and clock;
// the local Asterisk over AMI (the login, the rights fan uses, the PJSIP
// transports and endpoints, the systemname); the bus with each local
// service's own identity (TLS, nkey, certificates, streams, raft peers);
// that the names in every local file agree with each other and with the
// bus; the order of each service's bus.url; and the ports fan needs.
//
// It reads the fan configuration files present on the host (a directory
// such as /etc/fan) and changes nothing: it logs in, asks and reads, and
// every network step has a short deadline. Each finding has a severity, says
// what is wrong and how to fix it (a command, or the key to change).
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Severity grades a finding. Only errors fail the run.
type Severity string

const (
	// Error: this breaks failover or a service on this host.
	Error Severity = "error"
	// Warning: it works, but worse than it should (calls that do not
	// survive a failover, a certificate about to expire, a clock adrift).
	Warning Severity = "warning"
	// OK: checked and as it should be.
	OK Severity = "ok"
	// Skipped: not checked, and the finding says why (nothing to check
	// here, or no identity on this host may read it).
	Skipped Severity = "skip"
)

// Finding is one result.
type Finding struct {
	Severity Severity `json:"severity"`
	// Check names what was checked, stable for scripts: host.interface,
	// ami.rights, bus.connect, names.cluster, order.bus-url, port.tcp, ...
	Check string `json:"check"`
	// Subject is what the finding is about: a file and key, an identity, an
	// address.
	Subject string `json:"subject,omitempty"`
	// Message says what was seen, and for an error or a warning what is
	// wrong and what it does to fan.
	Message string `json:"message"`
	// Fix is the command to run or the key to change.
	Fix string `json:"fix,omitempty"`
}

// Report is one run's findings.
type Report struct {
	Host     string        `json:"host"`
	Etc      string        `json:"etc"`
	Files    []string      `json:"files"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Findings []Finding     `json:"findings"`
}

// Count returns how many findings have severity s.
func (r Report) Count(s Severity) int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == s {
			n++
		}
	}
	return n
}

// Options configure a run.
type Options struct {
	// Etc is the directory holding fan's files; default /etc/fan.
	Etc string
	// Within bounds the whole run; default 12 s.
	Within time.Duration
	// Step bounds one network step (a dial, a login, a request); default 2 s.
	Step time.Duration
	// Clock reads the kernel's clock discipline; nil reads adjtimex(2).
	Clock func() (ClockState, error)
	// ProcSys is where sysctls are read; default /proc/sys (the network
	// namespace doctor runs in).
	ProcSys string
	// Log receives debug lines; nil discards them.
	Log *slog.Logger
}

func (o *Options) defaults() {
	if o.Etc == "" {
		o.Etc = "/etc/fan"
	}
	if o.Within <= 0 {
		o.Within = 12 * time.Second
	}
	if o.Step <= 0 {
		o.Step = 2 * time.Second
	}
	if o.Clock == nil {
		o.Clock = kernelClock
	}
	if o.ProcSys == "" {
		o.ProcSys = "/proc/sys"
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// areas order the report: each check belongs to one.
var areas = []string{"files", "host", "asterisk", "sip", "bus", "names", "order", "port"}

// findings collects what the checks of a run find, from any goroutine.
type findings struct {
	mu   sync.Mutex
	list []Finding
}

func (fs *findings) add(f Finding) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.list = append(fs.list, f)
}

func (fs *findings) addf(sev Severity, check, subject, fix, format string, args ...any) {
	fs.add(Finding{Severity: sev, Check: check, Subject: subject, Message: fmt.Sprintf(format, args...), Fix: fix})
}

// sorted returns the findings by area (areas' order), keeping the order
// each check added them in.
func (fs *findings) sorted() []Finding {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	out := slices.Clone(fs.list)
	slices.SortStableFunc(out, func(a, b Finding) int {
		return slices.Index(areas, area(a.Check)) - slices.Index(areas, area(b.Check))
	})
	return out
}

func area(check string) string {
	a, _, _ := strings.Cut(check, ".")
	return a
}

// run is the state of one doctor run shared by its checks.
type run struct {
	o     Options
	files *files
	out   *findings
	// caSeen are the CA files already checked (by checkBus alone).
	caSeen map[string]bool
}

// Run checks this host and returns what it found. It never returns early
// on a failed check: every check that can run does, within o.Within.
func Run(ctx context.Context, o Options) Report {
	o.defaults()
	started := time.Now()
	host, _ := os.Hostname()
	ctx, cancel := context.WithTimeout(ctx, o.Within)
	defer cancel()
	r := &run{o: o, out: &findings{}, caSeen: map[string]bool{}}
	r.files = loadFiles(o.Etc, r.out)
	rep := Report{Host: host, Etc: o.Etc, Files: r.files.names(), Started: started}
	if r.files.empty() {
		rep.Findings = r.out.sorted()
		rep.Duration = time.Since(started)
		return rep
	}

	// The checks that talk to Asterisk, the bus and the ports run side by
	// side; those that need what the bus says (the arbiter's groups, the
	// other nodes' heartbeats) run once it has been read.
	var wg sync.WaitGroup
	var pbx asteriskFacts
	var bus busFacts
	wg.Go(func() { pbx = r.checkAsterisk(ctx) })
	wg.Go(func() { bus = r.checkBus(ctx) })
	wg.Go(func() { r.checkPorts(ctx) })
	wg.Go(func() { r.checkSelfSIP(ctx) })
	r.checkClock()
	r.checkNonlocalBind()
	wg.Wait()

	groups := r.groups(bus)
	r.checkInterface(groups)
	r.checkCoverage(groups)
	r.checkNames(bus, groups)
	r.checkFloatingTransports(pbx, groups)
	r.checkSystemNames(pbx, bus, groups)
	if ctx.Err() != nil {
		r.out.addf(Error, "files.deadline", "", "run fanctl doctor again; if it recurs, look for the step named above that timed out",
			"the run did not finish within %v: a check above waited on something that did not answer", o.Within)
	}
	rep.Findings = r.out.sorted()
	rep.Duration = time.Since(started)
	return rep
}

// WriteText prints the report for a person: one line per finding, the fix
// under it, and a summary.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "fanctl doctor on %s (%s: %s)\n", r.Host, r.Etc, strings.Join(r.Files, ", "))
	last := ""
	for _, f := range r.Findings {
		if a := area(f.Check); a != last {
			fmt.Fprintf(&b, "%s\n", a)
			last = a
		}
		subject := ""
		if f.Subject != "" {
			subject = f.Subject + ": "
		}
		fmt.Fprintf(&b, "  %-7s %-24s %s%s\n", f.Severity, f.Check, subject, f.Message)
		if f.Fix != "" && f.Severity != OK {
			fmt.Fprintf(&b, "  %-7s %-24s fix: %s\n", "", "", f.Fix)
		}
	}
	fmt.Fprintf(&b, "%d errors, %d warnings, %d ok, %d skipped in %.1f s\n",
		r.Count(Error), r.Count(Warning), r.Count(OK), r.Count(Skipped), r.Duration.Seconds())
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the report as one JSON object.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Report
		Errors   int `json:"errors"`
		Warnings int `json:"warnings"`
	}{r, r.Count(Error), r.Count(Warning)})
}
