package bus

import "time"

// SetHomeEvery changes how often a connection looks for its preferred
// server, for a test; it returns the previous value.
func SetHomeEvery(d time.Duration) time.Duration {
	prev := homeEvery
	homeEvery = d
	return prev
}

// HomeLooks is how many looks at a preferred server b has made.
func HomeLooks(b *Bus) int64 { return b.homeLooks.Load() }

// Replica is what a lease read asks directly; SetReplica puts a test's in
// the place of the command stream (one that is silent or behind).
type Replica = replica

func SetReplica(l *LeaseRecords, r Replica) { l.replica = r }

// ExecutorAckWait is how long a delivered command may go unacknowledged.
const ExecutorAckWait = executorAckWait
