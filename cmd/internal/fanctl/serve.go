package fanctl

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/fanpbx/fan/cmd/internal/statuspage"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// runServe runs the status page until ctx ends. The page reads the bus
// with the identity fanctl was given (in a secure cluster a viewer's,
// events.RoleViewer, which may only read) and never writes to it. Unlike
// the other commands it keeps dialling a bus that is not up yet, as a
// service does.
func runServe(inv *invocation, args []string) error {
	ctx, cluster, file, bcfg, version, stdout, stderr := inv.ctx, inv.cluster, inv.file.Serve, *inv.cfg, inv.version, inv.stdout, inv.stderr
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "", "the page's address, host:port (serve.listen; default "+statuspage.DefaultListen+")")
	prefix := fs.String("path-prefix", "", "the path the page is served under, / or /a/b/ (serve.path_prefix; default /)")
	tokenFile := fs.String("token-file", "", "the file holding the bearer token that logs in (serve.token_file; required)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := file
	for _, o := range []struct{ v, dst *string }{{listen, &cfg.Listen}, {prefix, &cfg.PathPrefix}, {tokenFile, &cfg.TokenFile}} {
		if *o.v != "" {
			*o.dst = *o.v
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	srv, err := statuspage.New(cfg, cluster, log)
	if err != nil {
		return err
	}
	ln, err := srv.Listen()
	if err != nil {
		return err
	}
	defer ln.Close()
	host, _ := os.Hostname()
	b, err := bus.Connect(ctx, bcfg, bus.Identity{Cluster: cluster, Service: "fanctl-serve", Node: sanitizeToken(host), Version: version}, log)
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Fprintf(stdout, "status page on http://%s%s\n", ln.Addr(), cfgPrefix(cfg))
	// Under systemd (Type=notify in fan-status.service) READY=1 says the
	// page answers: its port is bound and the bus reached.
	notify, err := daemon.NotifierFromEnv()
	if err != nil {
		log.Warn("sd_notify disabled", "err", err)
	}
	if err := notify.Send(daemon.NotifyReady, fmt.Sprintf("STATUS=serving on %s", ln.Addr())); err != nil {
		log.Warn("sd_notify failed", "err", err)
	}
	defer func() { _ = notify.Send(daemon.NotifyStopping) }()
	return srv.Serve(ctx, ln, b)
}

func cfgPrefix(c statuspage.Config) string {
	if c.PathPrefix == "" {
		return "/"
	}
	return c.PathPrefix
}
