package daemon

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/micro"
)

// Status is what a service instance says about itself on its discovery
// endpoint (events.ServiceStatusSubject) and in `nats micro stats`.
type Status struct {
	Service       string       `json:"service"`
	Cluster       string       `json:"cluster"`
	Node          string       `json:"node"`
	Version       string       `json:"version"`
	Started       time.Time    `json:"started"`
	UptimeSeconds float64      `json:"uptime_seconds"`
	Ready         bool         `json:"ready"`
	BusConnected  bool         `json:"bus_connected"`
	Loops         []LoopStatus `json:"loops"`
	// Conditions are the raised ones (see Conditions).
	Conditions []Condition `json:"conditions,omitempty"`
	// Healthy is what /healthz answers: ready, on the bus, no stale loop,
	// no raised condition.
	Healthy bool `json:"healthy"`
}

// Status reports this instance's state now.
func (rt *Runtime) Status() Status {
	loops := rt.sup.loopStatus()
	st := Status{
		Service: rt.service, Cluster: rt.common.Cluster, Node: rt.common.Node, Version: rt.version,
		Started: rt.started, UptimeSeconds: time.Since(rt.started).Seconds(),
		Ready: rt.ready.Load(), BusConnected: rt.Bus != nil && rt.Bus.NC.IsConnected(), Loops: loops,
		Conditions: rt.Conditions.Raised(),
	}
	st.Healthy = st.Ready && st.BusConnected && len(staleNames(loops)) == 0 && len(st.Conditions) == 0
	return st
}

// MicroName is the NATS service name of a fan service: `nats micro ls`
// lists it, and `$SRV.PING.fan-<service>` reaches every instance.
func MicroName(service string) string { return "fan-" + service }

// startDiscovery registers the instance with NATS service discovery (ADR-32):
// it answers $SRV.PING, $SRV.INFO and $SRV.STATS, plus a status endpoint on a
// per-node subject, so an instance answers for itself and never shares a
// queue group with the same service on another node.
func (rt *Runtime) startDiscovery() error {
	status := func() any { return rt.Status() }
	svc, err := micro.AddService(rt.Bus.NC, micro.Config{
		Name:        MicroName(rt.service),
		Version:     microVersion(rt.version),
		Description: "fan " + rt.service + " on node " + rt.common.Node,
		Metadata: map[string]string{
			"cluster": rt.common.Cluster, "node": rt.common.Node, "service": rt.service, "fan_version": rt.version,
		},
		StatsHandler: func(*micro.Endpoint) any { return status() },
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			rt.Log.Warn("service discovery subscription error", "subject", e.Subject, "err", e.Description)
		},
	})
	if err != nil {
		return fmt.Errorf("service discovery: %w", err)
	}
	err = svc.AddEndpoint("status", micro.HandlerFunc(func(r micro.Request) {
		b, err := json.Marshal(status())
		if err != nil {
			_ = r.Error("500", err.Error(), nil)
			return
		}
		_ = r.Respond(b)
	}), micro.WithEndpointSubject(events.ServiceStatusSubject(rt.common.Cluster, rt.service, rt.common.Node)),
		micro.WithEndpointQueueGroupDisabled())
	if err != nil {
		_ = svc.Stop()
		return fmt.Errorf("service discovery status endpoint: %w", err)
	}
	rt.micro = svc
	return nil
}

func (rt *Runtime) stopDiscovery() {
	if rt.micro != nil {
		if err := rt.micro.Stop(); err != nil {
			rt.Log.Warn("service discovery stop", "err", err)
		}
		rt.micro = nil
	}
}

var (
	semver      = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$`)
	notMetaChar = regexp.MustCompile(`[^0-9A-Za-z-]+`)
)

// microVersion turns fan's version (`git describe`: v1.2.3, v1.2.3-4-gabc,
// abc1234-dirty, dev) into the SemVer that micro requires; a version that is
// not SemVer becomes build metadata of 0.0.0, so it is still shown. The
// exact string is also in the "fan_version" metadata.
func microVersion(v string) string {
	if s := strings.TrimPrefix(v, "v"); semver.MatchString(s) {
		return s
	}
	meta := strings.Trim(notMetaChar.ReplaceAllString(v, "-"), "-")
	if meta == "" {
		return "0.0.0"
	}
	return "0.0.0+" + meta
}
