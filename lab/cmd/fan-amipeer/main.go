// Command fan-amipeer runs the AMI test peer (package amipeer) as a process,
// for the lab's network namespaces, and controls a running one.
//
//	fan-amipeer -listen 198.51.100.11:5038 -user fan -secret s3cret -control /run/fan/n1-ami.sock
//	fan-amipeer ctl -control /run/fan/n1-ami.sock frozen
//	fan-amipeer ctl -control /run/fan/n1-ami.sock slow 500ms
//	fan-amipeer ctl -control /run/fan/n1-ami.sock channels 3 1
//	fan-amipeer ctl -control /run/fan/n1-ami.sock actions
//
// The control socket is a unix socket so that a test in one network
// namespace can steer a peer listening in another.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/lab/cmd/internal/labcmd"
	"github.com/fanpbx/fan/lab/ctlsock"
)

// version is set by the Makefile (-X main.version), as for fan's services.
var version = "dev"

func main() {
	labcmd.Main("fan-amipeer", version, func(ctx context.Context, args []string) error {
		return run(ctx, args, os.Stdout, os.Stderr, nil)
	})
}

// run is main without the process: ready, when not nil, receives the peer
// once it listens (tests use it to learn the address).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(*amipeer.Peer)) error {
	if len(args) > 0 && args[0] == "ctl" {
		return runCtl(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("fan-amipeer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:5038", "AMI TCP listen address")
	user := fs.String("user", "fan", "AMI username")
	secret := fs.String("secret", "", "AMI secret (required)")
	control := fs.String("control", "", "unix socket path for control commands (optional)")
	authDelay := fs.Duration("auth-delay", time.Second, "delay before answering a wrong login")
	slow := fs.Duration("slow", 500*time.Millisecond, "delay per response in slow mode")
	channels := fs.Int("channels", 0, "active channels reported")
	calls := fs.Int("calls", 0, "active calls reported")
	systemName := fs.String("systemname", "", "SystemName reported by CoreSettings")
	verbose := fs.Bool("v", false, "log every action (debug level)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *secret == "" {
		return errors.New("-secret is required")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if *authDelay == 0 {
		*authDelay = -1 // the flag's 0 means "none"; the Config's 0 means "default"
	}
	p, err := amipeer.Start(amipeer.Config{
		Addr: *listen, Username: *user, Secret: *secret, AuthFailDelay: *authDelay, SlowDelay: *slow,
		Figures: amipeer.Figures{Channels: *channels, Calls: *calls}, SystemName: *systemName, Logger: log,
	})
	if err != nil {
		return err
	}
	defer p.Close()
	if *control != "" {
		cs, err := amipeer.ListenControl(p, *control, log)
		if err != nil {
			return err
		}
		defer cs.Close()
	}
	if ready != nil {
		ready(p)
	}
	<-ctx.Done()
	log.Info("fan-amipeer stopping", "reason", context.Cause(ctx))
	return nil
}

func runCtl(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fan-amipeer ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	control := fs.String("control", "", "unix socket path of the running peer (required)")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: fan-amipeer ctl -control PATH <%s>\n", amipeer.ControlUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *control == "" || fs.NArg() == 0 {
		fs.Usage()
		return errors.New("ctl needs -control PATH and a command")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	reply, err := ctlsock.Call(ctx, *control, fs.Args()...)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, reply)
	return err
}
