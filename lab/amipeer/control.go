package amipeer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/ctlsock"
)

// The control socket speaks lab/ctlsock's protocol; ctlsock.Call is its
// client.

// ControlServer serves control commands for one peer on a unix socket.
type ControlServer struct {
	ln   net.Listener
	peer *Peer
	log  *slog.Logger
	wg   sync.WaitGroup
}

// ListenControl serves control commands for p on the unix socket at path,
// replacing a stale socket left by an earlier run. logger may be nil.
func ListenControl(p *Peer, path string, logger *slog.Logger) (*ControlServer, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("amipeer: control listen %s: %w", path, err)
	}
	cs := &ControlServer{ln: ln, peer: p, log: logger}
	cs.wg.Add(1)
	go cs.serve()
	return cs, nil
}

// Close stops serving and removes the socket file.
func (cs *ControlServer) Close() error {
	err := cs.ln.Close()
	cs.wg.Wait()
	return err
}

func (cs *ControlServer) serve() {
	defer cs.wg.Done()
	for {
		c, err := cs.ln.Accept()
		if err != nil {
			return
		}
		cs.wg.Add(1)
		go func() {
			defer cs.wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(io.LimitReader(c, 4096)).ReadString('\n')
			if err != nil && line == "" {
				return
			}
			reply, err := ExecControl(cs.peer, strings.Fields(line))
			if err != nil {
				cs.log.Warn("amipeer control command failed", "command", strings.TrimSpace(line), "err", err)
				reply = ctlsock.ErrorPrefix + err.Error() + "\n"
			} else {
				cs.log.Info("amipeer control command", "command", strings.TrimSpace(line))
			}
			_, _ = io.WriteString(c, reply)
		}()
	}
}

// ControlUsage lists the control commands.
const ControlUsage = "normal | dead | frozen | failing | slow DURATION | channels N CALLS [PROCESSED] | actions | status"

// ExecControl runs one control command against p and returns its reply:
// "ok" lines for changes, JSON for actions (one object per line) and status.
func ExecControl(p *Peer, args []string) (string, error) {
	if len(args) == 0 {
		return "", fmt.Errorf("no command (%s)", ControlUsage)
	}
	switch args[0] {
	case "normal", "dead", "frozen", "failing":
		if len(args) != 1 {
			return "", fmt.Errorf("%s takes no arguments", args[0])
		}
		if err := p.SetMode(Mode(args[0])); err != nil {
			return "", err
		}
		return "ok mode " + args[0] + "\n", nil
	case "slow":
		if len(args) > 2 {
			return "", errors.New("usage: slow [DURATION]")
		}
		if len(args) == 2 {
			d, err := time.ParseDuration(args[1])
			if err != nil || d < 0 {
				return "", fmt.Errorf("slow: bad duration %q", args[1])
			}
			p.SetSlowDelay(d)
		}
		if err := p.SetMode(ModeSlow); err != nil {
			return "", err
		}
		return "ok mode slow " + p.Status().SlowDelay + "\n", nil
	case "channels":
		if len(args) < 3 || len(args) > 4 {
			return "", errors.New("usage: channels N CALLS [PROCESSED]")
		}
		var nums []int
		for _, a := range args[1:] {
			n, err := strconv.Atoi(a)
			if err != nil || n < 0 {
				return "", fmt.Errorf("channels: bad number %q", a)
			}
			nums = append(nums, n)
		}
		// The channels are channels the peer has (SetLoneChannels), not
		// only a count: the replicator lists them as the prober counts them.
		f := p.setFigures()
		f.Channels, f.Calls = 0, nums[1]
		if len(nums) == 3 {
			f.Processed = nums[2]
		}
		p.SetFigures(f)
		p.SetLoneChannels(nums[0])
		return fmt.Sprintf("ok channels %d calls %d processed %d\n", nums[0], f.Calls, f.Processed), nil
	case "actions":
		var b strings.Builder
		enc := json.NewEncoder(&b)
		for _, a := range p.Actions() {
			if err := enc.Encode(a); err != nil {
				return "", err
			}
		}
		return b.String(), nil
	case "status":
		b, err := json.Marshal(p.Status())
		if err != nil {
			return "", err
		}
		return string(b) + "\n", nil
	}
	return "", fmt.Errorf("unknown command %q (%s)", args[0], ControlUsage)
}
