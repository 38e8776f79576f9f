package natsconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanpbx/fan/pkg/events"
	"go.yaml.in/yaml/v3"
)

// witnessCluster is the production shape: a NATS server on each PBX host
// and on the witness, an arbiter replica beside each, the witness leading.
func witnessCluster() Cluster {
	pbx := []events.BusRole{events.RoleProber, events.RoleIPMover, events.RoleReplicator, events.RoleArbiter}
	return Cluster{
		Cluster: "c1",
		NATS: []Server{
			{Name: "nats-n1", Host: "n1.example.net", FanHost: "n1"},
			{Name: "nats-n2", Host: "n2.example.net", FanHost: "n2"},
			{Name: "nats-ctl", Host: "ctl.example.net", FanHost: "ctl"},
		},
		LeaderServers: []string{"nats-ctl"},
		Nodes:         []Host{{Name: "n1", Services: pbx}, {Name: "n2", Services: pbx}},
		Control:       []Host{{Name: "ctl"}},
	}
}

func TestWitnessShapeBundles(t *testing.T) {
	c := witnessCluster()
	c.defaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if _, err := Generate(c, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	type snippet struct {
		Bus struct {
			URL           string   `yaml:"url"`
			LeaderServers []string `yaml:"leader_servers"`
		} `yaml:"bus"`
		Standby bool `yaml:"standby"`
	}
	read := func(host string, role events.BusRole) snippet {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(Bundle(out, host), BusFile(string(role))))
		if err != nil {
			t.Fatal(err)
		}
		var s snippet
		if err := yaml.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s %s: %v", host, role, err)
		}
		return s
	}
	order := func(s snippet) string {
		var hosts []string
		for _, u := range strings.Split(s.Bus.URL, ",") {
			hosts = append(hosts, strings.TrimSuffix(strings.TrimPrefix(u, "tls://"), ".example.net:4222"))
		}
		return strings.Join(hosts, " ")
	}
	for _, tc := range []struct {
		host, order string
		standby     bool
	}{
		{"n1", "n1 ctl n2", true},
		{"n2", "n2 ctl n1", true},
		{"ctl", "ctl n1 n2", false},
	} {
		a := read(tc.host, events.RoleArbiter)
		if got := order(a); got != tc.order {
			t.Errorf("arbiter on %s dials %s, want its own server, the witness, the other: %s", tc.host, got, tc.order)
		}
		if a.Standby != tc.standby {
			t.Errorf("arbiter on %s: standby %v, want %v", tc.host, a.Standby, tc.standby)
		}
		if strings.Join(a.Bus.LeaderServers, ",") != "nats-ctl" {
			t.Errorf("arbiter on %s: leader_servers %v, want [nats-ctl]", tc.host, a.Bus.LeaderServers)
		}
	}
	if got := order(read("n1", events.RoleProber)); got != "n1 ctl n2" {
		t.Errorf("prober on n1 dials %s", got)
	}
	if p := read("n1", events.RoleProber); p.Standby || len(p.Bus.LeaderServers) > 0 {
		t.Errorf("a prober's bus section carries arbiter keys: %+v", p)
	}
}

func TestWitnessShapeRefusesUnknownNames(t *testing.T) {
	for name, mutate := range map[string]func(*Cluster){
		"leader server not a nats server": func(c *Cluster) { c.LeaderServers = []string{"nats-x"} },
		"fan_host not a host":             func(c *Cluster) { c.NATS[0].FanHost = "n9" },
		"two servers on one host":         func(c *Cluster) { c.NATS[1].FanHost = "n1" },
	} {
		c := witnessCluster()
		mutate(&c)
		c.defaults()
		if err := c.validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
