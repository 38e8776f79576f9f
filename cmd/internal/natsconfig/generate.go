package natsconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/durablefile"
	"github.com/nats-io/nkeys"
)

// Options of one run.
type Options struct {
	// Out is the output directory; what it already holds (CA, keys) is kept.
	Out string
	// Renew reissues every certificate from the existing CA.
	Renew bool
	// Now is the issue time (tests); zero means time.Now.
	Now time.Time
	// WrittenBy names, in the server configurations' header, the command and
	// the file they are derived from (default: nats-config and the cluster
	// file), so an operator reading one knows what to change instead.
	WrittenBy, From string
}

// Result says what a run did.
type Result struct {
	Created []string // files written for the first time
	Renewed []string // certificates reissued
	Written []string // configurations rewritten (derived, always current)
}

// Layout of the output directory.
const (
	caDir      = "ca"
	bundlesDir = "hosts"
	caCert     = "ca.pem"
	caKey      = "ca-key.pem"
	serverConf = "nats-server.conf"
	serverCert = "server-cert.pem"
	serverKey  = "server-key.pem"
)

// Bundle returns the directory holding what goes on one host (a nats
// server, a fan host, an operator's or auditor's machine, or the admin's).
func Bundle(out, name string) string { return filepath.Join(out, bundlesDir, name) }

// SeedFile names an identity's nkey seed in its bundle; CertFile, KeyFile
// and BusFile name its other files there.
func SeedFile(role string) string { return role + ".nk" }
func CertFile(role string) string { return role + "-cert.pem" }
func KeyFile(role string) string  { return role + "-key.pem" }
func BusFile(role string) string  { return role + "-bus.yaml" }

// Generate writes the CA, keys, certificates, server configurations and
// bundles for the cluster into opt.Out. It is idempotent: existing keys and
// the CA are kept, missing ones are added (a new node or operator), and the
// configurations are rewritten from the current cluster file.
func Generate(c Cluster, opt Options) (Result, error) {
	g := &gen{c: c, opt: opt}
	if g.opt.Now.IsZero() {
		g.opt.Now = time.Now()
	}
	if err := g.run(); err != nil {
		return g.res, err
	}
	return g.res, nil
}

type gen struct {
	c      Cluster
	opt    Options
	res    Result
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	pubKey map[int]string // identity index -> nkey public key
}

func (g *gen) run() error {
	if err := g.loadOrCreateCA(); err != nil {
		return err
	}
	ids := g.c.identities()
	g.pubKey = map[int]string{}
	for i, id := range ids {
		dir := Bundle(g.opt.Out, id.Dir)
		pub, err := g.nkey(filepath.Join(dir, SeedFile(id.file())))
		if err != nil {
			return err
		}
		g.pubKey[i] = pub
		if id.System {
			// bus.system of the arbiter's configuration: the same
			// certificate, this seed.
			continue
		}
		cn := string(id.Role) + "@" + id.Name
		if err := g.cert(dir, CertFile(id.file()), KeyFile(id.file()), cn, nil, nil, false); err != nil {
			return err
		}
		if err := g.writeCA(dir); err != nil {
			return err
		}
		if err := g.write(filepath.Join(dir, g.configName(id)), g.busSnippet(id), 0o644); err != nil {
			return err
		}
	}
	for _, s := range g.c.NATS {
		dir := Bundle(g.opt.Out, s.Name)
		var ips []net.IP
		for _, a := range s.IPs {
			ip := net.ParseIP(a)
			if ip == nil {
				return fmt.Errorf("nats server %s: %q is not an IP address", s.Name, a)
			}
			ips = append(ips, ip)
		}
		// An address as host goes in the certificate's IP addresses, not
		// its names.
		var dns []string
		if hip := net.ParseIP(s.Host); hip == nil {
			dns = append(dns, s.Host)
		} else if !slices.ContainsFunc(ips, hip.Equal) {
			ips = append(ips, hip)
		}
		if s.Name != s.Host {
			dns = append(dns, s.Name)
		}
		if err := g.cert(dir, serverCert, serverKey, s.Name, dns, ips, true); err != nil {
			return err
		}
		if err := g.writeCA(dir); err != nil {
			return err
		}
		conf, err := g.serverConf(s, ids)
		if err != nil {
			return err
		}
		if err := g.write(filepath.Join(dir, serverConf), conf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// write writes a derived file (always current).
func (g *gen) write(path string, data []byte, mode fs.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
		return nil
	}
	if err := writeFile(path, data, mode); err != nil {
		return err
	}
	g.res.Written = append(g.res.Written, path)
	return nil
}

// writeFile replaces path whole and durably: a key or a server's
// configuration is never half written, and never left more open than mode
// by an earlier file of the same name.
func writeFile(path string, data []byte, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	return durablefile.Write(path, data, mode)
}

func (g *gen) writeCA(dir string) error {
	return g.write(filepath.Join(dir, caCert), g.caPEM, 0o644)
}

func (g *gen) loadOrCreateCA() error {
	certPath := filepath.Join(g.opt.Out, caDir, caCert)
	keyPath := filepath.Join(g.opt.Out, caDir, caKey)
	cb, cerr := os.ReadFile(certPath)
	kb, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil {
		cert, err := parseCert(cb)
		if err != nil {
			return fmt.Errorf("CA %s: %w", certPath, err)
		}
		key, err := parseKey(kb)
		if err != nil {
			return fmt.Errorf("CA key %s: %w", keyPath, err)
		}
		g.ca, g.caKey, g.caPEM = cert, key, cb
		return nil
	}
	if !errors.Is(cerr, fs.ErrNotExist) || !errors.Is(kerr, fs.ErrNotExist) {
		return fmt.Errorf("CA in %s is incomplete (%v, %v); restore it from a backup: a new CA would invalidate every certificate", filepath.Dir(certPath), cerr, kerr)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "fan " + g.c.Cluster + " bus CA", Organization: []string{"fan"}},
		NotBefore:             g.opt.Now.Add(-time.Hour),
		NotAfter:              g.opt.Now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("CA certificate: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	g.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := writeFile(certPath, g.caPEM, 0o644); err != nil {
		return err
	}
	g.ca, g.caKey = cert, key
	g.res.Created = append(g.res.Created, certPath, keyPath)
	return nil
}

// cert issues a certificate (and key) into dir unless one from this CA is
// already there and Renew is not set.
func (g *gen) cert(dir, certName, keyName, cn string, dns []string, ips []net.IP, server bool) error {
	certPath, keyPath := filepath.Join(dir, certName), filepath.Join(dir, keyName)
	renew := false
	if b, err := os.ReadFile(certPath); err == nil {
		old, err := parseCert(b)
		if err == nil && old.CheckSignatureFrom(g.ca) == nil && sameNames(old, dns, ips) {
			if !g.opt.Renew {
				return nil
			}
			renew = true
		}
	}
	var key *ecdsa.PrivateKey
	if b, err := os.ReadFile(keyPath); err == nil {
		// Keep the key across renewals: only the certificate changes.
		if key, err = parseKey(b); err != nil {
			return fmt.Errorf("key %s: %w", keyPath, err)
		}
	} else {
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return fmt.Errorf("key for %s: %w", cn, err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writeFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
			return err
		}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"fan"}, OrganizationalUnit: []string{g.c.Cluster}},
		NotBefore:    g.opt.Now.Add(-time.Hour),
		NotAfter:     g.opt.Now.AddDate(0, 0, g.c.CertDays),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	if server {
		// Routes authenticate each other with the same certificate.
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, g.ca, &key.PublicKey, g.caKey)
	if err != nil {
		return fmt.Errorf("certificate for %s: %w", cn, err)
	}
	if err := writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	if renew {
		g.res.Renewed = append(g.res.Renewed, certPath)
	} else {
		g.res.Created = append(g.res.Created, certPath)
	}
	return nil
}

func sameNames(c *x509.Certificate, dns []string, ips []net.IP) bool {
	if !slices.Equal(c.DNSNames, dns) || len(c.IPAddresses) != len(ips) {
		return false
	}
	for i := range ips {
		if !c.IPAddresses[i].Equal(ips[i]) {
			return false
		}
	}
	return true
}

// nkey returns the public key of the seed at path, creating the seed when
// missing.
func (g *gen) nkey(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		kp, err := nkeys.ParseDecoratedNKey(b)
		if err != nil {
			return "", fmt.Errorf("nkey %s: %w", path, err)
		}
		defer kp.Wipe()
		return kp.PublicKey()
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("nkey %s: %w", path, err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	if err := writeFile(path, append(seed, '\n'), 0o600); err != nil {
		return "", err
	}
	g.res.Created = append(g.res.Created, path)
	return kp.PublicKey()
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

// q quotes a string for the nats-server configuration (quoted, $ is not
// read as a variable). Names are subject tokens and paths, so only a
// backslash or a quote needs escaping.
func q(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

func list(ss []string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = q(s)
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// urls is ClientURLs joined, as bus.url takes them.
func (g *gen) urls(host string) string { return strings.Join(g.c.ClientURLs(host), ",") }

// standby is Cluster.Standby.
func (g *gen) standby(host string) bool { return g.c.Standby(host) }

func (g *gen) serverConf(s Server, ids []identity) ([]byte, error) {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	path := func(name string) string { return q(filepath.Join(g.c.NATSDir, name)) }
	by, from := g.opt.WrittenBy, g.opt.From
	if by == "" {
		by, from = "fanctl nats-config", "the cluster file"
	}
	w("# nats-server %s of fan cluster %s, written by `%s`.", s.Name, g.c.Cluster, by)
	w("# Do not edit: change %s and run `%s` again.", from, by)
	w("# Permissions come from pkg/events (one user per service per host, per")
	w("# operator, per auditor, and the admin); see deploy/systemd/README.md.")
	w("server_name: %s", q(s.Name))
	w("listen: %s", q(net.JoinHostPort("0.0.0.0", strconv.Itoa(s.ClientPort))))
	if s.Monitor != "-" {
		w("http: %s", q(s.Monitor))
	}
	w("lame_duck_duration: \"30s\"")
	w("")
	w("tls {")
	w("  cert_file: %s", path(serverCert))
	w("  key_file: %s", path(serverKey))
	w("  ca_file: %s", path(caCert))
	w("  # Every client presents a certificate from the cluster's CA.")
	w("  verify: true")
	w("  timeout: 2")
	w("}")
	w("")
	w("jetstream {")
	w("  store_dir: %s", q(g.c.StoreDir))
	w("}")
	if len(g.c.NATS) > 1 {
		w("")
		w("cluster {")
		w("  name: %s", q(g.c.Cluster))
		w("  listen: %s", q(net.JoinHostPort("0.0.0.0", strconv.Itoa(s.ClusterPort))))
		var routes []string
		for _, o := range g.c.NATS {
			routes = append(routes, "nats-route://"+net.JoinHostPort(o.Host, strconv.Itoa(o.ClusterPort)))
		}
		w("  routes: %s", list(routes))
		w("  # A dead or cut-off member's route is closed after two unanswered")
		w("  # pings: 4 s, where nats-server's default (2 min) keeps it looking routed.")
		w("  ping_interval: \"2s\"")
		w("  ping_max: 2")
		w("  tls {")
		w("    cert_file: %s", path(serverCert))
		w("    key_file: %s", path(serverKey))
		w("    ca_file: %s", path(caCert))
		w("    verify: true")
		w("    timeout: 2")
		w("  }")
		w("}")
	}
	w("")
	w("accounts {")
	w("  FAN {")
	w("    jetstream: enabled")
	w("    users: [")
	var sys []int
	for i, id := range ids {
		if id.System {
			sys = append(sys, i)
			continue
		}
		id.PublicKey = g.pubKey[i]
		p, err := id.Permissions()
		if err != nil {
			return nil, fmt.Errorf("%s@%s: %w", id.Role, id.Name, err)
		}
		w("      # %s@%s", id.Role, id.Name)
		writeUser(&b, "      ", g.pubKey[i], p)
	}
	w("    ]")
	w("  }")
	w("  SYS {")
	w("    users: [")
	for _, i := range sys {
		w("      # %s@%s: leader step-downs", ids[i].Role, ids[i].Name)
		writeUser(&b, "      ", g.pubKey[i], events.SystemPermissions(g.pubKey[i]))
	}
	w("    ]")
	w("  }")
	w("}")
	w("system_account: SYS")
	return []byte(b.String()), nil
}

func writeUser(b *strings.Builder, indent, nkey string, p events.Permissions) {
	fmt.Fprintf(b, "%s{ nkey: %s, permissions: {\n", indent, q(nkey))
	rule := func(name string, r events.Rule) {
		fmt.Fprintf(b, "%s    %s: {\n", indent, name)
		fmt.Fprintf(b, "%s      allow: %s\n", indent, list(r.Allow))
		if len(r.Deny) > 0 {
			fmt.Fprintf(b, "%s      deny: %s\n", indent, list(r.Deny))
		}
		fmt.Fprintf(b, "%s    }\n", indent)
	}
	rule("publish", p.Publish)
	rule("subscribe", p.Subscribe)
	if p.AllowResponses {
		fmt.Fprintf(b, "%s    allow_responses: true\n", indent)
	}
	fmt.Fprintf(b, "%s} }\n", indent)
}

// FanctlFile is the fanctl configuration (fanctl --config) in an
// operator's, auditor's, status page's or the admin's bundle.
const FanctlFile = "fanctl.yaml"

// isPerson: the identity runs fanctl (people, and the status page, which is
// fanctl serve), so its bundle holds a fanctl configuration.
func isPerson(id identity) bool {
	return id.Role == events.RoleOperator || id.Role == events.RoleAuditor || id.Role == events.RoleViewer || id.Role == events.RoleAdmin
}

func (g *gen) configName(id identity) string {
	if isPerson(id) {
		return FanctlFile
	}
	return BusFile(id.file())
}

// busSnippet is the bus section of a service's configuration, or a whole
// fanctl configuration for a person.
func (g *gen) busSnippet(id identity) []byte {
	if isPerson(id) {
		p := func(name string) string { return q(filepath.Join(g.c.FanDir, name)) }
		var b strings.Builder
		fmt.Fprintf(&b, "# fanctl --config for %s %s (cluster %s), written by fanctl nats-config.\n", id.Role, id.Name, g.c.Cluster)
		fmt.Fprintf(&b, "cluster: %s\n", q(g.c.Cluster))
		if id.Role == events.RoleOperator {
			fmt.Fprintf(&b, "operator: %s\n", q(id.Name))
		}
		if id.Role == events.RoleViewer {
			fmt.Fprintf(&b, "# fanctl serve: add serve: {token_file: FILE} (cmd/README.md, the status page).\n")
		}
		fmt.Fprintf(&b, "url: %s\nnkey_seed: %s\ntls:\n  ca: %s\n  cert: %s\n  key: %s\n",
			q(g.urls("")), p(SeedFile(id.file())), p(caCert), p(CertFile(id.file())), p(KeyFile(id.file())))
		return []byte(b.String())
	}
	p := func(name string) string { return q(filepath.Join(g.c.FanDir, name)) }
	var b strings.Builder
	fmt.Fprintf(&b, "# bus section for fan-%s on %s (cluster %s), written by fanctl nats-config.\n", id.Role, id.Dir, g.c.Cluster)
	fmt.Fprintf(&b, "bus:\n  url: %s\n  nkey_seed: %s\n  tls:\n    ca: %s\n    cert: %s\n    key: %s\n",
		q(g.urls(id.Dir)), p(SeedFile(id.file())), p(caCert), p(CertFile(id.file())), p(KeyFile(id.file())))
	if id.Role == events.RoleArbiter {
		sys := id
		sys.System = true
		fmt.Fprintf(&b, "  # The system account, for the meta leader's step-downs (with leader_servers).\n")
		fmt.Fprintf(&b, "  system:\n    nkey_seed: %s\n", p(SeedFile(sys.file())))
		if len(g.c.LeaderServers) > 0 {
			var ls []string
			for _, l := range g.c.LeaderServers {
				ls = append(ls, q(l))
			}
			fmt.Fprintf(&b, "  leader_servers: [%s]\n", strings.Join(ls, ", "))
		}
		if g.standby(id.Dir) {
			fmt.Fprintf(&b, "# This replica shares its host with a NATS server that should not lead:\n")
			fmt.Fprintf(&b, "# it holds the lease only while no replica without standby is alive.\n")
			fmt.Fprintf(&b, "standby: true\n")
		}
	}
	return []byte(b.String())
}
