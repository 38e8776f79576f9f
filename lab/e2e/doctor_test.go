package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/lab/bench"
	"github.com/fanpbx/fan/lab/leaders"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nkeys"
)

// doctorFinding and doctorReport are `fanctl doctor --json`'s output.
type doctorFinding struct {
	Severity string `json:"severity"`
	Check    string `json:"check"`
	Subject  string `json:"subject"`
	Message  string `json:"message"`
	Fix      string `json:"fix"`
}

type doctorReport struct {
	Findings []doctorFinding `json:"findings"`
	Errors   int             `json:"errors"`
	Warnings int             `json:"warnings"`
}

// expect is one finding a case must produce: its check, severity, and a
// text its subject or message contains.
type expect struct {
	check, severity, text string
}

// doctorCase is one misconfiguration: how the AMI peer standing in for this
// node's Asterisk is set up, how the files differ from the lab's, and what
// doctor must say.
type doctorCase struct {
	name  string
	peer  func(*amipeer.Config)
	files func(t *testing.T, dir string)
	// host changes n1's namespace for the case and returns the undo; such
	// cases run alone.
	host func(ctx context.Context, t *testing.T) (undo func())
	// asteriskDefault leaves pjsip.conf's [global] at Asterisk's default
	// send_contact_status_on_update_registration = no.
	asteriskDefault bool
	want            []expect
}

// The lab's names (lab/netlab, lab/stack).
const (
	doctorNode  = "n1"
	n1Addr      = "198.51.100.11"
	n2Addr      = "198.51.100.12"
	floatingIP  = "198.51.100.10"
	labAMI      = "127.0.0.1:5038"
	labSecret   = "lab-secret"
	labSystem   = "fan-lab"
	bareNATSURL = "nats://127.0.0.1:14222"
)

// cleanPeer is n1's Asterisk as deploy/asterisk sets it up: fan's user with
// the rights fan needs, a transport on the node's address and one on the
// floating address, both writing the floating address in dialogs, and
// endpoints whose calls survive a failover.
func cleanPeer() amipeer.Config {
	return amipeer.Config{
		Addr:       "127.0.0.1:0",
		SystemName: labSystem,
		Users:      []amipeer.User{{Name: "fan", Secret: labSecret, Read: []string{"system"}, Write: []string{"system", "command"}}},
		Transports: []amipeer.Transport{
			{ID: "transport-node", Bind: n1Addr + ":5060", ExternalSignalingAddress: floatingIP, ExternalMediaAddress: floatingIP},
			{ID: "transport-float", Bind: floatingIP + ":5060", ExternalSignalingAddress: floatingIP, ExternalMediaAddress: floatingIP},
		},
		Endpoints: []amipeer.Endpoint{{Name: "6001", Timers: "no"}, {Name: "6002", Timers: "no"}},
	}
}

// TestDoctor runs `fanctl doctor` on n1 of one secure colocated lab (three
// NATS servers, the standby arbiter beside n1's services) against every
// misconfiguration it must find, and against the lab as it runs, where it
// must find no error. Each case runs doctor as a process in n1's namespace
// on a copy of n1's files with the case's change, and with an AMI peer of
// its own (in n1's namespace) standing in for n1's Asterisk. The clock
// cannot be put out of step inside a namespace (it is the machine's), so
// its verdict is whatever the machine's is (a warning at worst); the check
// itself is tested through its seam in cmd/internal/doctor.
func TestDoctor(t *testing.T) {
	ctx, l, st, _ := startLab(t, 4*time.Minute, stack.Options{Topology: stack.TopologyColocated, SecureBus: true,
		LeaderPlacement: true, StandbyArbiters: true, AMISystemName: labSystem})
	bin := stack.BinDirForTest(t)
	waitSettled(ctx, t, st, l)

	base := t.TempDir()
	for _, svc := range []string{"prober", "ipmover", "replicator", "arbiter"} {
		b, err := os.ReadFile(st.ConfigPath(doctorNode, svc))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(base, svc+".yaml"), string(b))
	}
	writeFile(t, filepath.Join(base, "nats.yaml"), fmt.Sprintf("server_name: %s\nlisten: %s:4222\nserver_config: %s\n",
		st.ServerName(doctorNode), n1Addr, st.NATSServerConfig(doctorNode)))

	caDir := filepath.Join(st.Bundle(doctorNode), "..", "..", "ca")
	cases := []doctorCase{
		{name: "interface missing", files: edit("ipmover.yaml", "interface: eth0", "interface: eth9"),
			want: []expect{{"host.interface", "error", "eth9"}}},
		{name: "floating address outside the interface's subnet", files: edit("ipmover.yaml", "prefixes: ["+floatingIP+"/24]", "prefixes: [203.0.113.10/24]"),
			want: []expect{{"host.floating-subnet", "error", "203.0.113.10/24"}}},
		{name: "ipmover prefixes not covering the arbiter's address", files: edit("ipmover.yaml", "prefixes: ["+floatingIP+"/24]", "prefixes: [198.51.100.20/24]"),
			want: []expect{{"host.prefix-cover", "error", floatingIP + "/24"}}},
		{name: "AMI wrong secret", files: editAll("secret: "+labSecret, "secret: wrong"),
			want: []expect{{"asterisk.login", "error", "refused the login"}}},
		{name: "AMI user without the rights", peer: func(c *amipeer.Config) { c.Users[0].Write = []string{"call"} },
			want: []expect{{"asterisk.rights", "error", "Command, CoreStatus"}, {"asterisk.rights", "error", "DBGet, DBGetTree, DBPut, DBDel, Filter"}}},
		{name: "AMI user not reading class system", peer: func(c *amipeer.Config) { c.Users[0].Read = []string{"call"} },
			want: []expect{{"asterisk.events", "error", "does not read class system"}}},
		{name: "refreshes raise no event", asteriskDefault: true,
			want: []expect{{"sip.contact-status", "warning", "send_contact_status_on_update_registration"}}},
		{name: "no transport answering on the prober's address", files: edit("prober.yaml", "address: "+n1Addr+":5060", "address: "+n1Addr+":5070"),
			want: []expect{{"sip.self", "error", n1Addr + ":5070"}}},
		{name: "no transport on the floating address", peer: func(c *amipeer.Config) { c.Transports = c.Transports[:1] },
			want: []expect{{"sip.floating", "error", floatingIP + ":5060"}}},
		{name: "only a transport on 0.0.0.0", peer: func(c *amipeer.Config) {
			c.Transports = []amipeer.Transport{{ID: "transport-any", Bind: "0.0.0.0:5060"}}
		}, want: []expect{{"sip.floating", "warning", "0.0.0.0"}, {"sip.contact", "warning", "node's own address"}}},
		{name: "timers on and direct_media off", peer: func(c *amipeer.Config) {
			c.Endpoints = []amipeer.Endpoint{{Name: "6001"}, {Name: "6002", Timers: "no", NoDirectMedia: true}}
		}, want: []expect{{"sip.timers", "warning", "6001 (yes)"}, {"sip.direct-media", "warning", "6002"}}},
		{name: "Contact carrying the node's address", peer: func(c *amipeer.Config) {
			for i := range c.Transports {
				c.Transports[i].ExternalSignalingAddress = ""
			}
		}, want: []expect{{"sip.contact", "warning", "transport-node"}}},
		{name: "systemname differing between the nodes", peer: func(c *amipeer.Config) { c.SystemName = "pbx-other" },
			want: []expect{{"asterisk.systemname", "error", `"` + labSystem + `"`}}},
		{name: "wrong nkey seed", files: func(t *testing.T, dir string) {
			kp, err := nkeys.CreateUser()
			if err != nil {
				t.Fatal(err)
			}
			seed, _ := kp.Seed()
			writeFile(t, filepath.Join(dir, "stranger.nk"), string(seed))
			replaceIn(t, filepath.Join(dir, "prober.yaml"), filepath.Join(st.Bundle(doctorNode), "prober.nk"), filepath.Join(dir, "stranger.nk"))
		}, want: []expect{{"bus.connect", "error", "authorization violation"}}},
		{name: "certificate and key not matching", files: edit("prober.yaml",
			filepath.Join(st.Bundle(doctorNode), "prober-key.pem"), filepath.Join(st.Bundle(doctorNode), "ipmover-key.pem")),
			want: []expect{{"bus.tls", "error", "do not match"}}},
		{name: "certificate expiring within 30 days", files: func(t *testing.T, dir string) {
			cert, key := issueClientCert(t, caDir, dir, 10*24*time.Hour)
			replaceIn(t, filepath.Join(dir, "prober.yaml"), filepath.Join(st.Bundle(doctorNode), "prober-cert.pem"), cert)
			replaceIn(t, filepath.Join(dir, "prober.yaml"), filepath.Join(st.Bundle(doctorNode), "prober-key.pem"), key)
		}, want: []expect{{"bus.cert-expiry", "warning", "in 9 days"}, {"bus.connect", "ok", "prober@n1"}}},
		{name: "streams not provisioned", files: func(t *testing.T, dir string) {
			for _, f := range []string{"ipmover.yaml", "replicator.yaml", "arbiter.yaml", "nats.yaml"} {
				_ = os.Remove(filepath.Join(dir, f))
			}
			writeFile(t, filepath.Join(dir, "prober.yaml"), "cluster: lab\nnode: n1\nbus:\n  url: "+bareNATSURL+"\nchecks: []\n")
		}, want: []expect{{"bus.streams", "error", "FAN_EVENTS"}, {"bus.streams", "error", "KV_fan_state"}}},
		{name: "names disagreeing", files: func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, "prober.yaml"), "cluster: lab", "cluster: other")
			replaceIn(t, filepath.Join(dir, "ipmover.yaml"), "node: n1", "node: n9")
			replaceIn(t, filepath.Join(dir, "replicator.yaml"), "group: pbx", "group: nogroup")
		}, want: []expect{{"names.cluster", "error", `"other"`}, {"names.node", "error", `"n9"`}, {"names.group", "error", `"nogroup"`}}},
		{name: "bus.url order wrong", files: func(t *testing.T, dir string) {
			// The other PBX node's server first, as if every host listed
			// n2's first.
			path := filepath.Join(dir, "prober.yaml")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var url string
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "url: "); ok {
					url = v
				}
			}
			urls := strings.Split(url, ",")
			if len(urls) != 3 || !strings.Contains(urls[2], n2Addr) {
				t.Fatalf("prober.yaml's bus.url is %q, want n1's, the witness's and n2's servers", url)
			}
			replaceIn(t, path, url, strings.Join([]string{urls[2], urls[0], urls[1]}, ","))
		}, want: []expect{{"order.bus-url", "error", "prober.yaml"}}},
		{name: "ip_nonlocal_bind 0 in hot mode", host: func(ctx context.Context, t *testing.T) func() {
			sysctl(ctx, t, l, "net.ipv4.ip_nonlocal_bind=0")
			return func() { sysctl(ctx, t, l, "net.ipv4.ip_nonlocal_bind=1") }
		}, want: []expect{{"host.nonlocal-bind", "error", "net.ipv4.ip_nonlocal_bind"}}},
		{name: "ports unreachable", host: func(ctx context.Context, t *testing.T) func() {
			// New connections only (SYN): the routes and clients already
			// up keep running while doctor looks.
			rules := [][]string{
				{"OUTPUT", "-p", "tcp", "--syn", "-d", n2Addr, "--dport", "6222", "-m", "comment", "--comment", "fan-doctor-test", "-j", "DROP"},
				{"OUTPUT", "-p", "tcp", "--syn", "-d", n2Addr, "--dport", "4222", "-m", "comment", "--comment", "fan-doctor-test", "-j", "DROP"},
			}
			for _, r := range rules {
				if out, err := l.Exec(ctx, doctorNode, append([]string{"iptables", "-w", "-I"}, r...)...); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
			}
			return func() {
				for _, r := range rules {
					if out, err := l.Exec(context.Background(), doctorNode, append([]string{"iptables", "-w", "-D"}, r...)...); err != nil {
						t.Errorf("remove the rule: %v: %s", err, out)
					}
				}
			}
		}, want: []expect{{"port.route", "error", n2Addr + ":6222"}, {"port.nats", "error", n2Addr + ":4222"}}},
	}

	// The server of the unprovisioned case: fan's own, alone, in n1.
	bare, err := l.Start(doctorNode, "fan-nats-bare", []string{filepath.Join(bin, "fan-nats"), "-listen", strings.TrimPrefix(bareNATSURL, "nats://"),
		"-store", filepath.Join(t.TempDir(), "bare"), "-name", "bare"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bare.Stop() }()

	runCase := func(t *testing.T, c doctorCase) (doctorReport, string) {
		dir := t.TempDir()
		copyDir(t, base, dir)
		cfg := cleanPeer()
		if c.peer != nil {
			c.peer(&cfg)
		}
		peer := startDoctorPeer(t, l, cfg)
		if !c.asteriskDefault {
			peer.EnableRegistrar(amipeer.RegistrarConfig{SendContactStatusOnUpdate: true})
		}
		for _, f := range []string{"prober.yaml", "ipmover.yaml", "replicator.yaml"} {
			replaceIn(t, filepath.Join(dir, f), labAMI, peer.Addr())
		}
		if c.files != nil {
			c.files(t, dir)
		}
		rep, text := runDoctor(ctx, t, l, bin, dir)
		t.Logf("doctor:\n%s", text)
		for _, w := range c.want {
			if !hasFinding(rep, w) {
				t.Errorf("no %s %s finding naming %q:\n%s", w.severity, w.check, w.text, text)
			}
		}
		return rep, text
	}

	// The lab as it runs: no error. Alone, first: the others load the machine.
	t.Run("clean", func(t *testing.T) {
		rep, text := runCase(t, doctorCase{})
		if rep.Errors != 0 {
			t.Errorf("a clean lab has %d errors:\n%s", rep.Errors, text)
		}
		for _, w := range []expect{{"bus.connect", "ok", "arbiter@n1"}, {"order.bus-url", "ok", "prober.yaml"},
			{"asterisk.systemname", "ok", "n2"}, {"sip.contact", "ok", floatingIP}, {"bus.peers", "ok", "meta group"}} {
			if !hasFinding(rep, w) {
				t.Errorf("clean lab: no %s %s naming %q", w.severity, w.check, w.text)
			}
		}
	})
	// The cases that change only their own files and peer, a few at a time.
	t.Run("files", func(t *testing.T) {
		sem := make(chan struct{}, 4)
		for _, c := range cases {
			if c.host != nil {
				continue
			}
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				runCase(t, c)
			})
		}
	})
	// The cases that change n1 itself, one by one.
	for _, c := range cases {
		if c.host == nil {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			undo := c.host(ctx, t)
			defer undo()
			runCase(t, c)
		})
	}
}

// waitSettled waits until the arbiter has placed the address (its group
// status records are on the bus) and every raft group has current replicas,
// so what doctor reads of a clean lab is clean.
func waitSettled(ctx context.Context, t *testing.T, st *stack.Stack, l *netlab.Lab) {
	t.Helper()
	c, err := bench.NewClient(l)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Holder(ctx, 90*time.Second)
	c.Close()
	if err != nil {
		t.Fatalf("initial placement: %v", err)
	}
	admin, err := dial(st, l, "admin", stack.LabAdmin, "admin")
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	defer admin.nc.Close()
	waittest.Succeeds(t, 60*time.Second, "raft groups settled", func() error {
		gs, err := leaders.List(ctx, admin.js)
		if err == nil && !leaders.Settled(gs) {
			err = fmt.Errorf("not settled: %s", leaders.Describe(gs))
		}
		return err
	})
}

// startDoctorPeer starts an AMI peer listening in n1's namespace (a socket
// stays in the namespace it was made in), closed with the test.
func startDoctorPeer(t *testing.T, l *netlab.Lab, cfg amipeer.Config) *amipeer.Peer {
	t.Helper()
	var p *amipeer.Peer
	if err := l.Do(doctorNode, func() error {
		var err error
		p, err = amipeer.Start(cfg)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// runDoctor runs `fanctl doctor --json` in n1's namespace on dir, and the
// text form of the same for a failure's message.
func runDoctor(ctx context.Context, t *testing.T, l *netlab.Lab, bin, dir string) (doctorReport, string) {
	t.Helper()
	h, err := l.Host(doctorNode)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) ([]byte, []byte, error) {
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, filepath.Join(bin, "fanctl"), "doctor", "--etc", dir}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.Bytes(), stderr.Bytes(), err
	}
	start := time.Now()
	out, errOut, err := run("--json")
	took := time.Since(start)
	var rep doctorReport
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		t.Fatalf("doctor --json: %v (%v): %s %s", jerr, err, out, errOut)
	}
	var ee *exec.ExitError
	switch {
	case rep.Errors > 0 && !errors.As(err, &ee):
		t.Errorf("doctor found %d errors and exited %v, want exit status 1", rep.Errors, err)
	case rep.Errors == 0 && err != nil:
		t.Errorf("doctor found no error and exited %v: %s", err, errOut)
	}
	text, _, _ := run()
	t.Logf("doctor took %v", took.Round(10*time.Millisecond))
	return rep, string(text)
}

func hasFinding(rep doctorReport, w expect) bool {
	for _, f := range rep.Findings {
		if f.Check == w.check && f.Severity == w.severity && strings.Contains(f.Subject+" "+f.Message, w.text) {
			return true
		}
	}
	return false
}

func sysctl(ctx context.Context, t *testing.T, l *netlab.Lab, kv string) {
	t.Helper()
	if out, err := l.Exec(ctx, doctorNode, "sysctl", "-w", kv); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

func edit(file, from, to string) func(*testing.T, string) {
	return func(t *testing.T, dir string) { replaceIn(t, filepath.Join(dir, file), from, to) }
}

// editAll changes every service file that holds from.
func editAll(from, to string) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		for _, f := range []string{"prober.yaml", "ipmover.yaml", "replicator.yaml"} {
			replaceIn(t, filepath.Join(dir, f), from, to)
		}
	}
}

func replaceIn(t *testing.T, path, from, to string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), from) {
		t.Fatalf("%s does not contain %q:\n%s", path, from, b)
	}
	writeFile(t, path, strings.ReplaceAll(string(b), from, to))
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(to, e.Name()), string(b))
	}
}

// issueClientCert writes a client certificate and key issued by the lab's
// CA that expire in validFor, as a renewal forgotten would leave them.
func issueClientCert(t *testing.T, caDir, dir string, validFor time.Duration) (certPath, keyPath string) {
	t.Helper()
	caCert := readPEM(t, filepath.Join(caDir, "ca.pem"))
	ca, err := x509.ParseCertificate(caCert)
	if err != nil {
		t.Fatal(err)
	}
	caKeyDER := readPEM(t, filepath.Join(caDir, "ca-key.pem"))
	var caKey any
	if caKey, err = x509.ParsePKCS8PrivateKey(caKeyDER); err != nil {
		if caKey, err = x509.ParseECPrivateKey(caKeyDER); err != nil {
			t.Fatalf("the lab CA's key: %v", err)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "prober@n1 (expiring)"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validFor),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, IPAddresses: []net.IP{net.ParseIP(n1Addr)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "expiring-cert.pem"), filepath.Join(dir, "expiring-key.pem")
	writeFile(t, certPath, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, keyPath, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	return certPath, keyPath
}

func readPEM(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	return blk.Bytes
}
