package doctor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"go.yaml.in/yaml/v3"
)

// The parts of fan's files doctor reads. They are decoded leniently (a key
// doctor does not know is not its business: -check-config judges the file)
// into the keys below, named as each service's README names them.

type common struct {
	Cluster string     `yaml:"cluster"`
	Node    string     `yaml:"node"`
	Bus     bus.Config `yaml:"bus"`
}

type amiSection struct {
	Address  string `yaml:"address"`
	Username string `yaml:"username"`
	Secret   string `yaml:"secret"`
}

type proberCheck struct {
	Name       string `yaml:"name"`
	Kind       string `yaml:"kind"`
	Role       string `yaml:"role"`
	TargetNode string `yaml:"target_node"`
	Address    string `yaml:"address"`
	Username   string `yaml:"username"`
	Secret     string `yaml:"secret"`
	Transport  string `yaml:"transport"`
}

func (c proberCheck) role() string {
	if c.Role == "" {
		return "self"
	}
	return c.Role
}

type proberFile struct {
	common `yaml:",inline"`
	Checks []proberCheck `yaml:"checks"`
}

type ipmoverGroup struct {
	Name     string   `yaml:"name"`
	Prefixes []string `yaml:"prefixes"`
}

type ipmoverFile struct {
	common    `yaml:",inline"`
	Executor  string         `yaml:"executor"`
	Interface string         `yaml:"interface"`
	Groups    []ipmoverGroup `yaml:"groups"`
	Answer    struct {
		Mode    string   `yaml:"mode"`
		Modules []string `yaml:"modules"`
	} `yaml:"answer"`
	AMI    amiSection `yaml:"ami"`
	Verify struct {
		Port int `yaml:"port"`
	} `yaml:"verify"`
}

// answerMode is answer.mode with the ipmover's default.
func (f *ipmoverFile) answerMode() string {
	if f.Answer.Mode == "" {
		return "hot"
	}
	return f.Answer.Mode
}

// sipPort is the port Asterisk answers on at the floating address
// (verify.port, 5060 by default).
func (f *ipmoverFile) sipPort() int {
	if f.Verify.Port == 0 {
		return 5060
	}
	return f.Verify.Port
}

func (f *ipmoverFile) isIP() bool { return f.Executor == "" || f.Executor == "ip" }

type replicatorFile struct {
	common `yaml:",inline"`
	Group  string `yaml:"group"`
	AstDB  struct {
		Enabled  bool       `yaml:"enabled"`
		Families []string   `yaml:"families"`
		AMI      amiSection `yaml:"ami"`
	} `yaml:"astdb"`
	Calls struct {
		Enabled *bool      `yaml:"enabled"`
		AMI     amiSection `yaml:"ami"`
	} `yaml:"calls"`
}

// callsAMI is the recorder of calls' login: its own, else the
// registrations' (as fan-replicator reads the file).
func (f *replicatorFile) callsAMI() amiSection {
	if f.Calls.AMI == (amiSection{}) && f.AstDB.Enabled {
		return f.AstDB.AMI
	}
	return f.Calls.AMI
}

// recordsCalls: the recorder is on (by default wherever there is a login).
func (f *replicatorFile) recordsCalls() bool {
	if f.Calls.Enabled != nil {
		return *f.Calls.Enabled
	}
	return f.callsAMI().Address != ""
}

type arbiterGroup struct {
	Name        string   `yaml:"name"`
	Addresses   []string `yaml:"addresses"`
	Nodes       []string `yaml:"nodes"`
	HealthCheck string   `yaml:"health_check"`
}

type arbiterFile struct {
	common  `yaml:",inline"`
	Standby bool           `yaml:"standby"`
	Groups  []arbiterGroup `yaml:"groups"`
}

type schedulerFile struct {
	common `yaml:",inline"`
}

// statusFile is the status page's fanctl configuration (status.yaml).
type statusFile struct {
	Cluster string `yaml:"cluster"`
}

// natsFile is fan-nats's configuration (/etc/fan/nats.yaml, cmd/README.md).
type natsFile struct {
	ServerName string `yaml:"server_name"`
	Listen     string `yaml:"listen"`
	Cluster    struct {
		Name   string   `yaml:"name"`
		Listen string   `yaml:"listen"`
		Routes []string `yaml:"routes"`
	} `yaml:"cluster"`
	ServerConfig string `yaml:"server_config"`
}

// files are the fan files found on this host; a nil field is a file that
// is not there.
type files struct {
	dir        string
	prober     *proberFile
	ipmover    *ipmoverFile
	replicator *replicatorFile
	arbiter    *arbiterFile
	scheduler  *schedulerFile
	status     *statusFile
	nats       *natsFile
}

// service is one fan service's file on this host.
type service struct {
	name string // prober, ipmover, ...
	file string // its path
	c    *common
}

// services lists the services configured here, in a fixed order.
func (f *files) services() []service {
	var out []service
	add := func(name string, c *common) {
		out = append(out, service{name: name, file: filepath.Join(f.dir, name+".yaml"), c: c})
	}
	if f.prober != nil {
		add("prober", &f.prober.common)
	}
	if f.ipmover != nil {
		add("ipmover", &f.ipmover.common)
	}
	if f.replicator != nil {
		add("replicator", &f.replicator.common)
	}
	if f.arbiter != nil {
		add("arbiter", &f.arbiter.common)
	}
	if f.scheduler != nil {
		add("scheduler", &f.scheduler.common)
	}
	return out
}

func (f *files) names() []string {
	var out []string
	for _, s := range f.services() {
		out = append(out, s.name+".yaml")
	}
	if f.status != nil {
		out = append(out, "status.yaml")
	}
	if f.nats != nil {
		out = append(out, "nats.yaml")
	}
	return out
}

func (f *files) empty() bool { return len(f.services()) == 0 && f.nats == nil }

// isPBX says whether this host runs a PBX node's services.
func (f *files) isPBX() bool { return f.prober != nil || f.ipmover != nil || f.replicator != nil }

// node is this host's name in fan, from the first service file that says.
func (f *files) node() string {
	for _, s := range f.services() {
		if s.c.Node != "" {
			return s.c.Node
		}
	}
	return ""
}

// loadFiles reads every fan file in dir; one that is there and cannot be
// read is an error finding (and left out), one that is not there is simply
// not this host's.
func loadFiles(dir string, out *findings) *files {
	f := &files{dir: dir}
	load := func(name string, dst any) bool {
		path := filepath.Join(dir, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return false
		}
		if err == nil {
			dec := yaml.NewDecoder(bytes.NewReader(b))
			if err = dec.Decode(dst); errors.Is(err, io.EOF) {
				err = errors.New("the file is empty")
			}
		}
		if err != nil {
			svc := strings.TrimSuffix(name, ".yaml")
			fix := "fan-" + svc + " -check-config " + path + " names the key"
			if errors.Is(err, fs.ErrPermission) {
				fix = "run fanctl doctor as root: /etc/fan is root:fan 0750"
			}
			out.addf(Error, "files.read", path, fix, "cannot read it: %v", err)
			return false
		}
		return true
	}
	var (
		p  proberFile
		ip ipmoverFile
		rp replicatorFile
		ar arbiterFile
		sc schedulerFile
		st statusFile
		na natsFile
	)
	if load("prober.yaml", &p) {
		f.prober = &p
	}
	if load("ipmover.yaml", &ip) {
		f.ipmover = &ip
	}
	if load("replicator.yaml", &rp) {
		f.replicator = &rp
	}
	if load("arbiter.yaml", &ar) {
		f.arbiter = &ar
	}
	if load("scheduler.yaml", &sc) {
		f.scheduler = &sc
	}
	if load("status.yaml", &st) {
		f.status = &st
	}
	if load("nats.yaml", &na) {
		f.nats = &na
	}
	if f.empty() {
		out.addf(Error, "files.none", dir, "run fanctl doctor on a fan host, or name the directory with --etc",
			"no fan configuration here (prober.yaml, ipmover.yaml, replicator.yaml, arbiter.yaml, scheduler.yaml, nats.yaml)")
	}
	return f
}

// localServer is the name of this host's NATS server and its route peers,
// from nats.yaml and the nats-server configuration it names. A stock
// nats-server without nats.yaml leaves them unknown.
type localServer struct {
	Name   string
	Listen string   // client address
	Own    string   // its route listen address
	Routes []string // host:port of every route, its own perhaps among them
}

var (
	confServerName = regexp.MustCompile(`(?m)^\s*server_name\s*[:=]\s*"?([^"\s]+)"?`)
	confRoutes     = regexp.MustCompile(`(?s)cluster\s*\{.*?routes\s*[:=]\s*\[([^\]]*)\]`)
	confClusterLn  = regexp.MustCompile(`(?s)cluster\s*\{.*?listen\s*[:=]\s*"?([^"\s]+)"?`)
)

func (f *files) localServer() (localServer, error) {
	if f.nats == nil {
		return localServer{}, nil
	}
	// A copy of the routes: this runs in several checks at once.
	ls := localServer{Name: f.nats.ServerName, Listen: f.nats.Listen, Own: f.nats.Cluster.Listen, Routes: slices.Clone(f.nats.Cluster.Routes)}
	if f.nats.ServerConfig != "" {
		b, err := os.ReadFile(f.nats.ServerConfig)
		if err != nil {
			return ls, fmt.Errorf("nats.yaml server_config: %w", err)
		}
		// nats.yaml's keys win over the server configuration's.
		if m := confServerName.FindSubmatch(b); m != nil && ls.Name == "" {
			ls.Name = string(m[1])
		}
		if m := confRoutes.FindSubmatch(b); m != nil && len(ls.Routes) == 0 {
			for _, r := range strings.Split(string(m[1]), ",") {
				if r = strings.Trim(strings.TrimSpace(r), `"`); r != "" {
					ls.Routes = append(ls.Routes, r)
				}
			}
		}
		if m := confClusterLn.FindSubmatch(b); m != nil && ls.Own == "" {
			ls.Own = string(m[1])
		}
	}
	for i, r := range ls.Routes {
		r = strings.TrimPrefix(strings.TrimPrefix(r, "nats-route://"), "nats://")
		if _, _, err := splitPort(r); err != nil {
			r += ":6222"
		}
		ls.Routes[i] = r
	}
	return ls, nil
}

// splitPort splits host:port and checks the port.
func splitPort(hp string) (string, int, error) {
	i := strings.LastIndex(hp, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("%q has no port", hp)
	}
	p, err := strconv.Atoi(hp[i+1:])
	if err != nil || p < 1 || p > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", hp)
	}
	return strings.Trim(hp[:i], "[]"), p, nil
}
