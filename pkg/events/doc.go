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
//	fan.evt.<cluster>.sched.<group>.permit       failback-permitted ticks
//	fan.evt.<cluster>.repl.<node>.status         replication passes and catch-up reports
//	fan.evt.<cluster>.svc.<service>.<node>.announce   service start and stop
//	fan.cmd.<cluster>.<node>.<verb>              commands to one node's executor
//	fan.lease.<cluster>.<name>                   leadership leases (fencing, same stream as commands)
//	fan.live.<cluster>.<node>                    presence beacons (core NATS only, never stored)
//
// Events and commands live in different streams: events in an audit stream with
// limits retention, commands in a work-queue stream that each node's executor
// reads through its own durable consumer. The audit stream sources the command
// stream so every command is kept for explanation after it has been consumed.
//
// The payloads depend only on the standard library and carry no behaviour
// beyond validation: interfaces for publishing belong to the services that use them.
package events
