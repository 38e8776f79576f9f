// Command fan-pbxstandin is the compose lab's STAND-IN for an Asterisk node
// (package pbxstandin): the AMI peer plus a SIP responder that answers
// OPTIONS and REGISTER, and with -registrar a registrar and a
// back-to-back user agent that connects calls between registered phones
// as Asterisk 22 does. It is not a PBX. Flags default to environment
// variables so a container needs no command line, which lets the lab swap
// in a real Asterisk image without touching anything else.
//
//	fan-pbxstandin                                  serve (FAN_PBX_* variables)
//	fan-pbxstandin ctl frozen|dead|normal|status    switch the running stand-in
//	fan-pbxstandin sip [-watch] 203.0.113.10:5060   ask who answers (a client)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/lab/cmd/internal/labcmd"
	"github.com/fanpbx/fan/lab/ctlsock"
	"github.com/fanpbx/fan/lab/pbxstandin"
)

const defaultControl = "/run/fan-pbx/control.sock"

// version is set by the Makefile (-X main.version), as for fan's services.
var version = "dev"

func main() {
	labcmd.Main("fan-pbxstandin", version, func(ctx context.Context, args []string) error {
		return run(ctx, args, os.Stdout, os.Stderr)
	})
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "ctl":
			return runCtl(ctx, args[1:], stdout, stderr)
		case "sip":
			return runSIP(ctx, args[1:], stdout, stderr)
		case "serve":
			args = args[1:]
		}
	}
	return serve(ctx, args, stderr)
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("fan-pbxstandin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	node := fs.String("node", env("FAN_PBX_NODE", ""), "node name in every SIP answer (FAN_PBX_NODE)")
	sip := fs.String("sip", env("FAN_PBX_SIP", "0.0.0.0:5060"), "comma-separated UDP addresses to answer SIP on; a floating one needs ip_nonlocal_bind (FAN_PBX_SIP)")
	amiListen := fs.String("ami-listen", env("FAN_PBX_AMI_LISTEN", "127.0.0.1:5038"), "AMI TCP address (FAN_PBX_AMI_LISTEN)")
	amiUser := fs.String("ami-user", env("FAN_PBX_AMI_USER", "fan"), "AMI username (FAN_PBX_AMI_USER)")
	amiSecret := fs.String("ami-secret", env("FAN_PBX_AMI_SECRET", ""), "AMI secret (FAN_PBX_AMI_SECRET, required)")
	control := fs.String("control", env("FAN_PBX_CONTROL", defaultControl), "control socket (FAN_PBX_CONTROL)")
	registrar := fs.Bool("registrar", env("FAN_PBX_REGISTRAR", "") != "", "answer REGISTER as Asterisk 22's registrar does, in the AMI peer's AstDB, connect calls between registered phones as Asterisk's Dial does, and let Originate reach the contacts (FAN_PBX_REGISTRAR); the record of AMI actions is then kept 10 s")
	statusOnUpdate := fs.Bool("contact-status-on-update", true, "with -registrar: pjsip.conf's send_contact_status_on_update_registration (fan requires yes)")
	systemName := fs.String("system-name", env("FAN_PBX_SYSTEM_NAME", ""), "asterisk.conf's systemname, in contacts and events; default the node name (FAN_PBX_SYSTEM_NAME)")
	directMedia := fs.Bool("direct-media", env("FAN_PBX_DIRECT_MEDIA", "yes") != "no", "with -registrar: direct_media of the endpoints pjsip.conf does not list (FAN_PBX_DIRECT_MEDIA=no for anchored calls)")
	etcDir := fs.String("etc", env("FAN_PBX_ETC", ""), "an Asterisk configuration directory (FAN_PBX_ETC): the AMI listener and users from manager.conf, the systemname from asterisk.conf, the UDP transports to answer SIP on and the endpoints from pjsip.conf, in place of the flags that say the same")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var etc *pbxstandin.Etc
	if *etcDir != "" {
		e, err := pbxstandin.LoadEtc(*etcDir)
		if err != nil {
			return err
		}
		if e.AMIAddr == "" {
			return fmt.Errorf("%s/manager.conf: AMI is not enabled ([general] enabled = yes)", *etcDir)
		}
		etc = &e
	} else if *amiSecret == "" {
		return errors.New("-ami-secret is required (or FAN_PBX_AMI_SECRET, or -etc)")
	}
	if *node == "" {
		return errors.New("-node is required (or FAN_PBX_NODE)")
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("service", "fan-pbxstandin", "node", *node)
	cfg := pbxstandin.Config{
		Node: *node, SIP: strings.Split(*sip, ","), Logger: log, NoDirectMedia: !*directMedia,
		AMI: amipeer.Config{Addr: *amiListen, Username: *amiUser, Secret: *amiSecret, SystemName: *systemName},
	}
	if *registrar {
		cfg.Registrar = &amipeer.RegistrarConfig{SendContactStatusOnUpdate: *statusOnUpdate, RemoveExisting: true}
	}
	if etc != nil {
		cfg.SIP = etc.SIP
		cfg.AMI.Addr, cfg.AMI.Username, cfg.AMI.Secret = etc.AMIAddr, "", ""
		cfg.AMI.Users, cfg.AMI.Transports, cfg.AMI.Endpoints = etc.Users, etc.Transports, etc.Endpoints
		cfg.AMI.SystemName = etc.SystemName
		if cfg.Registrar != nil {
			cfg.Registrar.SendContactStatusOnUpdate = etc.SendContactStatusOnUpdate
		}
	}
	p, err := pbxstandin.Start(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	if *registrar {
		// Thousands of phones re-registering: the action record would
		// grow without end.
		go func() {
			t := time.NewTicker(10 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					p.AMI().ForgetActions()
				}
			}
		}()
	}
	stopCtl, err := pbxstandin.ListenControl(ctx, p, *control)
	if err != nil {
		return err
	}
	defer stopCtl()
	log.Info("lab stand-in PBX answering (not Asterisk)", "sip", p.SIPAddrs(), "ami", p.AMIAddr(), "control", *control)
	<-ctx.Done()
	log.Info("stopping")
	return nil
}

func runCtl(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fan-pbxstandin ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	control := fs.String("control", env("FAN_PBX_CONTROL", defaultControl), "control socket of the running stand-in")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: fan-pbxstandin ctl [-control PATH] <%s>", pbxstandin.ControlUsage)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reply, err := ctlsock.Call(cctx, *control, fs.Arg(0))
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, reply)
	return err
}

// runSIP asks a SIP address who answers. With -watch it asks every
// -interval and prints one line per change (who answers, or silence), with
// the time since the last change, which is what an operator watches during
// a failover.
func runSIP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fan-pbxstandin sip", flag.ContinueOnError)
	fs.SetOutput(stderr)
	method := fs.String("method", "OPTIONS", "OPTIONS or REGISTER")
	timeout := fs.Duration("timeout", time.Second, "wait this long for each answer")
	watch := fs.Bool("watch", false, "keep asking and print each change")
	interval := fs.Duration("interval", 200*time.Millisecond, "with -watch: time between requests")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: fan-pbxstandin sip [-watch] [-method OPTIONS|REGISTER] HOST:PORT")
	}
	target := fs.Arg(0)
	ask := func() string {
		actx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		a, err := pbxstandin.Ping(actx, *method, target)
		if err != nil {
			return "no answer"
		}
		return fmt.Sprintf("answered %s by node %s", a.Status, a.Node)
	}
	if !*watch {
		r := ask()
		fmt.Fprintf(stdout, "%s %s\n", target, r)
		if r == "no answer" {
			return fmt.Errorf("%s: %w", target, pbxstandin.ErrNoAnswer)
		}
		return nil
	}
	last, since := "", time.Now()
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		if r := ask(); r != last {
			fmt.Fprintf(stdout, "%s %s %s (after %s)\n", time.Now().UTC().Format("15:04:05.000"), target, r, time.Since(since).Round(time.Millisecond))
			last, since = r, time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
