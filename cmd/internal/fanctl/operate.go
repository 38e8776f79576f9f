package fanctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
)

// operatorFlags are shared by every operator action.
type operatorFlags struct {
	group, reason, as *string
	wait              *time.Duration
	json              *bool
}

func addOperatorFlags(fs *flag.FlagSet, withGroup bool) operatorFlags {
	o := operatorFlags{
		reason: fs.String("reason", "", fmt.Sprintf("why (recorded in the audit trail; at most %d characters)", events.MaxReasonChars)),
		as: fs.String("as", "", fmt.Sprintf("a comment recorded with the action (on whose behalf, a ticket; at most %d characters); "+
			"who asked is always the operator of the credentials", events.MaxCommentChars)),
		wait: fs.Duration("wait", events.OperatorAnswerWithin, "how long to wait for the arbiter leader's answer"),
		json: fs.Bool("json", false, "print the arbiter's answer as JSON"),
	}
	g := ""
	o.group = &g
	if withGroup {
		o.group = fs.String("group", "", "the group (required when the cluster has several)")
	}
	return o
}

// drainFlags are a planned move's policy (switchover, node standby).
type drainFlags struct {
	within     *time.Duration
	forceAfter *bool
	now        *bool
}

func addDrainFlags(fs *flag.FlagSet) drainFlags {
	return drainFlags{
		within: fs.Duration("within", 0, fmt.Sprintf("wait at most this long for the holder's calls to end (%v..%v; default: the group's planned.drain_within, 30m unless configured)",
			events.MinDrainWithin, events.MaxDrainWithin)),
		forceAfter: fs.Bool("force-after", false, "move anyway when --within has passed (default: give up and say so)"),
		now:        fs.Bool("now", false, "move at once, cutting the calls on the holder (the reply says how many)"),
	}
}

// apply puts the policy into req; a bad combination is refused here,
// before anything is sent.
func (d drainFlags) apply(req *events.OperatorRequest) error {
	switch {
	case *d.now && (*d.forceAfter || *d.within != 0):
		return errors.New("--now moves at once: it takes neither --within nor --force-after")
	case *d.now:
		req.Drain = events.DrainNow
	case *d.forceAfter:
		req.Drain = events.DrainForceAfter
	}
	if *d.within != 0 {
		if *d.within < events.MinDrainWithin || *d.within > events.MaxDrainWithin {
			return fmt.Errorf("--within %v: want between %v and %v", *d.within, events.MinDrainWithin, events.MaxDrainWithin)
		}
		req.WithinMS = d.within.Milliseconds()
	}
	return nil
}

// parseInterspersed parses flags that may come before or after positional
// arguments (fanctl node standby n1 --reason x).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func runOperate(ctx context.Context, cmd string, args []string, cluster, operator string, connect connector, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var req events.OperatorRequest
	var o operatorFlags
	switch cmd {
	case "switchover":
		to := fs.String("to", "", "the node to move the group to")
		cancel := fs.Bool("cancel", false, "cancel the group's planned switchover that is waiting for the holder to drain")
		o = addOperatorFlags(fs, true)
		d := addDrainFlags(fs)
		if _, err := parseInterspersed(fs, args); err != nil {
			return err
		}
		req = events.OperatorRequest{Verb: events.OpSwitchover, Node: *to, Cancel: *cancel}
		if *cancel && (*to != "" || *d.now || *d.forceAfter || *d.within != 0) {
			return errors.New("switchover --cancel [--group G]: cancels the waiting move; it takes no --to, --now, --within or --force-after")
		}
		if err := d.apply(&req); err != nil {
			return err
		}
	case "failback":
		now := fs.Bool("now", false, "fail back now, outside any window (required: manual failback is deliberate)")
		o = addOperatorFlags(fs, true)
		if _, err := parseInterspersed(fs, args); err != nil {
			return err
		}
		if !*now {
			return errors.New("failback: --now is required (automatic failback happens inside windows; this one is manual)")
		}
		req = events.OperatorRequest{Verb: events.OpFailback}
	case "maintenance":
		o = addOperatorFlags(fs, true)
		pos, err := parseInterspersed(fs, args)
		if err != nil {
			return err
		}
		if len(pos) != 1 || (pos[0] != "on" && pos[0] != "off") {
			return errors.New("usage: fanctl maintenance on|off [--group G] [--reason TEXT] (no --group: the whole cluster)")
		}
		req = events.OperatorRequest{Verb: events.OpMaintenanceOn}
		if pos[0] == "off" {
			req.Verb = events.OpMaintenanceOff
		}
	case "node":
		o = addOperatorFlags(fs, false)
		d := addDrainFlags(fs)
		pos, err := parseInterspersed(fs, args)
		if err != nil {
			return err
		}
		if len(pos) != 2 || (pos[0] != "standby" && pos[0] != "active") {
			return errors.New("usage: fanctl node standby NODE [--within D] [--force-after | --now] [--reason TEXT], or fanctl node active NODE (which also cancels a standby's waiting moves)")
		}
		req = events.OperatorRequest{Verb: events.OpNodeStandby, Node: pos[1]}
		if pos[0] == "active" {
			req.Verb = events.OpNodeActive
			if *d.now || *d.forceAfter || *d.within != 0 {
				return errors.New("node active takes no --now, --within or --force-after")
			}
		}
		if err := d.apply(&req); err != nil {
			return err
		}
	}
	if operator == "" {
		return fmt.Errorf("%s: no operator identity: set operator: in fanctl's --config (FANCTL_CONFIG) or --operator (FAN_OPERATOR) "+
			"to the operator whose credentials you use; the arbiter records the action as that operator", cmd)
	}
	if err := events.ValidToken("operator", operator); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	req.Group, req.Reason, req.Operator, req.Comment = *o.group, *o.reason, operator, *o.as
	if err := req.Validate(); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if cluster == "" {
		return fmt.Errorf("%s: --cluster (or FAN_CLUSTER) is required: actions go to one cluster's arbiter", cmd)
	}
	b, err := connect()
	if err != nil {
		return err
	}
	defer b.Close()
	rep, err := request(ctx, b.NC, cluster, req, *o.wait)
	if err != nil {
		return err
	}
	if *o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
		if !rep.Accepted {
			return errRefused
		}
		return nil
	}
	word := "accepted"
	if !rep.Accepted {
		word = "REFUSED"
	}
	fmt.Fprintf(stdout, "%s: %s\n", word, rep.Message)
	if rep.EventID != "" {
		fmt.Fprintf(stdout, "recorded as %s by %s (leader %s, epoch %d)\n", rep.EventID, req.Operator, rep.Leader, rep.Epoch)
	}
	for _, d := range rep.Decisions {
		fmt.Fprintf(stdout, "decision %s (fanctl explain %s)\n", d, d)
	}
	if !rep.Accepted {
		return errRefused
	}
	return nil
}

var errRefused = errors.New("the arbiter refused the action")

// request sends an operator request to the cluster's arbiter leader.
func request(ctx context.Context, nc *nats.Conn, cluster string, req events.OperatorRequest, wait time.Duration) (events.OperatorReply, error) {
	var rep events.OperatorReply
	data, err := json.Marshal(req)
	if err != nil {
		return rep, err
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	m, err := nc.RequestWithContext(rctx, events.OperatorRequestSubject(cluster, req.Operator), data)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return rep, fmt.Errorf("no arbiter of cluster %s is running", cluster)
	case errors.Is(err, context.DeadlineExceeded):
		// A leader that answers late may still have acted: say where to look.
		return rep, fmt.Errorf("no arbiter leader of cluster %s answered within %v (is one leading?); "+
			"if one was, it may have acted all the same: fanctl events --since 5m shows what it recorded", cluster, wait)
	case err != nil:
		return rep, fmt.Errorf("operator request: %w", err)
	}
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return rep, fmt.Errorf("operator reply: %w", err)
	}
	return rep, nil
}
