package fanctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/fanpbx/fan/cmd/internal/natsconfig"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/nats-io/nats.go/jetstream"
)

// runNATSConfig writes the bus's CA, certificates, keys, server
// configurations and per-host bundles for a cluster file.
func runNATSConfig(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("nats-config", flag.ContinueOnError)
	file := fs.String("cluster-file", "cluster.yaml", "the cluster file")
	out := fs.String("out", "fan-bus", "output directory (kept: its CA and keys are reused on every run)")
	renew := fs.Bool("renew", false, "reissue every certificate from the same CA (keys are kept)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c, err := natsconfig.LoadCluster(*file)
	if err != nil {
		return err
	}
	res, err := natsconfig.Generate(c, natsconfig.Options{Out: *out, Renew: *renew})
	for _, f := range res.Created {
		fmt.Fprintln(stdout, "created", f)
	}
	for _, f := range res.Renewed {
		fmt.Fprintln(stdout, "renewed", f)
	}
	for _, f := range res.Written {
		fmt.Fprintln(stdout, "wrote  ", f)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "bundles in %s: copy each to its host (deploy/systemd/README.md)\n", natsconfig.Bundle(*out, ""))
	return nil
}

// runProvision creates every stream, bucket and object store fan needs. It
// is the admin identity's job: services have no create rights.
func runProvision(inv *invocation, args []string) error {
	cfg, stdout := inv.cfg, inv.stdout
	fs := flag.NewFlagSet("provision", flag.ContinueOnError)
	fs.IntVar(&cfg.Replicas, "replicas", 3, "replicas of every stream and bucket (1..5; 1 for a single server)")
	maxAge := fs.Duration("events-max-age", 90*24*time.Hour, "how long the audit stream keeps events")
	// The limits default to the configuration file's bus.limits (or fan's defaults).
	cfg.Defaults()
	fs.Int64Var(&cfg.Limits.EventsMiB, "events-mib", cfg.Limits.EventsMiB, "the audit stream's byte limit in MiB (64..1048576); the oldest records go first")
	fs.Int64Var(&cfg.Limits.LiveMiB, "live-mib", cfg.Limits.LiveMiB, "the live stream's byte limit in MiB (16..65536)")
	liveAge := fs.Duration("live-max-age", cfg.Limits.LiveMaxAge.D(), "how long the live stream keeps heartbeats and probe results (10m..168h)")
	fs.Int64Var(&cfg.Limits.CommandsMiB, "commands-mib", cfg.Limits.CommandsMiB, "the command stream's byte limit in MiB (16..65536)")
	fs.Int64Var(&cfg.Limits.StateMiB, "state-mib", cfg.Limits.StateMiB, "the state bucket's byte limit in MiB (16..16384)")
	fs.Int64Var(&cfg.Limits.CallsMiB, "calls-mib", cfg.Limits.CallsMiB, "the byte limit in MiB of the bucket of calls in progress (16..16384)")
	wait := fs.Duration("wait", time.Minute, "how long to keep trying while JetStream elects its leaders")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg.EventsMaxAge = config.Duration(*maxAge)
	cfg.Limits.LiveMaxAge = config.Duration(*liveAge)
	b, err := inv.connect()
	if err != nil {
		return err
	}
	defer b.Close()
	// JetStream's leaders of a new cluster take longer than a read: the
	// creation has --wait of its own, not --timeout.
	inv.waitOnItsOwn()
	pctx, cancel := context.WithTimeout(inv.ctx, *wait)
	defer cancel()
	if err := b.Provision(pctx); err != nil {
		return fmt.Errorf("provision streams and bucket: %w", err)
	}
	if err := b.ProvisionObjectStores(pctx); err != nil {
		return fmt.Errorf("provision object stores: %w", err)
	}
	fmt.Fprintf(stdout, "provisioned %s, %s, %s, buckets %s and %s and the replicator's object stores (%d replicas); the audit stream denies delete and purge\n",
		bus.EventsStream, bus.LiveStream, bus.CommandsStream, bus.StateBucket, bus.CallsBucket, cfg.Replicas)
	fmt.Fprintf(stdout, "each NATS server with a replica needs %d MiB for them (audit %d, live %d, commands %d, state %d, calls %d) plus the replicated trees\n",
		cfg.Limits.TotalMiB(), cfg.Limits.EventsMiB, cfg.Limits.LiveMiB, cfg.Limits.CommandsMiB, cfg.Limits.StateMiB, cfg.Limits.CallsMiB)
	return nil
}

// requireProvisioned checks that the streams and the bucket a command reads
// exist (bus.EventsStream, bus.LiveStream, bus.StateBucket). Reading one
// that does not would wait for it (a watch keeps making its consumer), so
// a bus nobody provisioned fails here, saying what to do.
func requireProvisioned(ctx context.Context, b *bus.Bus, needs ...string) error {
	for _, name := range needs {
		what := "stream " + name
		var err error
		if name == bus.StateBucket {
			what = "bucket " + name
			_, err = b.JS.KeyValue(ctx, name)
		} else {
			_, err = b.JS.Stream(ctx, name)
		}
		switch {
		case err == nil:
		case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
			return fmt.Errorf("%s does not exist: the bus is not provisioned; run `fanctl provision` with the admin's bundle "+
				"(fanctl --config fan-bus/hosts/admin/fanctl.yaml provision --replicas 3; deploy/systemd/README.md)", what)
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
			return fmt.Errorf("%s: JetStream is not enabled for this account on the server; fan needs it (fan-nats, or "+
				"nats-server with the configuration fanctl nats-config writes), then `fanctl provision` with the admin's bundle", what)
		default:
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}
