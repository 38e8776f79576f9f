package regbench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fanpbx/fan/pkg/platform/poll"
)

// procs are the processes the benchmark started, each in a process group
// of its own, all killed when it ends.
type procs struct {
	mu   sync.Mutex
	list []*exec.Cmd
}

func (ps *procs) start(dir, name string, argv ...string) (*exec.Cmd, error) {
	return ps.startEnv(dir, name, nil, argv...)
}

// startEnv starts argv with env added to the benchmark's environment.
func (ps *procs) startEnv(dir, name string, env []string, argv ...string) (*exec.Cmd, error) {
	out, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	go func() {
		_ = cmd.Wait()
		out.Close()
	}()
	ps.mu.Lock()
	ps.list = append(ps.list, cmd)
	ps.mu.Unlock()
	return cmd, nil
}

// kill kills one process group at once (a crash).
func kill(cmd *exec.Cmd) {
	if cmd != nil && cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (ps *procs) killAll() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, c := range ps.list {
		kill(c)
	}
}

// waitTCP waits until something accepts connections on addr.
func waitTCP(ctx context.Context, addr string, within time.Duration) error {
	return poll.Until(ctx, within, addr+" accepting connections", func() error {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// pbxNode is one PBX: the stand-in, or a real Asterisk 22.
type pbxNode struct {
	name    string
	sipPort int
	amiAddr string
	cmd     *exec.Cmd
}

func (n *pbxNode) sipAddr() string { return "127.0.0.1:" + strconv.Itoa(n.sipPort) }

const (
	amiUser   = "fan"
	amiSecret = "regbench-secret"
	// systemName is both nodes': a contact carries reg_server, and a
	// standby only uses contacts of its own system name.
	systemName = "pbx"
)

// startStandIn runs fan-pbxstandin as a registrar.
func startStandIn(ps *procs, dir, bin string, n *pbxNode) error {
	cmd, err := ps.start(dir, n.name+"-pbx", filepath.Join(bin, "fan-pbxstandin"), "-node", n.name, "-sip", n.sipAddr(),
		"-ami-listen", n.amiAddr, "-ami-user", amiUser, "-ami-secret", amiSecret, "-control", filepath.Join(dir, n.name+"-pbx.sock"),
		"-registrar", "-system-name", systemName)
	n.cmd = cmd
	return err
}

// startAsterisk runs a real Asterisk 22 from the install at root (bin in
// root/sbin, modules in root/lib/asterisk/modules) with a configuration of
// its own under dir: phones as endpoints and AORs (max_contacts 1,
// remove_existing), send_contact_status_on_update_registration=yes, AMI
// on n.amiAddr with a user that may read system events, write DB actions,
// filters and Originate.
func startAsterisk(ps *procs, dir, root string, n *pbxNode, users []string) error {
	base := filepath.Join(dir, n.name+"-asterisk")
	for _, d := range []string{"etc", "lib", "run", "log", "spool", "agi"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			return err
		}
	}
	host, port, _ := net.SplitHostPort(n.amiAddr)
	files := map[string]string{
		"asterisk.conf": fmt.Sprintf(`[directories]
astetcdir => %[1]s/etc
astmoddir => %[2]s/lib/asterisk/modules
astvarlibdir => %[1]s/lib
astdbdir => %[1]s/lib
astkeydir => %[1]s/lib
astdatadir => %[2]s/var/lib/asterisk
astagidir => %[1]s/agi
astspooldir => %[1]s/spool
astrundir => %[1]s/run
astlogdir => %[1]s/log
astsbindir => %[2]s/sbin
[options]
systemname => %[3]s
`, base, root, systemName),
		"modules.conf": `[modules]
autoload=yes
noload => chan_iax2.so
noload => chan_dahdi.so
noload => chan_unistim.so
noload => chan_skinny.so
noload => chan_mgcp.so
noload => res_ari.so
noload => res_stasis.so
noload => res_hep.so
noload => res_hep_pjsip.so
noload => res_hep_rtcp.so
noload => res_config_pgsql.so
noload => cdr_pgsql.so
noload => cel_pgsql.so
noload => res_phoneprov.so
noload => res_pjsip_phoneprov_provider.so
noload => res_http_websocket.so
noload => res_pjsip_transport_websocket.so
noload => res_prometheus.so
`,
		"manager.conf": fmt.Sprintf(`[general]
enabled = yes
port = %s
bindaddr = %s
[%s]
secret = %s
read = system,call,reporting
write = system,call,reporting,originate,command
`, port, host, amiUser, amiSecret),
		"logger.conf":     "[general]\n[logfiles]\nmessages => notice,warning,error\n",
		"extensions.conf": "[default]\nexten => echo,1,Answer()\n same => n,Echo()\n",
	}
	var pj strings.Builder
	fmt.Fprintf(&pj, "[global]\ntype=global\nsend_contact_status_on_update_registration=yes\n\n[udp]\ntype=transport\nprotocol=udp\nbind=%s\n\n", n.sipAddr())
	pj.WriteString("[phone-ep](!)\ntype=endpoint\ncontext=default\ndisallow=all\nallow=ulaw\n\n[phone-aor](!)\ntype=aor\nmax_contacts=1\nremove_existing=yes\n\n")
	for _, u := range users {
		fmt.Fprintf(&pj, "[%s](phone-ep)\naors=%s\n[%s](phone-aor)\n", u, u, u)
	}
	files["pjsip.conf"] = pj.String()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(base, "etc", name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	cmd, err := ps.start(dir, n.name+"-pbx", filepath.Join(root, "sbin", "asterisk"), "-C", filepath.Join(base, "etc", "asterisk.conf"), "-f")
	n.cmd = cmd
	return err
}

// replicatorConfig is a node's fan-replicator: no file trees, registrations
// only, against its own PBX's AMI.
func replicatorConfig(dir, node, natsURL, amiAddr string) (string, error) {
	state := filepath.Join(dir, node+"-replicator-state")
	body := fmt.Sprintf(`cluster: regbench
node: %s
bus:
  url: %s
  insecure_lab: true
group: pbx
state_dir: %s
trees: []
astdb:
  enabled: true
  families: [registrar]
  reconcile_interval: 60s
  ami:
    address: "%s"
    username: %s
    secret: %s
`, node, natsURL, state, amiAddr, amiUser, amiSecret)
	p := filepath.Join(dir, node+"-replicator.yaml")
	return p, os.WriteFile(p, []byte(body), 0o600)
}
