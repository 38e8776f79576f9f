package site

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fanpbx/fan/cmd/internal/natsconfig"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/durablefile"
	"go.yaml.in/yaml/v3"
)

// Layout of init's output directory. It holds the CA's key and every
// secret of the site: keep it on the admin's machine, under backup.
const (
	// BusOut is natsconfig's working directory: the CA, every key, seed
	// and certificate. Hosts get copies in their bundles.
	BusOut = "bus"
	// SecretsOut holds what init makes besides the bus's keys: each PBX
	// host's AMI secret, the status page's token.
	SecretsOut = "secrets"
	// HostsOut has one bundle per host: copy hosts/<name> to it and run
	// its install.sh (fanctl install-host).
	HostsOut = "hosts"
	// PeopleOut has one bundle per operator and auditor, AdminOut the
	// admin's: fanctl --config <bundle>/fanctl.yaml from anywhere.
	PeopleOut = "people"
	AdminOut  = "admin"
	// SiteCopy is the site file the output was made from.
	SiteCopy = "site.yaml"
)

// InitOptions of one run.
type InitOptions struct {
	// Out is the output directory; what it holds (CA, keys, secrets) is
	// kept and reused.
	Out string
	// Renew reissues every certificate from the same CA.
	Renew bool
	// SiteFile is the site file's bytes, kept in Out as SiteCopy.
	SiteFile []byte
	// Now is the certificates' issue time (tests); zero means now.
	Now time.Time
}

// HostChange says what a run changed in one host's bundle.
type HostChange struct {
	Host    string
	New     bool     // the bundle did not exist
	Changed []string // destination paths whose content, owner or mode changed
	Removed []string // destination paths no longer in the bundle
}

// Needed says whether the host must be given the bundle again.
func (h HostChange) Needed() bool { return h.New || len(h.Changed) > 0 || len(h.Removed) > 0 }

// InitResult is what a run did.
type InitResult struct {
	Hosts []HostChange
	// Gone are hosts whose bundles were removed: no longer in the site.
	Gone []string
	// People are the people bundles written (operators, auditors, admin).
	People []string
	// CertsRenewed counts certificates reissued.
	CertsRenewed int
}

// Init derives every host's bundle from the site (already checked) into
// opt.Out. It is idempotent: the same site gives the same bundles byte for
// byte, and a changed site changes exactly the files it implies.
func Init(s Site, opt InitOptions) (InitResult, error) {
	var res InitResult
	if opt.Out == "" {
		return res, errors.New("init: no output directory")
	}
	if err := os.MkdirAll(opt.Out, 0o700); err != nil {
		return res, fmt.Errorf("init: %w", err)
	}
	// The directory holds every secret of the site.
	if err := os.Chmod(opt.Out, 0o700); err != nil {
		return res, fmt.Errorf("init: %w", err)
	}
	if err := sameCluster(opt.Out, s.Cluster); err != nil {
		return res, err
	}
	sec, err := loadSecrets(filepath.Join(opt.Out, SecretsOut), s)
	if err != nil {
		return res, err
	}
	bc := s.BusCluster()
	if err := bc.Validate(); err != nil {
		return res, fmt.Errorf("init: the bus derived from the site: %w", err)
	}
	busOut := filepath.Join(opt.Out, BusOut)
	gen, err := natsconfig.Generate(bc, natsconfig.Options{Out: busOut, Renew: opt.Renew, Now: opt.Now,
		WrittenBy: "fanctl init", From: "the site file"})
	if err != nil {
		return res, fmt.Errorf("init: bus credentials: %w", err)
	}
	res.CertsRenewed = len(gen.Renewed)

	want := map[string]bool{}
	for _, h := range s.Hosts {
		want[h.Name] = true
		b, err := s.bundle(bc, h, busOut, sec)
		if err != nil {
			return res, err
		}
		ch, err := b.write(filepath.Join(opt.Out, HostsOut, h.Name))
		if err != nil {
			return res, err
		}
		ch.Host = h.Name
		res.Hosts = append(res.Hosts, ch)
	}
	gone, err := removeOthers(filepath.Join(opt.Out, HostsOut), want)
	if err != nil {
		return res, err
	}
	res.Gone = gone

	people := map[string]bool{}
	for _, p := range s.personBundles() {
		people[p.name] = true
		if err := writePerson(bc, busOut, filepath.Join(opt.Out, p.dir), p); err != nil {
			return res, err
		}
		res.People = append(res.People, filepath.Join(p.dir))
	}
	if _, err := removeOthers(filepath.Join(opt.Out, PeopleOut), people); err != nil {
		return res, err
	}
	if opt.SiteFile != nil {
		if err := durablefile.Write(filepath.Join(opt.Out, SiteCopy), opt.SiteFile, 0o600); err != nil {
			return res, fmt.Errorf("init: %w", err)
		}
	}
	return res, nil
}

// sameCluster refuses an output directory made for another cluster: its CA
// names that cluster, and mixing two sites' keys would give one site's
// hosts the other's identities.
func sameCluster(out, cluster string) error {
	b, err := os.ReadFile(filepath.Join(out, SiteCopy))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	var prev struct {
		Cluster string `yaml:"cluster"`
	}
	if err := yaml.Unmarshal(b, &prev); err != nil {
		return fmt.Errorf("init: %s: %w", filepath.Join(out, SiteCopy), err)
	}
	if prev.Cluster != "" && prev.Cluster != cluster {
		return fmt.Errorf("init: %s was made for cluster %q, the site file says %q: use another output directory (a cluster's name is in every certificate and subject)", out, prev.Cluster, cluster)
	}
	return nil
}

// loadSecrets reads each PBX host's AMI secret and the page token, making
// the missing ones.
func loadSecrets(dir string, s Site) (secrets, error) {
	sec := secrets{AMI: map[string]string{}}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return sec, fmt.Errorf("init: %w", err)
	}
	get := func(name string) (string, error) {
		path := filepath.Join(dir, name)
		if b, err := os.ReadFile(path); err == nil {
			v := strings.TrimSpace(string(b))
			if len(v) < 16 {
				return "", fmt.Errorf("init: %s holds fewer than 16 characters: remove it to make a new one", path)
			}
			return v, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("init: %w", err)
		}
		var rnd [24]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return "", fmt.Errorf("init: %w", err)
		}
		// URL-safe base64: no character manager.conf or YAML reads specially.
		v := base64.RawURLEncoding.EncodeToString(rnd[:])
		if err := durablefile.Write(path, []byte(v+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("init: %w", err)
		}
		return v, nil
	}
	for _, h := range s.Hosts {
		if h.Role != RolePBX {
			continue
		}
		v, err := get("ami-" + h.Name)
		if err != nil {
			return sec, err
		}
		sec.AMI[h.Name] = v
	}
	if s.StatusPage.Host != NoStatusPage {
		v, err := get("page.token")
		if err != nil {
			return sec, err
		}
		sec.PageToken = v
	}
	return sec, nil
}

// hostBundle is one host's bundle before it is written.
type hostBundle struct {
	plan  Plan
	files map[string][]byte // destination path -> content
	extra map[string][]byte // bundle-relative path -> content (not installed by the plan's files)
}

func (b *hostBundle) add(f PlanFile, data []byte) {
	b.plan.Files = append(b.plan.Files, f)
	b.files[f.Path] = data
}

// unitOf is the unit a bus identity's files belong to (prober.nk,
// arbiter-system.nk, ...).
func unitOf(file string) string {
	role, _, _ := strings.Cut(file, ".")
	role, _, _ = strings.Cut(role, "-")
	return "fan-" + role
}

func (s Site) bundle(bc natsconfig.Cluster, h Host, busOut string, sec secrets) (*hostBundle, error) {
	b := &hostBundle{
		plan:  Plan{Version: PlanVersion, Cluster: s.Cluster, Host: h.Name, Role: h.Role, Address: h.Address},
		files: map[string][]byte{},
		extra: map[string][]byte{},
	}
	b.plan.Dirs = []PlanDir{
		{Path: EtcDir, Owner: "root", Group: UserFan, Mode: 0o750},
		{Path: BusDir, Owner: "root", Group: UserFan, Mode: 0o750},
		{Path: NATSDir, Owner: "root", Group: UserFan, Mode: 0o750},
	}
	// The host's identities, one per service, from the bus's bundle.
	idDir := natsconfig.Bundle(busOut, h.Name)
	if err := copyIdentity(b, idDir, BusDir, UserFan, func(name string) bool {
		return !strings.HasSuffix(name, "-bus.yaml") && name != natsconfig.FanctlFile
	}); err != nil {
		return nil, err
	}
	natsUnit := []string{"fan-nats"}
	srvDir := natsconfig.Bundle(busOut, ServerName(h.Name))
	if err := copyIdentity(b, srvDir, NATSDir, UserFan, nil); err != nil {
		return nil, err
	}
	b.add(PlanFile{Path: filepath.Join(EtcDir, "nats.yaml"), Owner: "root", Group: UserFan, Mode: 0o640, Units: natsUnit}, s.natsConfig(h))

	conf := func(svc string, data []byte, secret bool) {
		b.add(PlanFile{Path: filepath.Join(EtcDir, svc+".yaml"), Owner: "root", Group: UserFan, Mode: 0o640, Secret: secret, Units: []string{"fan-" + svc}}, data)
	}
	conf("arbiter", s.arbiterConfig(bc, h), false)
	switch h.Role {
	case RolePBX:
		conf("prober", s.proberConfig(bc, h, sec), true)
		conf("replicator", s.replicatorConfig(bc, h, sec), true)
		conf("ipmover", s.ipmoverConfig(bc, h, sec), true)
		// The ipmover last: it holds the address, and nothing it needs
		// should start after it.
		b.plan.Units = []string{"fan-nats", "fan-arbiter", "fan-prober", "fan-replicator", "fan-ipmover"}
		if s.Asterisk.Answer == "hot" {
			b.add(PlanFile{Path: SysctlFile, Owner: "root", Group: "root", Mode: 0o644}, s.sysctlConfig(h))
			b.plan.Sysctl = SysctlFile
		}
		b.extra["asterisk/manager-fan.conf"] = s.managerUser(h, sec)
		b.extra["asterisk/pjsip-transports.conf"] = s.pjsipTransports(h)
		b.extra["asterisk/asterisk-options.conf"] = s.asteriskConfNote(h)
		if *s.Asterisk.ManageAMIUser {
			b.plan.ManagerUser = "asterisk/manager-fan.conf"
		}
	case RoleWitness:
		conf("scheduler", s.schedulerConfig(bc, h), false)
		b.plan.Units = []string{"fan-nats", "fan-arbiter", "fan-scheduler"}
	}
	if s.HasStatusPage(h.Name) {
		b.plan.Dirs = append(b.plan.Dirs, PlanDir{Path: StatusDir, Owner: "root", Group: UserStatus, Mode: 0o750})
		if err := copyIdentity(b, natsconfig.Bundle(busOut, viewerName(h.Name)), StatusDir, UserStatus, func(name string) bool {
			return name != natsconfig.FanctlFile
		}); err != nil {
			return nil, err
		}
		unit := []string{"fan-status"}
		b.add(PlanFile{Path: filepath.Join(StatusDir, "status.yaml"), Owner: "root", Group: UserStatus, Mode: 0o640, Units: unit}, s.statusConfig(bc, h))
		b.add(PlanFile{Path: filepath.Join(StatusDir, "page.token"), Owner: "root", Group: UserStatus, Mode: 0o640, Secret: true, Units: unit}, []byte(sec.PageToken+"\n"))
		b.plan.Units = append(b.plan.Units, "fan-status")
	}
	sort.Slice(b.plan.Files, func(i, j int) bool { return b.plan.Files[i].Path < b.plan.Files[j].Path })
	return b, nil
}

// copyIdentity adds every file of a natsconfig bundle directory (keep
// filters them) under dest: seeds and keys readable by group only,
// certificates by all.
func copyIdentity(b *hostBundle, src, dest, group string, keep func(string) bool) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || (keep != nil && !keep(name)) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return fmt.Errorf("init: %w", err)
		}
		f := PlanFile{Path: filepath.Join(dest, name), Owner: "root", Group: "root", Mode: 0o644}
		if strings.HasSuffix(name, ".nk") || strings.HasSuffix(name, "-key.pem") || name == "nats-server.conf" {
			f.Group, f.Mode = group, 0o640
			f.Secret = name != "nats-server.conf"
		}
		switch {
		case dest == NATSDir:
			// Users, permissions, routes and certificates apply on a
			// reload: no server restart when a person is added.
			f.Units, f.Reload = []string{"fan-nats"}, true
		case dest == StatusDir:
			f.Units = []string{"fan-status"}
		case name == "ca.pem":
			// Every service of the host reads the CA.
		default:
			f.Units = []string{unitOf(name)}
		}
		b.add(f, data)
	}
	return nil
}

// write puts the bundle into dir and says what changed since the bundle
// that was there.
func (b *hostBundle) write(dir string) (HostChange, error) {
	var ch HostChange
	old, err := ReadPlan(dir)
	oldFiles := map[string]PlanFile{}
	switch {
	case err == nil:
		for _, f := range old.Files {
			oldFiles[f.Path] = f
		}
	case errors.Is(err, fs.ErrNotExist):
		ch.New = true
	default:
		// An unreadable old plan: treat the bundle as new.
		ch.New = true
	}
	for _, f := range b.plan.Files {
		path := filepath.Join(dir, FilesDir, f.Path)
		data := b.files[f.Path]
		prev, had := oldFiles[f.Path]
		cur, rerr := os.ReadFile(path)
		if !had || rerr != nil || !bytes.Equal(cur, data) || prev.Mode != f.Mode || prev.Owner != f.Owner || prev.Group != f.Group {
			if !ch.New {
				ch.Changed = append(ch.Changed, f.Path)
			}
		}
		delete(oldFiles, f.Path)
		if rerr == nil && bytes.Equal(cur, data) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return ch, fmt.Errorf("init: %w", err)
		}
		if err := durablefile.Write(path, data, 0o600); err != nil {
			return ch, fmt.Errorf("init: %w", err)
		}
	}
	for p := range oldFiles {
		ch.Removed = append(ch.Removed, p)
		_ = os.Remove(filepath.Join(dir, FilesDir, p))
	}
	sort.Strings(ch.Removed)
	for rel, data := range b.extra {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return ch, fmt.Errorf("init: %w", err)
		}
		if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
			continue
		}
		if err := durablefile.Write(path, data, 0o600); err != nil {
			return ch, fmt.Errorf("init: %w", err)
		}
		// The manager user is installed: its change is the host's too.
		if rel == b.plan.ManagerUser && !ch.New {
			ch.Changed = append(ch.Changed, filepath.Join(AsteriskDir, ManagerInclude))
		}
	}
	plan, err := json.MarshalIndent(b.plan, "", "  ")
	if err != nil {
		return ch, err
	}
	if err := durablefile.Write(filepath.Join(dir, PlanName), append(plan, '\n'), 0o600); err != nil {
		return ch, fmt.Errorf("init: %w", err)
	}
	if err := durablefile.Write(filepath.Join(dir, InstallScript), installScript(b.plan), 0o700); err != nil {
		return ch, fmt.Errorf("init: %w", err)
	}
	return ch, nil
}

func installScript(p Plan) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "#!/bin/sh\n")
	fmt.Fprintf(&b, "# Installs fan on %s (%s host of site %s): its configuration, credentials and\n", p.Host, p.Role, p.Cluster)
	fmt.Fprintf(&b, "# units. Run as root on %s, after installing the fan package. Written by\n", p.Host)
	fmt.Fprintf(&b, "# `fanctl init`; it is `fanctl install-host` on this directory.\n")
	fmt.Fprintf(&b, "set -e\n")
	fmt.Fprintf(&b, "exec fanctl install-host \"$(dirname \"$0\")\" \"$@\"\n")
	return []byte(b.String())
}

// removeOthers removes the subdirectories of dir not in keep and names them.
func removeOthers(dir string, keep map[string]bool) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	var gone []string
	for _, e := range ents {
		if !e.IsDir() || keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return gone, fmt.Errorf("init: %w", err)
		}
		gone = append(gone, e.Name())
	}
	return gone, nil
}

// person is an operator's, auditor's or the admin's bundle.
type person struct {
	name, dir string
	role      events.BusRole
}

func (s Site) personBundles() []person {
	var out []person
	for _, n := range s.People.Operators {
		out = append(out, person{name: n, dir: filepath.Join(PeopleOut, n), role: events.RoleOperator})
	}
	for _, n := range s.People.Auditors {
		out = append(out, person{name: n, dir: filepath.Join(PeopleOut, n), role: events.RoleAuditor})
	}
	out = append(out, person{name: "admin", dir: AdminOut, role: events.RoleAdmin})
	return out
}

// writePerson copies a person's identity into dir with a fanctl.yaml that
// names its files relative to itself, so the bundle works wherever its
// owner puts it (fanctl --config DIR/fanctl.yaml).
func writePerson(bc natsconfig.Cluster, busOut, dir string, p person) error {
	src := natsconfig.Bundle(busOut, p.name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	role := string(p.role)
	for _, name := range []string{natsconfig.SeedFile(role), natsconfig.CertFile(role), natsconfig.KeyFile(role), "ca.pem"} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return fmt.Errorf("init: %w", err)
		}
		if err := writeIfChanged(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	w := &yw{}
	w.line(0, "# fanctl --config for %s %s (site %s), written by `fanctl init`. The", role, p.name, bc.Cluster)
	w.line(0, "# files it names are beside it: keep them together, readable by you only.")
	w.line(0, "cluster: %s", q(bc.Cluster))
	if p.role == events.RoleOperator {
		w.line(0, "operator: %s", q(p.name))
	}
	w.line(0, "url: %s", q(strings.Join(bc.ClientURLs(""), ",")))
	w.line(0, "nkey_seed: %s", q(natsconfig.SeedFile(role)))
	w.line(0, "tls:")
	w.line(1, "ca: ca.pem")
	w.line(1, "cert: %s", q(natsconfig.CertFile(role)))
	w.line(1, "key: %s", q(natsconfig.KeyFile(role)))
	return writeIfChanged(filepath.Join(dir, natsconfig.FanctlFile), w.bytes(), 0o600)
}

func writeIfChanged(path string, data []byte, mode os.FileMode) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	if err := durablefile.Write(path, data, mode); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	return nil
}

// Sorted returns names sorted, for stable output.
func Sorted(names []string) []string {
	out := slices.Clone(names)
	sort.Strings(out)
	return out
}
