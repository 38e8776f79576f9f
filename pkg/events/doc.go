// Package events is the single definition of everything fan says on the bus:
// the versioned envelope, every payload type, and every subject.
//
// Subject hierarchy (nobody outside this package builds a subject string):
//
//	fan.evt.<cluster>.probe.<node>.result        raw probe results (rate-limited)
//	fan.evt.<cluster>.probe.<node>.health        health transitions with evidence
//	fan.evt.<cluster>.node.<node>.heartbeat      node telemetry and current check states
//	fan.evt.<cluster>.arbiter.<group>.decision   every arbiter decision, including "no move"
//	fan.evt.<cluster>.exec.<node>.result         outcome of every command an executor saw
//	fan.evt.<cluster>.exec.<node>.calls          calls adopted apart from a claim's result
//	fan.evt.<cluster>.sched.<group>.permit       failback-permitted ticks
//	fan.evt.<cluster>.repl.<node>.status         replication passes and catch-up reports
//	fan.state.<cluster>.calls.<node>.summary     the calls a node's Asterisk has up, how many can be carried (live)
//	fan.evt.<cluster>.svc.<service>.<node>.announce   service start and stop
//	fan.cmd.<cluster>.<node>.<verb>              commands to one node's executor
//	fan.lease.<cluster>.<name>                   leadership leases (fencing, same stream as commands)
//	fan.live.<cluster>.<node>                    presence beacons (core NATS only, never stored)
//	fan.repl.<cluster>.<node>.astdb              a holder's AstDB changes as they happen (core NATS only)
//	fan.repl.<cluster>.<node>.resync             requests to a holder for an AstDB reconcile (core NATS request-reply)
//	fan.req.<cluster>.arbiter.operate.<operator> one operator's requests to the arbiter (core NATS request-reply)
//
// Identity comes from the subject. The bus's permissions let each identity
// publish only its own subjects (a node's services that node's, an operator
// that operator's), so consumers read events with DecodeFrom (or
// VerifySubject after Decode), which refuses, with ErrSubjectMismatch, an
// event whose envelope and payload do not derive the subject it arrived on,
// or whose source is not the node it speaks for. A node name that only the
// payload carries is never trusted. The arbiter takes the operator from
// the request subject (OperatorFromSubject), never from the request body.
//
// Events and commands live in different streams: events in an audit stream with
// limits retention, commands in a work-queue stream that each node's executor
// reads through its own durable consumer. The audit stream sources the command
// stream so every command is kept for explanation after it has been consumed.
//
// The payloads depend only on the standard library and carry no behaviour
// beyond validation: interfaces for publishing belong to the services that use them.
package events
