package ipexec

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanpbx/fan/services/ipmover/internal/announce"
)

// refusedUnclaimed labels a release's address left alone because this node
// never claimed it.
const refusedUnclaimed = "unclaimed_release"

// metrics are the ipmover's Prometheus series. Packet counters read the
// Link's own counters at scrape time, so they can never disagree with it.
type metrics struct {
	steps       *prometheus.HistogramVec
	commands    *prometheus.CounterVec
	conflicts   *prometheus.CounterVec
	corrections *prometheus.CounterVec
	refused     *prometheus.CounterVec
	holder      *prometheus.GaugeVec
	busContact  prometheus.Gauge
	all         []prometheus.Collector
}

func newMetrics(link *announce.Link) *metrics {
	m := &metrics{
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fan_ipmover_claim_step_seconds",
			Help: "Time from receiving a claim to each step of carrying it out (received, probed, address_added, first_announcement_sent, pbx_answering, pbx_verified).",
			// From sub-millisecond netlink to a multi-second PBX restart.
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"step"}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_commands_total", Help: "Commands handled, by type and outcome.",
		}, []string{"type", "outcome"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_conflicts_total", Help: "Another MAC seen using a floating address, by what was done (kept, yielded, refused).",
		}, []string{"action"}),
		corrections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_corrections_total", Help: "Changes made without a command (readded, removed, released, failed).",
		}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_refused_total",
			Help: "Commands and state refused before anything was recorded or changed, by reason (no_term: the epoch is no lease term; not_allowed: outside groups; unclaimed_release: a release naming an address never claimed here).",
		}, []string{"reason"}),
		holder: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fan_ipmover_is_holder", Help: "1 while this node holds the group's addresses.",
		}, []string{"group"}),
		busContact: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fan_ipmover_bus_contact", Help: "1 while the last round trip to the bus succeeded.",
		}),
	}
	stat := func(name, help string, kind string, f func(announce.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"kind": kind}},
			func() float64 { return float64(f(link.Stats())) })
	}
	m.all = []prometheus.Collector{m.steps, m.commands, m.conflicts, m.corrections, m.refused, m.holder, m.busContact,
		stat("fan_ipmover_garp_sent_total", "Announcements sent.", "arp_request", func(s announce.Stats) uint64 { return s.ARPRequests }),
		stat("fan_ipmover_garp_sent_total", "Announcements sent.", "arp_reply", func(s announce.Stats) uint64 { return s.ARPReplies }),
		stat("fan_ipmover_garp_sent_total", "Announcements sent.", "ndp_na", func(s announce.Stats) uint64 { return s.NAs }),
		stat("fan_ipmover_arp_probes_total", "ARP probes sent before claims.", "probe", func(s announce.Stats) uint64 { return s.Probes }),
		stat("fan_ipmover_announce_errors_total", "Announcement or probe packets that could not be sent.", "send", func(s announce.Stats) uint64 { return s.SendErrors }),
	}
	return m
}
