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

// generate writes c's bundles into a temporary directory and returns it.
func generate(t *testing.T, c Cluster) string {
	t.Helper()
	c.defaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if _, err := Generate(c, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestWitnessShapeBundles(t *testing.T) {
	out := generate(t, witnessCluster())
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

// Every file a generated bus section names is in the bundle it ships in,
// for every identity of the witness shape: -check-config refuses a service
// whose credential is missing, so a gap here keeps that service from
// starting (it did for the standby arbiters' system-account seed).
func TestWitnessShapeBundlesHoldEveryFileTheyName(t *testing.T) {
	c := witnessCluster()
	c.Operators, c.Auditors, c.Viewers = []string{"alice"}, []string{"carol"}, []string{"noc"}
	out := generate(t, c)
	c.defaults()
	// Paths in a bundle are where it is installed: fan_dir on fan's hosts.
	pathKeys := map[string]bool{"nkey_seed": true, "creds": true, "ca": true, "cert": true, "key": true}
	var walk func(file string, node *yaml.Node, bundle string) int
	walk = func(file string, node *yaml.Node, bundle string) int {
		named := 0
		for i := 0; i+1 < len(node.Content); i++ {
			k, v := node.Content[i], node.Content[i+1]
			if node.Kind == yaml.MappingNode && i%2 == 0 && pathKeys[k.Value] && v.Kind == yaml.ScalarNode {
				rel, ok := strings.CutPrefix(v.Value, c.FanDir+"/")
				if !ok {
					t.Errorf("%s: %s %q is not under %s", file, k.Value, v.Value, c.FanDir)
					continue
				}
				if _, err := os.Stat(filepath.Join(bundle, rel)); err != nil {
					t.Errorf("%s names %s %q, which its bundle lacks", file, k.Value, v.Value)
				}
				named++
			}
		}
		for _, ch := range node.Content {
			named += walk(file, ch, bundle)
		}
		return named
	}
	checked := 0
	for _, host := range []string{"n1", "n2", "ctl", "alice", "carol", "noc", "admin"} {
		files, err := filepath.Glob(filepath.Join(Bundle(out, host), "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("bundle %s: no configuration files (%v)", host, err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var doc yaml.Node
			if err := yaml.Unmarshal(b, &doc); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if walk(f, &doc, Bundle(out, host)) == 0 {
				t.Errorf("%s names no credential at all", f)
			}
			checked++
		}
	}
	// Each PBX host: prober, ipmover, replicator, arbiter; the witness:
	// arbiter, scheduler; a fanctl.yaml per person and the admin.
	if checked != 4+4+2+4 {
		t.Errorf("checked %d configuration files, want 14", checked)
	}
}
