package daemon

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Notifier speaks systemd's notification protocol (sd_notify(3)): one
// datagram per message to the unix socket in $NOTIFY_SOCKET. It is written
// by hand because libsystemd would need cgo and the binaries are static. A
// zero Notifier (not started by systemd) drops every message.
type Notifier struct {
	addr     *net.UnixAddr
	watchdog time.Duration
}

// Messages fan sends (sd_notify(3)).
const (
	NotifyReady     = "READY=1"
	NotifyReloading = "RELOADING=1"
	NotifyStopping  = "STOPPING=1"
	NotifyWatchdog  = "WATCHDOG=1"
)

// NotifierFromEnv reads $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID and
// then removes them from the environment, as sd_notify's unset_environment
// does, so a child process (an exec check) cannot speak for this service.
// The watchdog is enabled only when WATCHDOG_PID is unset or names this
// process: the variables may have been inherited from a parent.
func NotifierFromEnv() (*Notifier, error) {
	sock := os.Getenv("NOTIFY_SOCKET")
	usec := os.Getenv("WATCHDOG_USEC")
	pid := os.Getenv("WATCHDOG_PID")
	for _, k := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} {
		_ = os.Unsetenv(k)
	}
	n := &Notifier{}
	if sock == "" {
		return n, nil
	}
	// A leading '@' is the abstract namespace; Go's net package maps it.
	if !strings.HasPrefix(sock, "/") && !strings.HasPrefix(sock, "@") {
		return n, fmt.Errorf("NOTIFY_SOCKET %q: want an absolute path or @abstract name", sock)
	}
	n.addr = &net.UnixAddr{Name: sock, Net: "unixgram"}
	if usec == "" {
		return n, nil
	}
	if pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return n, nil
	}
	us, err := strconv.ParseUint(usec, 10, 63)
	if err != nil || us == 0 {
		return n, fmt.Errorf("WATCHDOG_USEC %q: want a positive number of microseconds", usec)
	}
	n.watchdog = time.Duration(us) * time.Microsecond
	return n, nil
}

// Enabled reports whether a service manager listens.
func (n *Notifier) Enabled() bool { return n != nil && n.addr != nil }

// WatchdogInterval is the manager's watchdog timeout (WatchdogSec=), zero
// when the watchdog is off. Pings go out at half of it, as systemd advises.
func (n *Notifier) WatchdogInterval() time.Duration {
	if !n.Enabled() {
		return 0
	}
	return n.watchdog
}

// Send sends one or more newline-separated assignments in one datagram.
func (n *Notifier) Send(state ...string) error {
	if !n.Enabled() {
		return nil
	}
	// A fresh socket per message: messages are rare (a few per watchdog
	// period) and a connected socket would go stale if systemd re-executes.
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sd_notify dial %s: %w", n.addr.Name, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(strings.Join(state, "\n"))); err != nil {
		return fmt.Errorf("sd_notify %s: %w", n.addr.Name, err)
	}
	return nil
}
