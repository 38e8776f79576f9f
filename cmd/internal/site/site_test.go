package site_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fanpbx/fan/cmd/internal/site"
	"go.yaml.in/yaml/v3"
)

// goodSite is the production shape: two PBX hosts and a witness.
const goodSite = `cluster: prod
hosts:
  - {name: pbx-a, role: pbx, address: 192.0.2.11, interface: ens18}
  - {name: pbx-b, role: pbx, address: 192.0.2.12, interface: ens18}
  - {name: ctl, role: witness, address: 192.0.2.2}
groups:
  - name: pbx
    addresses: [192.0.2.10/24]
    nodes: [pbx-a, pbx-b]
    failback_windows:
      - name: nightly
        time_zone: Europe/Berlin
        weekly: [{days: [daily], from: "02:00", to: "05:00"}]
people:
  operators: [alice]
  auditors: [carol]
`

func writeSite(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "site.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, body string) site.Site {
	t.Helper()
	s, warns, err := site.Load(writeSite(t, t.TempDir(), body))
	if err != nil {
		t.Fatalf("the site is refused: %v", err)
	}
	for _, w := range warns {
		t.Logf("warning: %s", w)
	}
	return s
}

func initSite(t *testing.T, s site.Site, out string) site.InitResult {
	t.Helper()
	res, err := site.Init(s, site.InitOptions{Out: out})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestLoadReportsEveryError(t *testing.T) {
	bad := `cluster: prod
hosts:
  - {name: pbx-a, role: pbx, address: 192.0.2.11}
  - {name: pbx-b, role: pbc, address: 192.0.2.11, interface: ens18}
  - {name: ctl, role: witness, address: nowhere}
groups:
  - name: pbx
    addresses: [192.0.2.10]
    nodes: [pbx-a, ctl, pbx-z]
    failback_windows:
      - name: nightly
        time_zone: Mars/Olympus
        weekly: [{days: [someday], from: "2am", to: "05:00"}]
asterisk:
  answer: warm
people:
  operators: [pbx-a]
`
	_, _, err := site.Load(writeSite(t, t.TempDir(), bad))
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		"hosts[0].interface",
		"hosts[1].role",
		"hosts[1].address: 192.0.2.11 is already pbx-a's address",
		"hosts[2].address",
		"groups[0].addresses[0]",
		"groups[0].nodes[1]: \"ctl\" is a witness",
		"groups[0].nodes[2]: \"pbx-z\" is not a host",
		"failback_windows[0].time_zone",
		"weekly[0].days: unknown day \"someday\"",
		"weekly[0].from: want HH:MM",
		"asterisk.answer",
		"people.operators[0]: \"pbx-a\" is already a host",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not name %q:\n%s", want, msg)
		}
	}
}

func TestLoadRefusesShapesThatCannotFailOver(t *testing.T) {
	for name, body := range map[string]string{
		"one pbx host": `cluster: c
hosts:
  - {name: a, role: pbx, address: 192.0.2.11, interface: eth0}
  - {name: w, role: witness, address: 192.0.2.2}
  - {name: w2, role: witness, address: 192.0.2.3}
groups: [{name: g, addresses: [192.0.2.10/24], nodes: [a]}]
`,
		"no witness": `cluster: c
hosts:
  - {name: a, role: pbx, address: 192.0.2.11, interface: eth0}
  - {name: b, role: pbx, address: 192.0.2.12, interface: eth0}
  - {name: d, role: pbx, address: 192.0.2.13, interface: eth0}
groups: [{name: g, addresses: [192.0.2.10/24], nodes: [a, b, d]}]
`,
		"an even number of servers": `cluster: c
hosts:
  - {name: a, role: pbx, address: 192.0.2.11, interface: eth0}
  - {name: b, role: pbx, address: 192.0.2.12, interface: eth0}
  - {name: w, role: witness, address: 192.0.2.2}
  - {name: w2, role: witness, address: 192.0.2.3}
groups: [{name: g, addresses: [192.0.2.10/24], nodes: [a, b]}]
`,
		"a host in two groups": `cluster: c
hosts:
  - {name: a, role: pbx, address: 192.0.2.11, interface: eth0}
  - {name: b, role: pbx, address: 192.0.2.12, interface: eth0}
  - {name: w, role: witness, address: 192.0.2.2}
groups:
  - {name: g, addresses: [192.0.2.10/24], nodes: [a, b]}
  - {name: h, addresses: [192.0.2.20/24], nodes: [b, a]}
`,
		"a floating address that is a host's": `cluster: c
hosts:
  - {name: a, role: pbx, address: 192.0.2.11, interface: eth0}
  - {name: b, role: pbx, address: 192.0.2.12, interface: eth0}
  - {name: w, role: witness, address: 192.0.2.2}
groups: [{name: g, addresses: [192.0.2.11/24], nodes: [a, b]}]
`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := site.Load(writeSite(t, t.TempDir(), body)); err == nil {
				t.Fatal("accepted")
			} else {
				t.Log(err)
			}
		})
	}
}

// readPlan reads a host's plan and the content of its files.
func readBundle(t *testing.T, out, host string) (site.Plan, map[string]string) {
	t.Helper()
	dir := filepath.Join(out, site.HostsOut, host)
	p, err := site.ReadPlan(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range p.Files {
		b, err := os.ReadFile(filepath.Join(dir, site.FilesDir, f.Path))
		if err != nil {
			t.Fatal(err)
		}
		files[f.Path] = string(b)
	}
	return p, files
}

func TestInitWritesEachHostWhatItRuns(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	s := load(t, goodSite)
	res := initSite(t, s, out)
	if len(res.Hosts) != 3 {
		t.Fatalf("bundles: %+v", res.Hosts)
	}
	for _, h := range res.Hosts {
		if !h.New {
			t.Errorf("%s: not new on a first run", h.Host)
		}
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the output directory holds every secret: mode %v %v, want 0700", st.Mode().Perm(), err)
	}

	pa, fa := readBundle(t, out, "pbx-a")
	if want := []string{"fan-nats", "fan-arbiter", "fan-prober", "fan-replicator", "fan-ipmover"}; !slices.Equal(pa.Units, want) {
		t.Errorf("pbx-a units %v, want %v", pa.Units, want)
	}
	pc, fc := readBundle(t, out, "ctl")
	if want := []string{"fan-nats", "fan-arbiter", "fan-scheduler", "fan-status"}; !slices.Equal(pc.Units, want) {
		t.Errorf("ctl units %v, want %v", pc.Units, want)
	}
	for _, p := range []string{"/etc/fan/prober.yaml", "/etc/fan/ipmover.yaml", "/etc/fan/replicator.yaml", "/etc/fan/arbiter.yaml",
		"/etc/fan/nats.yaml", "/etc/fan/bus/prober.nk", "/etc/fan/bus/arbiter-system.nk", "/etc/fan/nats/nats-server.conf",
		"/etc/fan/nats/server-key.pem", site.SysctlFile} {
		if _, ok := fa[p]; !ok {
			t.Errorf("pbx-a's bundle lacks %s", p)
		}
	}
	for _, p := range []string{"/etc/fan/scheduler.yaml", "/etc/fan-status/status.yaml", "/etc/fan-status/viewer.nk", "/etc/fan-status/page.token"} {
		if _, ok := fc[p]; !ok {
			t.Errorf("ctl's bundle lacks %s", p)
		}
	}

	// Secrets go only where their identity runs.
	for path := range fa {
		if strings.HasPrefix(path, site.StatusDir) || strings.Contains(path, "scheduler") || strings.Contains(path, "operator") || strings.Contains(path, "admin") {
			t.Errorf("pbx-a's bundle holds %s", path)
		}
	}
	for path, body := range fc {
		if strings.Contains(path, "prober") || strings.Contains(path, "ipmover") || strings.Contains(path, "replicator") ||
			strings.Contains(path, "operator") || strings.Contains(path, "admin") || strings.Contains(path, "auditor") {
			t.Errorf("ctl's bundle holds %s", path)
		}
		if strings.Contains(body, "secret:") {
			t.Errorf("ctl's %s holds an AMI secret", path)
		}
	}
	// Modes: seeds and keys for the service's group only; the page's for
	// its own user, which is not fan.
	for _, f := range append(append([]site.PlanFile{}, pa.Files...), pc.Files...) {
		secret := strings.HasSuffix(f.Path, ".nk") || strings.HasSuffix(f.Path, "-key.pem") || strings.HasSuffix(f.Path, ".token") || strings.HasSuffix(f.Path, ".yaml")
		if secret && (f.Mode&0o007 != 0 || f.Owner != "root") {
			t.Errorf("%s: %s:%s %04o, others may read it", f.Path, f.Owner, f.Group, f.Mode)
		}
		if strings.HasPrefix(f.Path, site.StatusDir) && secret && f.Group != site.UserStatus {
			t.Errorf("%s: group %s, want %s", f.Path, f.Group, site.UserStatus)
		}
		if !strings.HasPrefix(f.Path, site.StatusDir) && secret && f.Group != site.UserFan {
			t.Errorf("%s: group %s, want %s", f.Path, f.Group, site.UserFan)
		}
	}

	// The services' bus.url: the host's own server first, then the witness's.
	var prober struct {
		Bus struct {
			URL string `yaml:"url"`
		} `yaml:"bus"`
		Checks []struct {
			Name, Address, Secret string
		} `yaml:"checks"`
	}
	if err := yaml.Unmarshal([]byte(fa["/etc/fan/prober.yaml"]), &prober); err != nil {
		t.Fatal(err)
	}
	if want := "tls://192.0.2.11:4222,tls://192.0.2.2:4222,tls://192.0.2.12:4222"; prober.Bus.URL != want {
		t.Errorf("pbx-a's prober dials %s, want %s", prober.Bus.URL, want)
	}
	amiSecret := ""
	for _, c := range prober.Checks {
		if c.Name == "asterisk-ami" {
			amiSecret = c.Secret
		}
	}
	if len(amiSecret) < 16 || !strings.Contains(fa["/etc/fan/ipmover.yaml"], amiSecret) || !strings.Contains(fa["/etc/fan/replicator.yaml"], amiSecret) {
		t.Errorf("the AMI secret %q is not the same in the prober, ipmover and replicator", amiSecret)
	}
	mgr, err := os.ReadFile(filepath.Join(out, site.HostsOut, "pbx-a", "asterisk", "manager-fan.conf"))
	if err != nil || !strings.Contains(string(mgr), "secret = "+amiSecret) {
		t.Errorf("pbx-a's manager user does not carry the prober's secret: %v\n%s", err, mgr)
	}
	_, fb := readBundle(t, out, "pbx-b")
	if strings.Contains(fb["/etc/fan/prober.yaml"], amiSecret) {
		t.Error("pbx-b's AMI secret is pbx-a's")
	}
	var arb struct {
		Standby bool `yaml:"standby"`
		Bus     struct {
			LeaderServers []string `yaml:"leader_servers"`
		} `yaml:"bus"`
	}
	for host, files := range map[string]map[string]string{"pbx-a": fa, "ctl": fc} {
		if err := yaml.Unmarshal([]byte(files["/etc/fan/arbiter.yaml"]), &arb); err != nil {
			t.Fatal(err)
		}
		if arb.Standby != (host != "ctl") || !slices.Equal(arb.Bus.LeaderServers, []string{"nats-ctl"}) {
			t.Errorf("%s's arbiter: standby %v, leader servers %v", host, arb.Standby, arb.Bus.LeaderServers)
		}
	}

	// People's bundles name their files relative to their fanctl.yaml.
	b, err := os.ReadFile(filepath.Join(out, site.PeopleOut, "alice", "fanctl.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "nkey_seed: operator.nk") || !strings.Contains(string(b), "operator: alice") {
		t.Errorf("alice's fanctl.yaml:\n%s", b)
	}
	if _, err := os.Stat(filepath.Join(out, site.AdminOut, "admin.nk")); err != nil {
		t.Errorf("no admin bundle: %v", err)
	}
}

func TestInitAgainChangesWhatTheChangeImplies(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	initSite(t, load(t, goodSite), out)
	needed := func(res site.InitResult) []string {
		var hs []string
		for _, h := range res.Hosts {
			if h.Needed() {
				hs = append(hs, h.Host)
			}
		}
		return hs
	}
	if got := needed(initSite(t, load(t, goodSite), out)); len(got) != 0 {
		t.Fatalf("the same site again changed %v", got)
	}
	cases := []struct {
		name, from, to string
		hosts          []string
		files          []string
	}{
		{"pbx-b's interface", "address: 192.0.2.12, interface: ens18", "address: 192.0.2.12, interface: ens19",
			[]string{"pbx-b"}, []string{"/etc/fan/ipmover.yaml"}},
		{"the failback window", `from: "02:00"`, `from: "01:00"`,
			[]string{"ctl"}, []string{"/etc/fan/scheduler.yaml"}},
		{"a new operator", "operators: [alice]", "operators: [alice, bob]",
			[]string{"pbx-a", "pbx-b", "ctl"}, []string{"/etc/fan/nats/nats-server.conf"}},
	}
	body := goodSite
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body = strings.Replace(body, c.from, c.to, 1)
			res := initSite(t, load(t, body), out)
			if got := needed(res); !slices.Equal(got, c.hosts) {
				t.Errorf("hosts changed %v, want %v", got, c.hosts)
			}
			for _, h := range res.Hosts {
				if h.Needed() && !slices.Equal(h.Changed, c.files) {
					t.Errorf("%s: changed %v, want %v", h.Host, h.Changed, c.files)
				}
			}
		})
	}
	// Another cluster's name in the same directory is refused.
	if _, err := site.Init(load(t, strings.Replace(goodSite, "cluster: prod", "cluster: other", 1)), site.InitOptions{Out: out, SiteFile: []byte("cluster: other\n")}); err != nil {
		t.Logf("first run with a site copy: %v", err)
	}
	if err := os.WriteFile(filepath.Join(out, site.SiteCopy), []byte("cluster: prod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := site.Init(load(t, strings.Replace(goodSite, "cluster: prod", "cluster: other", 1)), site.InitOptions{Out: out}); err == nil {
		t.Error("a directory made for cluster prod accepted cluster other")
	}
}

func TestInstallHostUnderARoot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	initSite(t, load(t, goodSite), out)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc/asterisk"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := "[general]\nenabled = yes\nbindaddr = 127.0.0.1\n"
	if err := os.WriteFile(filepath.Join(root, "etc/asterisk/manager.conf"), []byte(conf), 0o640); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(out, site.HostsOut, "pbx-a")
	rep, err := site.InstallHost(context.Background(), bundle, site.InstallOptions{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := readBundle(t, out, "pbx-a")
	if len(rep.Changed) != len(p.Files)+1 {
		t.Errorf("wrote %d files, want the plan's %d and the manager user", len(rep.Changed), len(p.Files))
	}
	for _, f := range p.Files {
		st, err := os.Stat(filepath.Join(root, f.Path))
		if err != nil {
			t.Errorf("%s: %v", f.Path, err)
			continue
		}
		if st.Mode().Perm() != os.FileMode(f.Mode) {
			t.Errorf("%s: mode %04o, want %04o", f.Path, st.Mode().Perm(), f.Mode)
		}
	}
	mc, err := os.ReadFile(filepath.Join(root, "etc/asterisk/manager.conf"))
	if err != nil || !strings.HasPrefix(string(mc), conf) || strings.Count(string(mc), `#include "manager.d/fan.conf"`) != 1 {
		t.Errorf("manager.conf after install:\n%s", mc)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/asterisk/manager.d/fan.conf")); err != nil {
		t.Error(err)
	}
	rep, err = site.InstallHost(context.Background(), bundle, site.InstallOptions{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Changed) != 0 {
		t.Errorf("a second install changed %v", rep.Changed)
	}
}

func TestInstallHostRefusesAnotherHostsBundle(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	initSite(t, load(t, goodSite), out)
	rep, err := site.InstallHost(context.Background(), filepath.Join(out, site.HostsOut, "pbx-a"), site.InstallOptions{
		Addrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.12")}, nil },
	})
	if err == nil || !strings.Contains(err.Error(), "this is the bundle of pbx-a") {
		t.Fatalf("pbx-a's bundle on pbx-b: %v", err)
	}
	if len(rep.Changed) != 0 {
		t.Errorf("wrote %v before refusing", rep.Changed)
	}
}

// TestGeneratedConfigsPassCheckConfig runs each service's own
// -check-config on the files init wrote, moved under a temporary root:
// what init writes, the services take as it is.
func TestGeneratedConfigsPassCheckConfig(t *testing.T) {
	bin := os.Getenv("FAN_BIN")
	if bin == "" {
		t.Skip("FAN_BIN is not set (make test builds the binaries and sets it)")
	}
	root := t.TempDir()
	body := strings.ReplaceAll(goodSite, "interface: ens18", "interface: lo") + `replication:
  trees:
    - {name: etc, path: ` + filepath.Join(root, "etc/asterisk") + `}
`
	out := filepath.Join(t.TempDir(), "out")
	initSite(t, load(t, body), out)
	for _, host := range []string{"pbx-a", "ctl"} {
		hostRoot := filepath.Join(root, host)
		if _, err := site.InstallHost(context.Background(), filepath.Join(out, site.HostsOut, host), site.InstallOptions{Root: hostRoot}); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"var/lib/fan/ipmover", "var/lib/fan/replicator", "var/lib/fan/nats"} {
			if err := os.MkdirAll(filepath.Join(hostRoot, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(filepath.Join(root, "etc/asterisk"), 0o755); err != nil {
			t.Fatal(err)
		}
		p, err := site.ReadPlan(filepath.Join(out, site.HostsOut, host))
		if err != nil {
			t.Fatal(err)
		}
		relocate := strings.NewReplacer(`"/etc/fan`, `"`+hostRoot+"/etc/fan", `"/var/lib/fan`, `"`+hostRoot+"/var/lib/fan",
			" /etc/fan", " "+hostRoot+"/etc/fan", " /var/lib/fan", " "+hostRoot+"/var/lib/fan")
		conf := filepath.Join(hostRoot, "etc/fan/nats/nats-server.conf")
		nb, err := os.ReadFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(conf, []byte(relocate.Replace(string(nb))), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, u := range p.Units {
			svc := strings.TrimPrefix(u, "fan-")
			var path string
			var argv []string
			switch svc {
			case "status":
				continue
			case "nats":
				path = filepath.Join(hostRoot, "etc/fan/nats.yaml")
				argv = []string{filepath.Join(bin, "fan-nats"), "-config", path, "-check-config"}
			default:
				path = filepath.Join(hostRoot, "etc/fan", svc+".yaml")
				argv = []string{filepath.Join(bin, "fan-"+svc), "-check-config", path}
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(relocate.Replace(string(b))), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				t.Errorf("%s on %s: %v\n%s", u, host, err, out)
			}
		}
	}
}

// The plan's modes are octal strings, so an operator reads them as ls does.
func TestPlanModesAreOctal(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	initSite(t, load(t, goodSite), out)
	b, err := os.ReadFile(filepath.Join(out, site.HostsOut, "ctl", site.PlanName))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Files []struct {
			Path string `json:"path"`
			Mode string `json:"mode"`
		} `json:"files"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, f := range raw.Files {
		if f.Path == "/etc/fan-status/page.token" && f.Mode != "0640" {
			t.Errorf("page.token mode %q", f.Mode)
		}
	}
}

// TestExamplesAreInitsOutput: the per-service examples the package ships
// are what init writes from the example site file, so the examples, the
// site file and the generator cannot disagree. FAN_UPDATE_EXAMPLES=1
// rewrites them.
func TestExamplesAreInitsOutput(t *testing.T) {
	examples := filepath.Join("..", "..", "..", "deploy", "systemd", "examples")
	s, _, err := site.Load(filepath.Join(examples, "site.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	// Fixed secrets, so the examples do not change with every run.
	if err := os.MkdirAll(filepath.Join(out, site.SecretsOut), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"ami-pbx-a": "change-me-per-host", "ami-pbx-b": "change-me-per-host", "page.token": "change-me-page-token"} {
		if err := os.WriteFile(filepath.Join(out, site.SecretsOut, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	initSite(t, s, out)
	from := map[string]string{
		"prober": "pbx-a", "ipmover": "pbx-a", "replicator": "pbx-a", "nats": "pbx-a",
		"arbiter": "ctl", "scheduler": "ctl",
	}
	for svc, host := range from {
		compareExample(t, filepath.Join(out, site.HostsOut, host, site.FilesDir, site.EtcDir, svc+".yaml"), filepath.Join(examples, svc+".yaml"))
	}
	compareExample(t, filepath.Join(out, site.HostsOut, "ctl", site.FilesDir, site.StatusDir, "status.yaml"), filepath.Join(examples, "status.yaml"))
}

func compareExample(t *testing.T, generated, example string) {
	t.Helper()
	want, err := os.ReadFile(generated)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("FAN_UPDATE_EXAMPLES") == "1" {
		if err := os.WriteFile(example, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("%s is not what fanctl init writes from examples/site.yaml (FAN_UPDATE_EXAMPLES=1 go test -run TestExamplesAreInitsOutput ./internal/site rewrites it); init writes:\n%s", example, want)
	}
}
