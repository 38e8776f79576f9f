package app

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
)

// operatorRecordTimeout bounds the wait for the request's record to be
// stored; the operator's client waits a few seconds for the answer.
const operatorRecordTimeout = 2 * time.Second

// operate answers an operator request if this replica leads. Who asked is
// the operator whose subject the request arrived on (the bus lets each
// operator's credentials publish only their own), never a name the request
// gives itself. The request is recorded (an OperatorAction, stage
// requested) before anything is done, and refused if that record cannot be
// stored: nothing an operator asks is ever applied without a trace. The
// outcome, accepted or refused, is recorded again, citing the request, and
// the decisions it causes cite that.
func (a *arbiter) operate(ctx context.Context, m *nats.Msg) {
	if !a.commanding() {
		return // the leader answers; a follower's "not me" would race it
	}
	ans := answer{a: a, m: m}
	req, ok := a.readRequest(ans)
	if !ok {
		return
	}
	renv, err := a.recordRequest(ctx, req)
	if err != nil {
		ans.refuse(req.Operator, fmt.Errorf("the request could not be recorded in the audit trail, so nothing was done: %w", err))
		return
	}
	if req.Verb.ForLeaders() {
		// The leaders hold is the steward's, not the decision core's.
		ans.reply(a.operateLeaders(ctx, req, renv))
		return
	}
	ans.reply(a.operateCore(ctx, req, renv))
}

// answer replies to one operator request.
type answer struct {
	a *arbiter
	m *nats.Msg
}

func (w answer) reply(r events.OperatorReply) {
	r.Leader, r.Epoch = w.a.holder, w.a.lease.Epoch()
	b, _ := json.Marshal(r)
	if err := w.m.Respond(b); err != nil {
		w.a.log.Warn("operator reply failed", "err", err)
	}
}

func (w answer) refuse(op string, err error) {
	w.a.log.Warn("operator request refused", "operator", op, "subject", w.m.Subject, "err", err)
	w.reply(events.OperatorReply{Message: "refused: " + err.Error()})
}

// readRequest decodes and checks the request, its operator taken from the
// subject; it refuses what it cannot take (ok false).
func (a *arbiter) readRequest(ans answer) (req events.OperatorRequest, ok bool) {
	m := ans.m
	op, err := events.OperatorFromSubject(a.cfg.Cluster, m.Subject)
	if err != nil {
		a.bus.Refuse(events.RefusedSubject, m.Subject, err, "type", "operator_request")
		ans.reply(events.OperatorReply{Message: "refused: " + err.Error()})
		return req, false
	}
	if len(m.Data) > events.MaxRequestBytes {
		ans.refuse(op, fmt.Errorf("request is %d bytes, at most %d (a reason is at most %d characters)", len(m.Data), events.MaxRequestBytes, events.MaxReasonChars))
		return req, false
	}
	if err := json.Unmarshal(m.Data, &req); err != nil {
		ans.refuse(op, fmt.Errorf("malformed request: %w", err))
		return req, false
	}
	if req.Operator != op {
		// Not an error: the name a request gives itself is only what the
		// client believed; the subject is who it is.
		a.log.Info("operator request names someone else; recorded as its subject's operator", "operator", op, "claimed_operator", req.Operator)
	}
	req.Operator = op
	if req.Cancel && req.Node == "" {
		// The record names the move being cancelled, so that a reader
		// that requires a switchover's node still takes it.
		req.Node = a.core.PlannedTarget(req.Group)
	}
	if err := req.Validate(); err != nil {
		ans.refuse(op, err)
		return req, false
	}
	return req, true
}

// recordRequest stores the request in the audit trail (stage requested),
// waiting for the store: what cannot be recorded is not done.
func (a *arbiter) recordRequest(ctx context.Context, req events.OperatorRequest) (events.Envelope, error) {
	requested := events.OperatorAction{Verb: req.Verb, Group: req.Group, Node: req.Node, Reason: req.Reason, Operator: req.Operator,
		Comment: req.Comment, Outcome: "requested; not yet decided", Stage: events.StageRequested,
		Drain: req.Drain, WithinMS: req.WithinMS, Cancel: req.Cancel, ForMS: req.ForMS, Until: req.Until, Server: req.Server}
	rctx, cancel := context.WithTimeout(ctx, operatorRecordTimeout)
	defer cancel()
	return a.bus.Emit(rctx, requested, events.WithEpoch(a.lease.Epoch()))
}

// operateCore has the decision core act on a recorded request and
// publishes what it decided.
func (a *arbiter) operateCore(ctx context.Context, req events.OperatorRequest, renv events.Envelope) events.OperatorReply {
	id := uuid.Must(uuid.NewV7()).String()
	rep, out := a.core.Operate(time.Now(), decide.Request{ID: id, RequestedID: renv.ID, OperatorRequest: req})
	if len(out.Emits) == 0 {
		return events.OperatorReply{Message: rep.Message, EventID: renv.ID}
	}
	published := a.execute(ctx, out)
	r := events.OperatorReply{Accepted: rep.Accepted, Message: rep.Message, EventID: id, Decisions: rep.Decisions}
	if !published {
		r.Message += " (warning: not everything could be published; see the arbiter's log)"
	}
	a.log.Info("operator action", "verb", req.Verb, "group", req.Group, "node", req.Node, "operator", req.Operator,
		"comment", req.Comment, "accepted", rep.Accepted, "outcome", rep.Message, "event_id", id, "requested_id", renv.ID)
	return r
}
