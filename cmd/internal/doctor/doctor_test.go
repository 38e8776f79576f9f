package doctor

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
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// write puts files (name -> content) into a new directory.
func write(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// procSys is a /proc/sys with ip_nonlocal_bind set to v.
func procSys(t *testing.T, v string) string {
	t.Helper()
	dir := t.TempDir()
	for _, fam := range []string{"ipv4", "ipv6"} {
		if err := os.MkdirAll(filepath.Join(dir, "net", fam), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "net", fam, "ip_nonlocal_bind"), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func synced() (ClockState, error) { return ClockState{MaxError: 20 * time.Millisecond}, nil }

func doctorRun(t *testing.T, o Options) Report {
	t.Helper()
	if o.Clock == nil {
		o.Clock = synced
	}
	if o.ProcSys == "" {
		o.ProcSys = procSys(t, "1")
	}
	o.Step = time.Second
	return Run(context.Background(), o)
}

// find returns the findings of check with severity sev whose subject or
// message holds text.
func find(rep Report, check string, sev Severity, text string) []Finding {
	var out []Finding
	for _, f := range rep.Findings {
		if f.Check == check && f.Severity == sev && strings.Contains(f.Subject+" "+f.Message, text) {
			out = append(out, f)
		}
	}
	return out
}

func must(t *testing.T, rep Report, check string, sev Severity, text string) Finding {
	t.Helper()
	fs := find(rep, check, sev, text)
	if len(fs) == 0 {
		var b bytes.Buffer
		_ = rep.WriteText(&b)
		t.Fatalf("no %s %s finding with %q:\n%s", sev, check, text, b.String())
	}
	return fs[0]
}

func TestNoFilesIsAnError(t *testing.T) {
	rep := doctorRun(t, Options{Etc: t.TempDir()})
	must(t, rep, "files.none", Error, "no fan configuration")
}

func TestUnreadableFileNamesItAndTheCheck(t *testing.T) {
	dir := write(t, map[string]string{"ipmover.yaml": "interface: [unclosed"})
	rep := doctorRun(t, Options{Etc: dir})
	f := must(t, rep, "files.read", Error, "ipmover.yaml")
	if !strings.Contains(f.Fix, "fan-ipmover -check-config") {
		t.Fatalf("fix %q", f.Fix)
	}
}

// The clock's verdict comes from the kernel through a seam: it cannot be
// put out of step in a test (it is the machine's).
func TestClockThroughItsSeam(t *testing.T) {
	// A bus that refuses at once: the clock is checked whatever the bus says.
	dir := write(t, map[string]string{"scheduler.yaml": "cluster: c\nnode: ctl\nbus:\n  url: nats://127.0.0.1:1\n"})
	for _, tc := range []struct {
		state ClockState
		err   error
		sev   Severity
		text  string
	}{
		{ClockState{Unsync: true, MaxError: 16 * time.Second}, nil, Warning, "STA_UNSYNC is set"},
		{ClockState{MaxError: 17 * time.Second}, nil, Warning, "error bound is 17s"},
		{ClockState{MaxError: 5 * time.Millisecond}, nil, OK, "synchronized"},
		{ClockState{}, errors.New("adjtimex: operation not permitted"), Warning, "operation not permitted"},
	} {
		rep := doctorRun(t, Options{Etc: dir, Clock: func() (ClockState, error) { return tc.state, tc.err }})
		must(t, rep, "host.clock", tc.sev, tc.text)
	}
	// And the real one answers on this machine, whatever it says.
	if _, err := kernelClock(); err != nil {
		t.Fatalf("adjtimex: %v", err)
	}
}

// The host checks on the test's own loopback interface: the floating
// addresses of the ipmover and of the arbiter's groups, the prefixes that
// must cover them, ip_nonlocal_bind in hot mode.
func TestHostChecks(t *testing.T) {
	files := func(prefixes, addresses, mode string) map[string]string {
		return map[string]string{
			"ipmover.yaml": "cluster: c\nnode: n1\ninterface: lo\nanswer: {mode: " + mode + "}\ngroups:\n  - {name: pbx, prefixes: [" + prefixes + "]}\n",
			"arbiter.yaml": "cluster: c\nnode: n1\ngroups:\n  - {name: pbx, addresses: [" + addresses + "], nodes: [n1, n2]}\n",
		}
	}
	rep := doctorRun(t, Options{Etc: write(t, files("127.0.0.50/8", "127.0.0.50/8", "hot"))})
	must(t, rep, "host.interface", OK, "127.0.0.1/8")
	must(t, rep, "host.floating-subnet", OK, "127.0.0.50/8")
	must(t, rep, "host.prefix-cover", OK, "127.0.0.50/8")
	must(t, rep, "host.nonlocal-bind", OK, "net.ipv4.ip_nonlocal_bind")
	for _, f := range rep.Findings {
		if f.Severity == Error && area(f.Check) == "host" {
			t.Fatalf("a good host: %+v", f)
		}
	}

	rep = doctorRun(t, Options{Etc: write(t, files("192.0.2.0/28", "192.0.2.10/24", "hot")), ProcSys: procSys(t, "0")})
	must(t, rep, "host.floating-subnet", Error, "192.0.2.0/28")
	must(t, rep, "host.prefix-cover", Error, "192.0.2.10/24")
	must(t, rep, "host.nonlocal-bind", Error, "is 0")

	rep = doctorRun(t, Options{Etc: write(t, files("127.0.0.50/8", "127.0.0.50/8", "reload")), ProcSys: procSys(t, "0")})
	must(t, rep, "host.nonlocal-bind", Skipped, "reload")

	missing := files("127.0.0.50/8", "127.0.0.50/8", "hot")
	missing["ipmover.yaml"] = strings.Replace(missing["ipmover.yaml"], "interface: lo", "interface: nosuch0", 1)
	must(t, doctorRun(t, Options{Etc: write(t, missing)}), "host.interface", Error, "nosuch0")

	// The arbiter lists this node in a group the ipmover does not have.
	other := files("127.0.0.50/8", "127.0.0.50/8", "hot")
	other["arbiter.yaml"] += "  - {name: sbc, addresses: [127.0.0.60/8], nodes: [n1]}\n"
	must(t, doctorRun(t, Options{Etc: write(t, other)}), "host.prefix-cover", Error, "no group sbc")
}

// Asterisk's side through the AMI peer: the rights fan's services need,
// the endpoints' settings, a wrong secret.
func TestAsteriskChecks(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{AuthFailDelay: -1, SystemName: "pbx", Users: []amipeer.User{
		{Name: "fan", Secret: "s", Read: []string{"system"}, Write: []string{"system", "command"}},
		{Name: "weak", Secret: "s", Write: []string{"command"}},
		{Name: "shipped", Secret: "s", Read: []string{"system", "call"}, Write: []string{"system", "command", "reporting"}},
	}, Transports: []amipeer.Transport{{ID: "t-node", Bind: "127.0.0.1:5060"}},
		Endpoints: []amipeer.Endpoint{{Name: "6001", Timers: "no"}, {Name: "6002"}, {Name: "6003", Timers: "no", NoDirectMedia: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	files := func(user, secret, mode string) map[string]string {
		ami := fmt.Sprintf("address: %s\n    username: %s\n    secret: %s", peer.Addr(), user, secret)
		return map[string]string{
			"prober.yaml":     "cluster: c\nnode: n1\nchecks:\n  - name: pbx-ami\n    kind: ami\n    " + ami + "\n",
			"replicator.yaml": "cluster: c\nnode: n1\ngroup: pbx\nastdb:\n  enabled: true\n  ami:\n    " + ami + "\n",
			"ipmover.yaml":    "cluster: c\nnode: n1\ninterface: lo\nanswer: {mode: " + mode + "}\nami:\n  " + strings.ReplaceAll(ami, "\n    ", "\n  ") + "\ngroups:\n  - {name: pbx, prefixes: [127.0.0.50/8]}\n",
		}
	}
	rep := doctorRun(t, Options{Etc: write(t, files("fan", "s", "reload"))})
	must(t, rep, "asterisk.login", OK, "prober check pbx-ami, ipmover (answer mode reload), replicator")
	must(t, rep, "asterisk.rights", OK, "Command, CoreStatus")
	must(t, rep, "asterisk.rights", OK, "Reload")
	must(t, rep, "asterisk.rights", OK, "DBGet, DBGetTree, DBPut, DBDel, Filter")
	// The recorder of calls (on by default with a login) reads with
	// Getvar, which write = system,command does not allow.
	f := must(t, rep, "asterisk.rights", Warning, "may not run Getvar (write class call or reporting): the calls in progress are not recorded")
	if !strings.Contains(f.Fix, "write = system,command,reporting") {
		t.Errorf("fix %q", f.Fix)
	}
	must(t, doctorRun(t, Options{Etc: write(t, files("shipped", "s", "reload"))}), "asterisk.rights", OK, "may run Getvar, CoreShowChannels")
	must(t, rep, "asterisk.rights", OK, "may run Command, PJSIPShowEndpoints, PJSIPShowEndpoint")
	// It hangs up what a planned move left here: write = system allows it.
	must(t, rep, "asterisk.rights", OK, "may run Hangup")
	must(t, rep, "sip.timers", Warning, "6002 (yes)")
	must(t, rep, "sip.direct-media", Warning, "6003")
	must(t, rep, "sip.transports", OK, "t-node udp 127.0.0.1:5060")
	// The replicator follows registration events: its user reads system,
	// and Asterisk has to raise them for refreshes too (the peer's
	// default, as Asterisk's, is no).
	must(t, rep, "asterisk.events", OK, "reads class system")
	must(t, rep, "sip.contact-status", Warning, "no: Asterisk raises no event")
	// 127.0.0.50 is a floating address no transport is bound to: as it
	// should be in answer mode reload while it is not here, and not in hot.
	must(t, rep, "sip.floating", Skipped, "answer mode reload")
	must(t, doctorRun(t, Options{Etc: write(t, files("fan", "s", "hot"))}), "sip.floating", Error, "127.0.0.50:5060")

	rep = doctorRun(t, Options{Etc: write(t, files("weak", "s", "reload"))})
	must(t, rep, "asterisk.rights", Error, "may not run CoreStatus")
	must(t, rep, "asterisk.rights", Error, "may not run Reload")
	must(t, rep, "asterisk.rights", Error, "may not run DBGet, DBGetTree, DBPut, DBDel, Filter")
	must(t, rep, "asterisk.rights", Warning, "may not run CoreSettings")
	must(t, rep, "sip.endpoints", Skipped, "may not run PJSIPShowEndpoints")
	must(t, rep, "asterisk.rights", Warning, "may not run PJSIPShowEndpoints, PJSIPShowEndpoint (write class system): its calls summary cannot report")
	must(t, rep, "asterisk.rights", Warning, "may not run Hangup (write class system or call): the channels of the calls a planned move leaves")
	must(t, rep, "asterisk.events", Error, "does not read class system")

	f = must(t, doctorRun(t, Options{Etc: write(t, files("fan", "wrong", "reload"))}), "asterisk.login", Error, "refused the login")
	if !strings.Contains(f.Fix, "[fan]") {
		t.Fatalf("fix %q does not name the manager.conf user", f.Fix)
	}
}

// FullyBooted after a login with events on tells a user who reads class
// system from one who does not.
func TestReadsSystemEvents(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{AuthFailDelay: -1, Users: []amipeer.User{
		{Name: "reader", Secret: "s", Read: []string{"system"}, Write: []string{"system"}},
		{Name: "deaf", Secret: "s", Read: []string{"call"}, Write: []string{"system"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	r := &run{o: Options{Step: time.Second}, out: &findings{}}
	r.o.defaults()
	for user, want := range map[string]bool{"reader": true, "deaf": false} {
		got, err := r.readsSystemEvents(context.Background(), amiSection{Address: peer.Addr(), Username: user, Secret: "s"})
		if err != nil || got != want {
			t.Errorf("%s: reads system %v, %v; want %v", user, got, err, want)
		}
	}
}

// The bus on an embedded JetStream: the streams missing until provisioned,
// the group status records and a cluster name nobody uses.
func TestBusStreamsAndNames(t *testing.T) {
	s := bustest.Server(t)
	url := s.ClientURL()
	files := map[string]string{
		"replicator.yaml": "cluster: lab\nnode: n1\ngroup: pbx\nbus:\n  url: " + url + "\n",
		"prober.yaml":     "cluster: lab\nnode: n1\nbus:\n  url: " + url + "\n",
	}
	rep := doctorRun(t, Options{Etc: write(t, files)})
	must(t, rep, "bus.connect", OK, "replicator@n1")
	f := must(t, rep, "bus.streams", Error, events.EventsStream)
	if !strings.Contains(f.Fix, "fanctl provision") {
		t.Fatalf("fix %q", f.Fix)
	}

	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "admin", Node: "t"})
	ctx := context.Background()
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.ProvisionObjectStores(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := b.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	status, _ := json.Marshal(events.GroupStatus{Group: "pbx", Addresses: []string{"127.0.0.50/8"},
		Nodes: map[string]events.NodeStatus{"n1": {}, "n2": {}}})
	if _, err := kv.Put(ctx, events.GroupStatusKey("lab", "pbx"), status); err != nil {
		t.Fatal(err)
	}
	rep = doctorRun(t, Options{Etc: write(t, files)})
	must(t, rep, "bus.streams", OK, "provisioned")
	must(t, rep, "names.group", OK, "replicator.yaml group pbx")
	// Only the arbiter may read heartbeats; none here.
	must(t, rep, "asterisk.systemname", Skipped, "")

	files["replicator.yaml"] = strings.Replace(files["replicator.yaml"], "group: pbx", "group: voip", 1)
	files["prober.yaml"] = strings.Replace(files["prober.yaml"], "cluster: lab", "cluster: prod", 1)
	rep = doctorRun(t, Options{Etc: write(t, files)})
	must(t, rep, "names.group", Error, `"voip" is not a group of the arbiter`)
	must(t, rep, "names.cluster", Error, `"prod"`)
}

// Certificates: a key of another certificate, one about to expire, one
// expired, one another CA issued.
func TestCredentials(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCA(t, dir, "ca")
	other, otherKey := newCA(t, dir, "other-ca")
	good := issue(t, dir, "good", ca, caKey, time.Now().Add(90*24*time.Hour))
	soon := issue(t, dir, "soon", ca, caKey, time.Now().Add(5*24*time.Hour))
	expired := issue(t, dir, "expired", ca, caKey, time.Now().Add(-time.Hour))
	foreign := issue(t, dir, "foreign", other, otherKey, time.Now().Add(90*24*time.Hour))
	seed := filepath.Join(dir, "bad.nk")
	if err := os.WriteFile(seed, []byte("not a seed"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &run{o: Options{}, out: &findings{}, caSeen: map[string]bool{}}
	svc := func(cert, key string) service {
		c := &common{Cluster: "c", Node: "n1"}
		c.Bus.TLS.CA, c.Bus.TLS.Cert, c.Bus.TLS.Key = filepath.Join(dir, "ca.pem"), cert+".pem", key+"-key.pem"
		return service{name: "prober", c: c}
	}
	for _, tc := range []struct {
		s      service
		usable bool
		check  string
		sev    Severity
		text   string
	}{
		{svc(good, good), true, "bus.cert-expiry", OK, "good valid until"},
		{svc(good, soon), false, "bus.tls", Error, "do not match"},
		{svc(soon, soon), true, "bus.cert-expiry", Warning, "in 4 days"},
		{svc(expired, expired), false, "bus.cert-expiry", Error, "expired on"},
		{svc(foreign, foreign), false, "bus.tls", Error, "not issued by bus.tls.ca"},
	} {
		r.out = &findings{}
		if got := r.checkCredentials(tc.s); got != tc.usable {
			t.Errorf("%s: usable %v, want %v", tc.s.c.Bus.TLS.Cert, got, tc.usable)
		}
		must(t, Report{Findings: r.out.sorted()}, tc.check, tc.sev, tc.text)
	}
	r.out = &findings{}
	s := svc(good, good)
	s.c.Bus.NKeySeed = seed
	if r.checkCredentials(s) {
		t.Error("a bad seed is usable")
	}
	must(t, Report{Findings: r.out.sorted()}, "bus.nkey", Error, "not a usable nkey seed")
}

func TestSuggestOrder(t *testing.T) {
	cs := []connection{{url: "tls://n2:4222", name: "nats-n2"}, {url: "tls://ctl:4222", name: "nats-ctl"}, {url: "tls://n1:4222", name: "nats-n1"}}
	if got, want := suggestOrder(cs, []string{"nats-n1", "nats-ctl"}), "tls://n1:4222,tls://ctl:4222,tls://n2:4222"; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

func TestFits(t *testing.T) {
	for _, tc := range []struct {
		addr, entry string
		ok          bool
	}{
		{"198.51.100.10/24", "198.51.100.10/24", true},
		{"198.51.100.10/32", "198.51.100.10/24", true},
		{"198.51.100.11/24", "198.51.100.10/24", false},
		{"203.0.113.5/28", "203.0.113.0/28", true},
		{"203.0.113.5/24", "203.0.113.0/28", false},
	} {
		if got := fits(mustPrefix(tc.addr), mustPrefix(tc.entry)); got != tc.ok {
			t.Errorf("fits(%s, %s) = %v", tc.addr, tc.entry, got)
		}
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// newCA writes a CA certificate (name.pem) and returns it with its key.
func newCA(t *testing.T, dir, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	c, _ := x509.ParseCertificate(der)
	return c, key
}

// issue writes name.pem and name-key.pem, a client certificate the CA
// issued that expires at notAfter, and returns the path prefix.
func issue(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, notAfter time.Time) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	p := filepath.Join(dir, name)
	writePEM(t, p+".pem", "CERTIFICATE", der)
	writePEM(t, p+"-key.pem", "EC PRIVATE KEY", kder)
	return p
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// This host's NATS server: its own route is not dialled, the others are,
// and one that does not answer is named with its port.
func TestRoutesOfTheLocalServer(t *testing.T) {
	s := bustest.Server(t)
	conf := filepath.Join(t.TempDir(), "nats-server.conf")
	if err := os.WriteFile(conf, []byte("server_name: \"nats-a\"\ncluster {\n  name: \"c\"\n  listen: \"127.0.0.1:6222\"\n  routes: [\"nats-route://127.0.0.1:6222\", \"nats-route://127.0.0.1:1\"]\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rep := doctorRun(t, Options{Etc: write(t, map[string]string{
		"nats.yaml":      "listen: 127.0.0.1:4222\nserver_config: " + conf + "\n",
		"arbiter.yaml":   "cluster: c\nnode: ctl\nbus:\n  url: " + s.ClientURL() + "\n",
		"scheduler.yaml": "cluster: c\nnode: ctl\nbus:\n  url: " + s.ClientURL() + "\n",
	})})
	must(t, rep, "port.route", Error, "127.0.0.1:1")
	if fs := find(rep, "port.route", OK, "127.0.0.1:6222"); len(fs) > 0 {
		t.Fatalf("this server's own route was dialled: %+v", fs)
	}
	must(t, rep, "bus.connect", OK, "arbiter@ctl")
	must(t, rep, "names.node", OK, `"ctl"`)
}

// external_media_address rewrites the SDP of the direct-media re-INVITEs
// too (observed on Asterisk 22.10.1): the phones of a direct-media call
// then send their audio to the node and hear nothing.
func TestExternalMediaAddressIsNamed(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{AuthFailDelay: -1, Users: []amipeer.User{
		{Name: "fan", Secret: "s", Read: []string{"system"}, Write: []string{"system", "command", "reporting"}},
	}, Transports: []amipeer.Transport{
		{ID: "t-node", Bind: "127.0.0.1:5060", ExternalSignalingAddress: "127.0.0.50", ExternalMediaAddress: "127.0.0.50"},
		{ID: "t-float", Bind: "127.0.0.50:5060", ExternalSignalingAddress: "127.0.0.50"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	ami := fmt.Sprintf("address: %s\n  username: fan\n  secret: s", peer.Addr())
	rep := doctorRun(t, Options{Etc: write(t, map[string]string{
		"ipmover.yaml": "cluster: c\nnode: n1\ninterface: lo\nanswer: {mode: reload}\nami:\n  " + ami + "\ngroups:\n  - {name: pbx, prefixes: [127.0.0.50/8]}\n",
	})})
	f := must(t, rep, "sip.media-address", Warning, "external_media_address = 127.0.0.50")
	if f.Subject != "t-node" || !strings.Contains(f.Fix, "remove external_media_address from t-node") {
		t.Errorf("finding %+v", f)
	}
	for _, x := range rep.Findings {
		if x.Check == "sip.media-address" && x.Subject == "t-float" {
			t.Errorf("t-float has no external_media_address, named anyway: %+v", x)
		}
	}
}
