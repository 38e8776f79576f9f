package stack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fanpbx/fan/lab/kamailio"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/pkg/platform/poll"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// The pool lab: PBX nodes behind a Kamailio dispatcher, the shape of
// docs/recipes/kamailio-pool.md. One LAN (netlab.Build): three PBX nodes
// n1-n3 (stand-ins: a Kamailio that answers every INVITE and logs it), each
// posting its heartbeat (CPU, memory) to the arbiter's HTTP endpoint with
// curl, over TLS, with its own bearer token, as a host that cannot run fan's
// prober would; the proxy host kam with Kamailio's dispatcher (relative
// weights), the dispatcher executor (fan-ipmover, executor dispatcher,
// mode eligible, with weights) and an observer (fan-prober, which asks each
// node's SIP); ctl with fan-nats and the arbiter (its registry marks a
// silent node offline after registry.offline_after); and a caller, SIPp on
// c, calling through the proxy. The bus is made from a cluster file by
// fanctl nats-config, as in the sites lab.

// Hosts and names of the pool lab.
const (
	PoolGroup  = "pool"
	PoolProxy  = "kam"
	PoolCaller = netlab.ClientHost
	poolCtl    = netlab.ControlHost
	poolRPC    = 5071
	poolHBPort = 8443
)

// PoolNodes are the pool's PBX nodes, in the dispatcher's order.
var PoolNodes = []string{"n1", "n2", "n3"}

// PoolOptions tunes the pool lab; zero values take the lab's defaults.
type PoolOptions struct {
	BinDir string
	Log    *slog.Logger
	// OfflineAfter and SweepEvery are the arbiter's registry.offline_after
	// and sweep_every: a node whose heartbeats stop is offline this long
	// after the last one.
	OfflineAfter, SweepEvery time.Duration
	// HeartbeatEvery is how often each node posts.
	HeartbeatEvery time.Duration
	// Resync is the dispatcher executor's dispatcher.resync.
	Resync time.Duration
	// Rate is the caller's new calls per second.
	Rate int
	// Threshold and Confirm are the arbiter's weights settings.
	Threshold, Confirm int
	// IdleCPU and LoadedCPU are the CPU figures the nodes report.
	IdleCPU, LoadedCPU float64
}

func (o *PoolOptions) defaults() {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	set(&o.OfflineAfter, 3*time.Second)
	set(&o.SweepEvery, 250*time.Millisecond)
	set(&o.HeartbeatEvery, time.Second)
	set(&o.Resync, time.Second)
	if o.Rate == 0 {
		o.Rate = 25
	}
	if o.Threshold == 0 {
		o.Threshold = 10
	}
	if o.Confirm == 0 {
		o.Confirm = 3
	}
	if o.IdleCPU == 0 {
		o.IdleCPU = 10
	}
	if o.LoadedCPU == 0 {
		o.LoadedCPU = 95
	}
}

// Pool is a running pool lab.
type Pool struct {
	Lab  *netlab.Lab
	Opts PoolOptions
	p    *shapeProcs
	rpc  *http.Client
}

func poolAddr(host string) netip.Addr {
	switch host {
	case PoolProxy:
		return netip.MustParseAddr("198.51.100.5")
	case poolCtl:
		return netip.MustParseAddr("198.51.100.2")
	case PoolCaller:
		return netip.MustParseAddr("198.51.100.50")
	}
	i := slices.Index(PoolNodes, host)
	return netip.AddrFrom4([4]byte{198, 51, 100, byte(11 + i)})
}

// PoolURI is node's destination in the dispatcher set.
func PoolURI(node string) string { return "sip:" + poolAddr(node).String() + ":5060" }

// StartPool builds the pool lab and starts everything but the caller and
// the heartbeats' figures' changes; the caller closes it with Close.
func StartPool(ctx context.Context, o PoolOptions) (*Pool, error) {
	o.defaults()
	for _, b := range []string{"fan-nats", "fan-arbiter", "fan-prober", "fan-ipmover", "fanctl"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return nil, fmt.Errorf("binary %s: %w (run make build)", b, err)
		}
	}
	for _, prog := range []string{"kamailio", "sipp", "curl"} {
		if _, err := exec.LookPath(prog); err != nil {
			return nil, fmt.Errorf("%s is not installed: %w", prog, err)
		}
	}
	pfx := func(host string) netip.Prefix { return netip.PrefixFrom(poolAddr(host), 24) }
	var nodes []netlab.HostSpec
	for i, n := range PoolNodes {
		nodes = append(nodes, netlab.HostSpec{Name: n, Addr: pfx(n), MAC: fmt.Sprintf("02:fa:00:00:01:%02x", 0x11+i)})
	}
	l, err := netlab.Build(ctx, netlab.Spec{Logger: o.Log, Nodes: nodes,
		Extra: []netlab.HostSpec{{Name: PoolProxy, Addr: pfx(PoolProxy), MAC: "02:fa:00:00:01:05"}}})
	if err != nil {
		return nil, err
	}
	p := &Pool{Lab: l, Opts: o, p: newShapeProcs(l, o.BinDir, filepath.Join(l.Dir(), "fan"))}
	p.rpc = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := l.Do(PoolProxy, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}}
	if err := p.start(ctx); err != nil {
		return p, err
	}
	return p, nil
}

func (p *Pool) dir(name string) string { return filepath.Join(p.p.dir, name) }

func (p *Pool) start(ctx context.Context) error {
	if err := os.MkdirAll(p.p.dir, 0o755); err != nil {
		return err
	}
	for _, n := range PoolNodes {
		if err := p.startKamailio(ctx, n, "pbx", kamailio.PoolNodeConfig(n, poolAddr(n).String())); err != nil {
			return err
		}
	}
	var list strings.Builder
	for _, n := range PoolNodes {
		// Equal weights until the arbiter's first set: fan rewrites them.
		fmt.Fprintf(&list, "1 %s 8 0 duid=%s;weight=50;rweight=50\n", PoolURI(n), n)
	}
	if err := os.WriteFile(p.dir("dispatcher.list"), []byte(list.String()), 0o644); err != nil {
		return err
	}
	if err := p.startKamailio(ctx, PoolProxy, "kamailio", kamailio.PoolProxyConfig(poolAddr(PoolProxy).String(), poolRPC, p.dir("dispatcher.list"))); err != nil {
		return err
	}
	if err := p.secrets(); err != nil {
		return err
	}
	if err := p.startBus(ctx); err != nil {
		return err
	}
	if err := p.startFan(); err != nil {
		return err
	}
	for _, n := range PoolNodes {
		if err := p.SetCPU(n, p.Opts.IdleCPU); err != nil {
			return err
		}
		if err := p.StartHeartbeats(n); err != nil {
			return err
		}
	}
	return nil
}

// startKamailio checks and runs a Kamailio configuration on host as the
// process name, and waits until it answers.
func (p *Pool) startKamailio(ctx context.Context, host, name, cfg string) error {
	dir := p.dir("kamailio-" + host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "kamailio.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	if _, err := p.Lab.Exec(ctx, host, "kamailio", "-c", "-f", path); err != nil {
		return fmt.Errorf("kamailio on %s: config check: %w", host, err)
	}
	if err := p.p.start(host, name, "kamailio", "-f", path, "-DD", "-E", "-Y", dir, "-P", filepath.Join(dir, "pid"), "-m", "32", "-M", "8"); err != nil {
		return err
	}
	if host == PoolProxy {
		return waitTCPOn(ctx, p.Lab, host, fmt.Sprintf("127.0.0.1:%d", poolRPC), 10*time.Second)
	}
	return poll.Until(ctx, 10*time.Second, "kamailio on "+host+" answering OPTIONS", func() error {
		return p.Lab.Do(host, func() error {
			pg, err := sipoptions.NewPinger(netip.AddrPortFrom(poolAddr(host), 5060).String())
			if err != nil {
				return err
			}
			defer pg.Close()
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, err = pg.Ping(pctx)
			return err
		})
	})
}

// secrets writes the heartbeat endpoint's tokens (the shared one, which
// no node uses, and each node's own, with the header file its poster
// sends) and its certificate (a CA of the lab's, a server certificate for
// ctl's address).
func (p *Pool) secrets() error {
	for _, name := range append([]string{""}, PoolNodes...) {
		tok := make([]byte, 24)
		if _, err := rand.Read(tok); err != nil {
			return err
		}
		token := hex.EncodeToString(tok)
		if name == "" {
			if err := os.WriteFile(p.dir("hb-token"), []byte(token+"\n"), 0o600); err != nil {
				return err
			}
			continue
		}
		if err := os.WriteFile(p.dir("hb-token-"+name), []byte(token+"\n"), 0o600); err != nil {
			return err
		}
		if err := os.WriteFile(p.dir("hb-auth-header-"+name), []byte("Authorization: Bearer "+token+"\n"), 0o600); err != nil {
			return err
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fan pool lab CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "arbiter heartbeat endpoint"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature, IPAddresses: []net.IP{net.IP(poolAddr(poolCtl).AsSlice())}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	for name, b := range map[string]*pem.Block{"hb-ca.pem": {Type: "CERTIFICATE", Bytes: caDER},
		"hb-cert.pem": {Type: "CERTIFICATE", Bytes: srvDER}, "hb-key.pem": {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(p.dir(name), pem.EncodeToMemory(b), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// PoolClusterFile is the cluster file of the pool lab's bus, for fanctl
// nats-config: one NATS server on ctl with the arbiter, which relays the
// nodes' HTTP heartbeats; the proxy host's observer and dispatcher
// executor.
func PoolClusterFile(storeDir string) string {
	return fmt.Sprintf(`cluster: lab
nats:
  - name: nats-ctl
    host: "198.51.100.2"
    ips: ["198.51.100.2"]
    monitor: "-"
control:
  - name: %s
    services: [arbiter]
  - name: %s
    services: [prober, ipmover]
http_heartbeat_nodes: [%s]
operators: [%s]
nats_dir: %q
store_dir: %q
fan_dir: %q
`, poolCtl, PoolProxy, strings.Join(PoolNodes, ", "), LabOperator, bundleMount, storeDir, bundleMount)
}

func (p *Pool) startBus(ctx context.Context) error {
	store := p.dir("nats-store")
	if err := p.p.bus.generate(ctx, PoolClusterFile(store)); err != nil {
		return err
	}
	for _, person := range []string{LabOperator, "admin"} {
		if err := p.p.bus.install(person, "fanctl.yaml", p.dir("fanctl-"+person+".yaml")); err != nil {
			return err
		}
	}
	conf := p.dir("nats-server.conf")
	if err := p.p.bus.install("nats-ctl", "nats-server.conf", conf); err != nil {
		return err
	}
	addr := poolAddr(poolCtl).String()
	if err := p.p.start(poolCtl, "fan-nats", filepath.Join(p.p.bin, "fan-nats"), "-listen", addr+":4222",
		"-store", store, "-name", "nats-ctl", "-server-config", conf); err != nil {
		return err
	}
	if err := waitTCPOn(ctx, p.Lab, poolCtl, addr+":4222", 10*time.Second); err != nil {
		return fmt.Errorf("nats on ctl: %w", err)
	}
	if out, err := p.fanctlAs(ctx, "admin", "provision", "--replicas", "1"); err != nil {
		return fmt.Errorf("fanctl provision: %w: %s", err, out)
	}
	return nil
}

func (p *Pool) fanctlAs(ctx context.Context, person string, args ...string) ([]byte, error) {
	argv := append([]string{filepath.Join(p.p.bin, "fanctl"), "--config", p.dir("fanctl-" + person + ".yaml")}, args...)
	return p.Lab.Exec(ctx, poolCtl, argv...)
}

// Fanctl runs fanctl on ctl as the lab's operator.
func (p *Pool) Fanctl(ctx context.Context, args ...string) ([]byte, error) {
	return p.fanctlAs(ctx, LabOperator, args...)
}

const poolArbiter = `cluster: lab
node: {{.Ctl}}
{{.Bus}}lease_ttl: 1s
groups:
  - name: {{.Group}}
    # The command schema needs an address; the pool has none to move.
    addresses: [198.51.100.10/32]
    nodes: [{{range $i, $n := .Nodes}}{{if $i}}, {{end}}{{$n}}{{end}}]
    health_check: sip
    # The nodes run no prober: the proxy host's observer asks their SIP.
    health_from:
{{- range .Nodes}}
      {{.}}: {observer: {{$.Proxy}}, check: sip-{{.}}}
{{- end}}
    weights: {enabled: true, threshold: {{.Threshold}}, confirm: {{.Confirm}}}
registry:
  offline_after: {{.OfflineAfter}}
  sweep_every: {{.SweepEvery}}
http_heartbeat:
  listen: "{{.HBListen}}"
  token_file: {{.Dir}}/hb-token
  # Each node posts with a token of its own, which posts for it alone.
  node_token_files:
{{- range .Nodes}}
    {{.}}: {{$.Dir}}/hb-token-{{.}}
{{- end}}
  nodes: [{{range $i, $n := .Nodes}}{{if $i}}, {{end}}{{$n}}{{end}}]
  interval: {{.HeartbeatEvery}}
  tls:
    cert: {{.Dir}}/hb-cert.pem
    key: {{.Dir}}/hb-key.pem
  rate_limit: {per_second: 5, burst: 10}
`

const poolProber = `cluster: lab
node: {{.Proxy}}
{{.Bus}}heartbeat_interval: 1s
checks:
{{- range .Nodes}}
  - {name: sip-{{.}}, kind: sip, role: peer, target_node: {{.}}, address: "{{index $.Addrs .}}:5060", interval: 500ms, timeout: 400ms, rise: 2, fall: 3}
{{- end}}
`

const poolIPMover = `cluster: lab
node: {{.Proxy}}
{{.Bus}}executor: dispatcher
dispatcher:
  mode: eligible
  group: {{.Group}}
  url: http://127.0.0.1:{{.RPC}}/RPC
  set: 1
  nodes:
{{- range .Nodes}}
    {{.}}: "sip:{{index $.Addrs .}}:5060"
{{- end}}
  resync: {{.Resync}}
  weights: true
  list_file: {{.Dir}}/dispatcher.list
`

func (p *Pool) startFan() error {
	addrs := map[string]string{}
	for _, n := range PoolNodes {
		addrs[n] = poolAddr(n).String()
	}
	o := p.Opts
	d := map[string]any{"Ctl": poolCtl, "Proxy": PoolProxy, "Group": PoolGroup, "Nodes": PoolNodes, "Addrs": addrs,
		"Threshold": o.Threshold, "Confirm": o.Confirm, "OfflineAfter": o.OfflineAfter.String(), "SweepEvery": o.SweepEvery.String(),
		"HeartbeatEvery": o.HeartbeatEvery.String(), "Resync": o.Resync.String(), "RPC": poolRPC, "Dir": p.p.dir,
		"HBListen": netip.AddrPortFrom(poolAddr(poolCtl), poolHBPort).String()}
	if err := p.p.service(poolCtl, "arbiter", poolArbiter, d); err != nil {
		return err
	}
	if err := p.p.service(PoolProxy, "prober", poolProber, d); err != nil {
		return err
	}
	return p.p.service(PoolProxy, "ipmover", poolIPMover, d)
}

// PoolHeartbeatScript is what each node runs to post its heartbeat: every
// interval, its figures to the arbiter's endpoint with curl, over TLS
// (the endpoint's CA), with the node's own bearer token in a header file so that it
// never shows in the process list. The lab's nodes read their CPU figure
// from a file the lab writes; docs/recipes/kamailio-pool.md has the same
// loop reading /proc.
const PoolHeartbeatScript = `#!/bin/sh
set -u
while :; do
	printf '{"node":"%s","cpu_percent":%s,"mem_available_bytes":%s,"mem_total_bytes":%s,"interval_ms":%s}' \
		"$NODE" "$(cat "$CPU_FILE")" "$MEM_AVAILABLE" "$MEM_TOTAL" "$INTERVAL_MS" |
	curl -sS --max-time 2 --cacert "$CA" -H @"$AUTH" -H 'Content-Type: application/json' \
		--data-binary @- -o /dev/null -w "%{http_code}\n" "$URL"
	sleep "$INTERVAL"
done
`

// SetCPU is the CPU figure node reports from its next heartbeat on.
func (p *Pool) SetCPU(node string, pct float64) error {
	return os.WriteFile(p.dir("cpu-"+node), []byte(strconv.FormatFloat(pct, 'f', -1, 64)+"\n"), 0o644)
}

// StartHeartbeats starts node's heartbeat loop (again).
func (p *Pool) StartHeartbeats(node string) error {
	// A shell reads its script as it runs: rewriting a file another
	// node's loop is reading ends that loop. Each node gets its own file,
	// written aside and renamed into place, so a running loop keeps the
	// file it opened.
	script := p.dir("heartbeat-" + node + ".sh")
	if err := os.WriteFile(script+".tmp", []byte(PoolHeartbeatScript), 0o755); err != nil {
		return err
	}
	if err := os.Rename(script+".tmp", script); err != nil {
		return err
	}
	env := []string{"NODE=" + node, "CPU_FILE=" + p.dir("cpu-"+node), "MEM_AVAILABLE=6442450944", "MEM_TOTAL=8589934592",
		"INTERVAL_MS=" + strconv.FormatInt(p.Opts.HeartbeatEvery.Milliseconds(), 10),
		"INTERVAL=" + strconv.FormatFloat(p.Opts.HeartbeatEvery.Seconds(), 'f', -1, 64),
		"CA=" + p.dir("hb-ca.pem"), "AUTH=" + p.dir("hb-auth-header-"+node),
		"URL=https://" + netip.AddrPortFrom(poolAddr(poolCtl), poolHBPort).String() + "/api/servers/heartbeat"}
	pr, err := p.Lab.Start(node, "heartbeat", []string{"sh", script}, env)
	if err != nil {
		return err
	}
	p.p.procs[node+"/heartbeat"] = pr
	return nil
}

// StopHeartbeats ends node's heartbeat loop: the node itself keeps
// answering calls, as a host whose agent died or whose path to the arbiter
// broke would.
func (p *Pool) StopHeartbeats(node string) error {
	pr := p.p.procs[node+"/heartbeat"]
	if pr == nil {
		return fmt.Errorf("no heartbeats running on %s", node)
	}
	return pr.Stop()
}

// StartCalls starts the caller: SIPp on c placing Rate calls a second
// through the proxy, until StopCalls.
func (p *Pool) StartCalls() error {
	return p.p.start(PoolCaller, "sipp", "sipp", "-sn", "uac", "-s", "100", "-nostdin", "-i", poolAddr(PoolCaller).String(),
		"-p", "5070", "-r", strconv.Itoa(p.Opts.Rate), "-m", "1000000", "-d", "0", "-timeout_error",
		"-trace_err", "-error_file", p.dir("sipp-errors.log"), netip.AddrPortFrom(poolAddr(PoolProxy), 5060).String())
}

// StopCalls stops the caller.
func (p *Pool) StopCalls() error {
	pr := p.p.procs[PoolCaller+"/sipp"]
	if pr == nil {
		return nil
	}
	return pr.Stop()
}

// Call is one INVITE a node received.
type Call struct {
	Node   string
	At     time.Time
	CallID string
}

// Calls reads every call the nodes have received so far, from their
// logs, in arrival order (retransmissions of an INVITE counted once).
func (p *Pool) Calls() ([]Call, error) {
	var out []Call
	for _, n := range PoolNodes {
		pr := p.p.procs[n+"/pbx"]
		if pr == nil {
			return nil, fmt.Errorf("no pbx on %s", n)
		}
		f, err := os.Open(pr.LogPath)
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			_, rest, ok := strings.Cut(sc.Text(), "FANTEST INVITE node=")
			if !ok {
				continue
			}
			fields := strings.Fields(rest)
			if len(fields) < 3 {
				continue
			}
			ts, _ := strings.CutPrefix(fields[1], "t=")
			cid, _ := strings.CutPrefix(fields[2], "cid=")
			sec, usec, _ := strings.Cut(ts, ".")
			s, err1 := strconv.ParseInt(sec, 10, 64)
			us, err2 := strconv.ParseInt(usec, 10, 64)
			if err1 != nil || err2 != nil || seen[cid] {
				continue
			}
			seen[cid] = true
			out = append(out, Call{Node: fields[0], At: time.Unix(s, us*1000), CallID: cid})
		}
		f.Close()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}

// Destination is one node of the dispatcher set as Kamailio holds it.
type Destination struct {
	URI, Flags string
	RWeight    int
}

// Dispatcher reads the dispatcher set from the proxy (JSON-RPC on its host).
func (p *Pool) Dispatcher(ctx context.Context) (map[string]Destination, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/RPC", poolRPC),
		strings.NewReader(`{"jsonrpc":"2.0","method":"dispatcher.list","id":1}`))
	if err != nil {
		return nil, err
	}
	resp, err := p.rpc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var res struct {
		Result struct {
			Records []struct {
				Set struct {
					Targets []struct {
						Dest struct {
							URI   string `json:"URI"`
							Flags string `json:"FLAGS"`
							Attrs struct {
								DUID    string `json:"DUID"`
								RWeight int    `json:"RWEIGHT"`
							} `json:"ATTRS"`
						} `json:"DEST"`
					} `json:"TARGETS"`
				} `json:"SET"`
			} `json:"RECORDS"`
		} `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return nil, fmt.Errorf("dispatcher.list: %w", err)
	}
	out := map[string]Destination{}
	for _, r := range res.Result.Records {
		for _, t := range r.Set.Targets {
			out[t.Dest.Attrs.DUID] = Destination{URI: t.Dest.URI, Flags: t.Dest.Flags, RWeight: t.Dest.Attrs.RWeight}
		}
	}
	return out, nil
}

// FollowEvents is Sites.FollowEvents for the pool lab (fanctl on ctl).
func (p *Pool) FollowEvents(ctx context.Context, fn func(Event)) error {
	return followEvents(ctx, p.Lab, poolCtl, []string{filepath.Join(p.p.bin, "fanctl"), "--config", p.dir("fanctl-" + LabOperator + ".yaml")}, fn)
}

// Logs is the tail of every process's log, for a failure.
func (p *Pool) Logs(n int64) string { return p.p.logs(n) }

// Close stops everything and removes the lab.
func (p *Pool) Close() error {
	p.p.stop()
	return p.Lab.Close()
}

// HeartbeatCodes counts the HTTP status codes node's poster got since it
// was last started, from its log (one code a line).
func (p *Pool) HeartbeatCodes(node string) map[string]int {
	out := map[string]int{}
	pr := p.p.procs[node+"/heartbeat"]
	if pr == nil {
		return out
	}
	b, err := os.ReadFile(pr.LogPath)
	if err != nil {
		return out
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		if s := strings.TrimSpace(string(l)); s != "" {
			out[s]++
		}
	}
	return out
}
