package fanctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/fanpbx/fan/cmd/internal/doctor"
)

// runDoctor checks this host's installation (fanctl doctor): it reads the
// fan files of --etc, checks the host, Asterisk, the bus, the names, the
// bus.url order and the ports, prints every finding with its fix, and fails
// on any error (warnings do not).
func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o doctor.Options
	fs.StringVar(&o.Etc, "etc", "/etc/fan", "the directory holding this host's fan files (prober.yaml, ipmover.yaml, ..., nats.yaml)")
	asJSON := fs.Bool("json", false, "print the findings as one JSON object")
	fs.DurationVar(&o.Within, "within", 12*time.Second, "bound on the whole run")
	fs.DurationVar(&o.Step, "step", 2*time.Second, "bound on each network step (a dial, a login, a request)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rep := doctor.Run(ctx, o)
	write := rep.WriteText
	if *asJSON {
		write = rep.WriteJSON
	}
	if err := write(stdout); err != nil {
		return err
	}
	if n := rep.Count(doctor.Error); n > 0 {
		return fmt.Errorf("doctor: %d errors on this host (above)", n)
	}
	return nil
}

// The help and completion of doctor (help.go).
func init() {
	registerCommand(commandSpec{Name: "doctor", Section: sectionInstall, Synopsis: "[--etc /etc/fan] [--json] [--within 12s] [--step 2s]",
		Summary: "check what breaks an installation on this host (the host, Asterisk over AMI, the bus with each local " +
			"service's identity, the names, each bus.url's order, the ports); changes nothing; exit 1 on any error",
		Examples: []string{"fanctl doctor", "fanctl doctor --json | jq '.findings[] | select(.severity == \"error\")'",
			"ip netns exec lab-n1 fanctl doctor --etc /tmp/lab/n1"},
		Values: map[string]valueKind{"etc": kindDir}})
}
