package stack

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"

	"github.com/fanpbx/fan/lab/netlab"
)

// busBundles is a bus made as an installer makes one outside the site
// file's shape: a cluster file written by hand, `fanctl nats-config` on it,
// and each service's bus section taken from its host's bundle. The labs of
// the other two ways fan moves a service (sites.go, pool.go) run on it.
type busBundles struct {
	bin string // fan's binaries
	dir string // where nats-config writes (dir/hosts/<name>/)
}

// generate writes clusterFile (YAML text; its nats_dir and fan_dir must be
// bundleMount) and runs `fanctl nats-config` on it.
func (b busBundles) generate(ctx context.Context, clusterFile string) error {
	cf := filepath.Join(b.dir, "cluster.yaml")
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(cf, []byte(clusterFile), 0o644); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(b.bin, "fanctl"), "nats-config", "--cluster-file", cf,
		"--out", filepath.Join(b.dir, "out")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fanctl nats-config: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// bundle is the directory of one host's or person's files.
func (b busBundles) bundle(name string) string { return filepath.Join(b.dir, "out", "hosts", name) }

// file reads file from name's bundle with the bundle's paths pointing at
// the bundle itself (the lab's hosts share one file system).
func (b busBundles) file(name, file string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(b.bundle(name), file))
	if err != nil {
		return "", fmt.Errorf("bundle %s: %w", name, err)
	}
	return strings.ReplaceAll(string(raw), bundleMount+"/", b.bundle(name)+"/"), nil
}

// install writes file of name's bundle, paths rewritten, into dest.
func (b busBundles) install(name, file, dest string) error {
	txt, err := b.file(name, file)
	if err != nil {
		return err
	}
	return os.WriteFile(dest, []byte(txt), 0o600)
}

// busSection is the bus section of service svc on host, as nats-config
// wrote it (starting with "bus:").
func (b busBundles) busSection(host, svc string) (string, error) {
	return b.file(host, svc+"-bus.yaml")
}

// shapeProcs starts fan's services in a lab from configuration templates
// whose data includes the service's bus section (.Bus), checking each file
// with -check-config first, as a unit's ExecStartPre does.
type shapeProcs struct {
	lab   *netlab.Lab
	bin   string
	dir   string
	bus   busBundles
	procs map[string]*netlab.Proc // "<host>/<name>"
}

func newShapeProcs(l *netlab.Lab, bin, dir string) *shapeProcs {
	return &shapeProcs{lab: l, bin: bin, dir: dir, bus: busBundles{bin: bin, dir: filepath.Join(dir, "bus")},
		procs: map[string]*netlab.Proc{}}
}

// config renders tmpl with data plus host's bus section for svc into
// dir/<host>-<svc>.yaml.
func (p *shapeProcs) config(host, svc, tmpl string, data map[string]any) (string, error) {
	bus, err := p.bus.busSection(host, svc)
	if err != nil {
		return "", err
	}
	d := map[string]any{"Bus": bus}
	for k, v := range data {
		d[k] = v
	}
	var buf bytes.Buffer
	if err := template.Must(template.New(svc).Parse(tmpl)).Execute(&buf, d); err != nil {
		return "", fmt.Errorf("config %s on %s: %w", svc, host, err)
	}
	path := filepath.Join(p.dir, host+"-"+svc+".yaml")
	return path, os.WriteFile(path, buf.Bytes(), 0o600)
}

// service writes svc's configuration on host and starts fan-<svc> with it.
func (p *shapeProcs) service(host, svc, tmpl string, data map[string]any) error {
	cfg, err := p.config(host, svc, tmpl, data)
	if err != nil {
		return err
	}
	return p.start(host, "fan-"+svc, filepath.Join(p.bin, "fan-"+svc), "-config", cfg)
}

// start runs argv on host as the process name (after -check-config for a
// fan service with a -config).
func (p *shapeProcs) start(host, name string, argv ...string) error {
	if strings.HasPrefix(name, "fan-") && len(argv) == 3 && argv[1] == "-config" {
		if out, err := p.lab.Exec(context.Background(), host, append(append([]string(nil), argv...), "-check-config")...); err != nil {
			return fmt.Errorf("%s on %s refuses its configuration: %w: %s", name, host, err, bytes.TrimSpace(out))
		}
	}
	pr, err := startProc(p.lab, p.procs[host+"/"+name], host, name, argv)
	if err != nil {
		return err
	}
	p.procs[host+"/"+name] = pr
	return nil
}

// logs is the tail of every process's log, for a failure.
func (p *shapeProcs) logs(n int64) string {
	var b strings.Builder
	for k, pr := range p.procs {
		fmt.Fprintf(&b, "==== %s (%s)\n%s\n", k, pr.LogPath, pr.Tail(n))
	}
	return b.String()
}

// stop stops every process, fan-nats last.
func (p *shapeProcs) stop() {
	for k, pr := range p.procs {
		if !strings.HasSuffix(k, "/fan-nats") {
			_ = pr.Stop()
		}
	}
	for k, pr := range p.procs {
		if strings.HasSuffix(k, "/fan-nats") {
			_ = pr.Stop()
		}
	}
}
