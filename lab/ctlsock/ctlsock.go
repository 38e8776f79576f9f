// Package ctlsock is the lab's control-socket protocol, which the AMI peer
// (lab/amipeer) and the PBX stand-in (lab/pbxstandin) serve: one command
// line per connection on a unix socket, answered with text and a close. A
// reply that starts with ErrorPrefix reports a failed command. A unix
// socket is reachable from every network namespace of the lab (and through
// `docker compose exec`), where the program's TCP ports may not be.
package ctlsock

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// ErrorPrefix starts the reply to a command that failed; the rest of its
// first line says why.
const ErrorPrefix = "error: "

// Call sends one command (args joined by spaces) to the socket at path and
// returns the reply. A reply that reports a failure is an error naming the
// command. ctx bounds the whole exchange.
func Call(ctx context.Context, path string, args ...string) (string, error) {
	cmd := strings.Join(args, " ")
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return "", fmt.Errorf("control %s: %w", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	// A cancelled ctx ends a read or write in progress at once.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return "", fmt.Errorf("control %s: send %q: %w", path, cmd, err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", fmt.Errorf("control %s: reply to %q: %w", path, cmd, err)
	}
	reply := string(b)
	if msg, ok := strings.CutPrefix(reply, ErrorPrefix); ok {
		return "", fmt.Errorf("control %s: %s", cmd, strings.TrimSpace(msg))
	}
	return reply, nil
}
