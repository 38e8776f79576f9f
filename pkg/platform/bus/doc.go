// Package bus connects a fan service to NATS JetStream as a client (the
// servers are fan-nats's, or the stock nats-server's: package natsserver
// runs them, and no service links it), provisions the streams and buckets
// fan needs without ever fighting another instance, and publishes and
// consumes fan's events and commands.
//
// Its files, one job each: config.go (the bus section of a service's
// configuration; limits.go its disk limits, system.go the system account),
// connect.go (the connection and its liveness; serverorder.go and home.go
// the order of preference among servers and the way back to the first),
// secure.go (refusing a remote bus without TLS or identity), provision.go
// (creating the streams, buckets and object stores, or waiting for the admin
// to), lookup.go (what a service opens at run time: the state and calls
// buckets, its executor's consumer), publish.go (Emit, Publish), outbox.go
// (what must not be lost while a stream has no leader), watch.go and
// watcher.go (Watch, WatchKV, WatchObjects and the hedged consumers behind
// them), readall.go (a trail read to its end), commands.go
// (ConsumeCommands), leaserecords.go and leaderget.go (the arbiter lease's
// records, read from a replica and the leader), refuse.go and refuselog.go
// (what a reader drops, counted and logged sparingly), peers.go and usage.go
// (raft peers and disk use, for metrics).
package bus
