package daemon

import (
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Conditions are the named states in which a service runs but cannot do
// its whole job: "restore_failed", "bus_isolated", "state_unwritable". Any
// part of a service raises one when it enters such a state and clears it
// when it leaves; while any is raised /healthz answers 503 and lists them,
// the status endpoint reports them, and the metric fan_condition{name} is 1
// (0 once cleared, so an alert can see it come and go).
//
// A condition reports; it never acts. The code that raises one also bounds
// it: it retries, gives up its role, or ends the service (see Group) so
// that systemd restarts it. An operator paged by a 503 reads the reason
// here and the log line beside it.
//
// The zero value is not usable; a nil *Conditions ignores every call, so
// components can be built without a Runtime (tests, tools).
type Conditions struct {
	log *slog.Logger
	now func() time.Time

	mu     sync.Mutex
	raised map[string]Condition
	known  map[string]bool // every name ever raised or declared, for the metric
}

// Condition is one raised condition, as /healthz and the status endpoint
// report it.
type Condition struct {
	Name   string    `json:"name"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

var conditionName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// NewConditions returns an empty set. Runtime has one (Runtime.Conditions);
// use this only for a component tested without a Runtime.
func NewConditions(log *slog.Logger) *Conditions {
	return &Conditions{log: log, now: time.Now, raised: map[string]Condition{}, known: map[string]bool{}}
}

// Declare makes the names appear on /metrics as 0 before they are first
// raised, so a dashboard shows the condition exists.
func (c *Conditions) Declare(names ...string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range names {
		mustConditionName(n)
		c.known[n] = true
	}
}

// Raise sets the condition (snake_case name) with a reason for the
// operator. Raising it again only updates the reason; Since stays the
// first time, so the age says how long the service has been degraded.
func (c *Conditions) Raise(name, reason string) {
	if c == nil {
		return
	}
	mustConditionName(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.known[name] = true
	if old, ok := c.raised[name]; ok {
		old.Reason = reason
		c.raised[name] = old
		return
	}
	c.raised[name] = Condition{Name: name, Reason: reason, Since: c.now()}
	c.log.Warn("condition raised", "condition", name, "reason", reason)
}

// Clear ends the condition; clearing one that is not raised does nothing.
func (c *Conditions) Clear(name string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.raised[name]
	if !ok {
		return
	}
	delete(c.raised, name)
	c.log.Info("condition cleared", "condition", name, "lasted", c.now().Sub(old.Since).String())
}

// Set raises the condition with reason when on is true and clears it
// otherwise: for a caller that learns the state on every turn.
func (c *Conditions) Set(name string, on bool, reason string) {
	if on {
		c.Raise(name, reason)
	} else {
		c.Clear(name)
	}
}

// Raised lists the raised conditions, sorted by name.
func (c *Conditions) Raised() []Condition {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	out := make([]Condition, 0, len(c.raised))
	for _, r := range c.raised {
		out = append(out, r)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Is reports whether the condition is raised.
func (c *Conditions) Is(name string) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.raised[name]
	return ok
}

// describe is the /healthz body's line for the raised conditions.
func describeConditions(cs []Condition) string {
	parts := make([]string, len(cs))
	for i, r := range cs {
		parts[i] = r.Name + " (" + r.Reason + ")"
	}
	return "conditions: " + strings.Join(parts, ", ")
}

func mustConditionName(n string) {
	if !conditionName.MatchString(n) {
		// A programming error, like a metric with a bad name.
		panic(fmt.Sprintf("daemon: condition name %q is not snake_case", n))
	}
}

type conditionCollector struct {
	c    *Conditions
	desc *prometheus.Desc
}

func newConditionCollector(c *Conditions) *conditionCollector {
	return &conditionCollector{c: c, desc: prometheus.NewDesc("fan_condition",
		"1 while the named condition is raised (the service runs but cannot do its whole job; /healthz answers 503), else 0.",
		[]string{"name"}, nil)}
}

func (cc *conditionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- cc.desc }

func (cc *conditionCollector) Collect(ch chan<- prometheus.Metric) {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	for n := range cc.c.known {
		v := 0.0
		if _, ok := cc.c.raised[n]; ok {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(cc.desc, prometheus.GaugeValue, v, n)
	}
}
