package ctlsock

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve answers each connection's command line with reply(line); a nil
// reply answers nothing and holds the connection open until the test ends.
func serve(t *testing.T, reply func(string) *string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				if r := reply(line); r != nil {
					_, _ = io.WriteString(c, *r)
					return
				}
				<-done
			}()
		}
	}()
	return path
}

func TestCallSendsOneLineAndReadsTheReply(t *testing.T) {
	path := serve(t, func(line string) *string {
		r := "got " + line
		if strings.HasPrefix(line, "explode") {
			r = ErrorPrefix + "unknown command \"explode\"\n"
		}
		return &r
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r, err := Call(ctx, path, "channels", "4", "2"); err != nil || r != "got channels 4 2\n" {
		t.Fatalf("Call = %q, %v", r, err)
	}
	if _, err := Call(ctx, path, "explode"); err == nil || err.Error() != `control explode: unknown command "explode"` {
		t.Fatalf("a failed command: %v", err)
	}
}

// A server that never answers holds a caller no longer than its context.
func TestCallEndsWithItsContext(t *testing.T) {
	asked := make(chan struct{}, 1)
	path := serve(t, func(string) *string {
		select {
		case asked <- struct{}{}:
		default:
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancelled once the server holds the call.
	go func() { <-asked; cancel() }()
	done := make(chan error, 1)
	go func() { _, err := Call(ctx, path, "status"); done <- err }()
	select {
	case err := <-done:
		var ne net.Error
		if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Call after cancel: %v, want the read cut short", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Call outlived its cancelled context")
	}
}
