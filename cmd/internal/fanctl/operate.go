package fanctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
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
		return usagef("--now moves at once: it takes neither --within nor --force-after")
	case *d.now:
		req.Drain = events.DrainNow
	case *d.forceAfter:
		req.Drain = events.DrainForceAfter
	}
	if *d.within != 0 {
		if *d.within < events.MinDrainWithin || *d.within > events.MaxDrainWithin {
			return usagef("--within %v: want between %v and %v", *d.within, events.MinDrainWithin, events.MaxDrainWithin)
		}
		req.WithinMS = d.within.Milliseconds()
	}
	return nil
}

func runOperate(inv *invocation, cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var req events.OperatorRequest
	var o operatorFlags
	// The names the request carries, for the check against the cluster's
	// status before anything is sent.
	var nodeArg string
	switch cmd {
	case "switchover":
		to := fs.String("to", "", "the node to move the group to (it stays there: the group is pinned to it until --clear, its --for or --until, or a failover)")
		cancel := fs.Bool("cancel", false, "cancel the group's planned switchover that is waiting for the holder to drain")
		clear := fs.Bool("clear", false, "clear the group's pin: automatic failback may move it again")
		o = addOperatorFlags(fs, true)
		d := addDrainFlags(fs)
		p := addLifetimeFlags(fs, "pin the group to NODE for this long after the move", "pin the group to NODE until this time")
		pos, err := parseInterspersed(fs, args)
		if err != nil {
			return err
		}
		if err := wantArgs(pos); err != nil {
			return err
		}
		req = events.OperatorRequest{Verb: events.OpSwitchover, Node: *to, Cancel: *cancel}
		switch {
		case *cancel && *clear:
			return usagef("--cancel cancels the waiting move, --clear the pin: one at a time")
		case (*cancel || *clear) && (*to != "" || *d.now || *d.forceAfter || *d.within != 0 || p.given()):
			return usagef("--cancel and --clear take no --to, --now, --within, --force-after, --for or --until")
		case *clear:
			req = events.OperatorRequest{Verb: events.OpUnpin}
		case !*cancel && *to == "":
			return usagef("--to NODE is required (or --cancel, or --clear)")
		}
		if err := d.apply(&req); err != nil {
			return err
		}
		if err := p.apply(&req, time.Now(), events.MinPinFor, events.MaxPinFor); err != nil {
			return err
		}
		nodeArg = "--to"
	case "failback":
		now := fs.Bool("now", false, "fail back now, outside any window (required: manual failback is deliberate)")
		o = addOperatorFlags(fs, true)
		pos, err := parseInterspersed(fs, args)
		if err != nil {
			return err
		}
		if err := wantArgs(pos); err != nil {
			return err
		}
		if !*now {
			return usagef("--now is required (automatic failback happens inside windows; this one is manual)")
		}
		req = events.OperatorRequest{Verb: events.OpFailback}
	case "maintenance":
		o = addOperatorFlags(fs, true)
		pos, err := parseInterspersed(fs, args)
		if err != nil {
			return err
		}
		if err := wantArgs(pos, "on|off"); err != nil {
			return err
		}
		if pos[0] != "on" && pos[0] != "off" {
			return usagef("%q: want on or off", pos[0])
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
		if len(pos) > 0 && pos[0] != "standby" && pos[0] != "active" {
			return usagef("%q: want standby or active", pos[0])
		}
		if err := wantArgs(pos, "standby|active", "NODE"); err != nil {
			return err
		}
		req = events.OperatorRequest{Verb: events.OpNodeStandby, Node: pos[1]}
		if pos[0] == "active" {
			req.Verb = events.OpNodeActive
			if *d.now || *d.forceAfter || *d.within != 0 {
				return usagef("node active takes no --now, --within or --force-after")
			}
		}
		if err := d.apply(&req); err != nil {
			return err
		}
		nodeArg = "NODE"
	}
	req.Group, req.Reason, req.Comment = *o.group, *o.reason, *o.as
	return sendOperatorRequest(inv, req, o, nodeArg)
}

// sendOperatorRequest checks req (who asks, its names against the
// cluster's status), sends it to the arbiter leader and prints the answer.
func sendOperatorRequest(inv *invocation, req events.OperatorRequest, o operatorFlags, nodeArg string) error {
	cluster, operator, stdout := inv.cluster, inv.operator, inv.stdout
	if operator == "" {
		return usagef("no operator identity: set operator: in fanctl's --config (FANCTL_CONFIG) or --operator (FAN_OPERATOR) " +
			"to the operator whose credentials you use; the arbiter records the action as that operator")
	}
	if err := events.ValidToken("operator", operator); err != nil {
		return usagef("--operator: %v", err)
	}
	req.Operator = operator
	if err := req.Validate(); err != nil {
		return usagef("%v", err)
	}
	if cluster == "" {
		return usagef("--cluster (or FAN_CLUSTER) is required: actions go to one cluster's arbiter")
	}
	b, err := inv.connect(bus.StateBucket)
	if err != nil {
		return err
	}
	defer b.Close()
	if req.Group != "" || req.Node != "" {
		records, err := view.Records[events.GroupStatus](inv.bounded, b, events.AllGroupStatusKeys(cluster))
		if err != nil {
			return err
		}
		groups := make([]events.GroupStatus, len(records))
		for i, r := range records {
			groups[i] = r.Value
		}
		if err := checkNames(groups, cluster, req.Group, req.Node, nodeArg); err != nil {
			return err
		}
	}
	// The answer has a wait of its own (--wait), from when it is sent.
	inv.waitOnItsOwn()
	rep, err := request(inv.ctx, b.NC, cluster, req, *o.wait)
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

// checkNames refuses, before anything is sent, a group or node that the
// cluster's group status records (what its arbiter leader wrote) do not
// name: a typo is the operator's to fix, not the arbiter's to refuse after
// recording it. nodeArg is how the command line gave the node.
func checkNames(groups []events.GroupStatus, cluster, group, node, nodeArg string) error {
	if len(groups) == 0 {
		return fmt.Errorf("cluster %s has no group status in the state bucket, so the names given cannot be checked: "+
			"is an arbiter of cluster %s running? (fanctl --cluster %s status)", cluster, cluster, cluster)
	}
	var groupNames, nodes []string
	var in *events.GroupStatus
	seen := map[string]bool{}
	for i, g := range groups {
		groupNames = append(groupNames, g.Group)
		if g.Group == group {
			in = &groups[i]
		}
		if group == "" || g.Group == group {
			for n := range g.Nodes {
				if !seen[n] {
					seen[n] = true
					nodes = append(nodes, n)
				}
			}
		}
	}
	if group != "" && in == nil {
		return usagef("--group %q: cluster %s has no such group; %s", group, cluster, unknownName(group, groupNames))
	}
	if node != "" && !seen[node] {
		where := "cluster " + cluster
		if in != nil {
			where = "group " + group
		}
		return usagef("%s %q: %s has no such node; %s", nodeArg, node, where, unknownName(node, nodes))
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
