package fanctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
)

// operatorFlags are shared by every operator action.
type operatorFlags struct {
	group, reason, as *string
	wait              *time.Duration
}

func addOperatorFlags(fs *flag.FlagSet, withGroup bool) operatorFlags {
	o := operatorFlags{
		reason: fs.String("reason", "", fmt.Sprintf("why (recorded in the audit trail; at most %d characters)", events.MaxReasonChars)),
		as: fs.String("as", "", fmt.Sprintf("a comment recorded with the action (on whose behalf, a ticket; at most %d characters); "+
			"who asked is always the operator of the credentials", events.MaxCommentChars)),
		wait: fs.Duration("wait", 5*time.Second, "how long to wait for the arbiter leader's answer"),
	}
	g := ""
	o.group = &g
	if withGroup {
		o.group = fs.String("group", "", "the group (required when the cluster has several)")
	}
	return o
}

// parseInterspersed parses flags that may come before or after positional
// arguments (fanctl node standby n1 --reason x).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
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
		o = addOperatorFlags(fs, true)
		if _, err := parseInterspersed(fs, args); err != nil {
			return err
		}
		req = events.OperatorRequest{Verb: events.OpSwitchover, Node: *to}
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
		pos, err := parseInterspersed(fs, args)
		if err != nil {
			return err
		}
		if len(pos) != 2 || (pos[0] != "standby" && pos[0] != "active") {
			return errors.New("usage: fanctl node standby|active NODE [--reason TEXT]")
		}
		req = events.OperatorRequest{Verb: events.OpNodeStandby, Node: pos[1]}
		if pos[0] == "active" {
			req.Verb = events.OpNodeActive
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
		return rep, fmt.Errorf("no arbiter leader of cluster %s answered within %v (is one leading?)", cluster, wait)
	case err != nil:
		return rep, fmt.Errorf("operator request: %w", err)
	}
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return rep, fmt.Errorf("operator reply: %w", err)
	}
	return rep, nil
}

// describeAction renders an operator action for events and explain.
func describeAction(a *events.OperatorAction) string {
	target := strings.TrimSpace(strings.Join([]string{a.Group, a.Node}, " "))
	s := fmt.Sprintf("%s %s by %s", a.Verb, target, a.Operator)
	if a.Reason != "" {
		s += fmt.Sprintf(" (%q)", a.Reason)
	}
	if a.Comment != "" {
		s += fmt.Sprintf(" [comment %q]", a.Comment)
	}
	if a.Stage == events.StageRequested {
		return s + ": requested"
	}
	if a.Accepted {
		return s + ": " + a.Outcome
	}
	return s + ": REFUSED: " + a.Outcome
}
