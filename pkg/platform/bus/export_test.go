package bus

import "time"

// SetHomeEvery changes how often a connection looks for its preferred
// server, for a test; it returns the previous value.
func SetHomeEvery(d time.Duration) time.Duration {
	prev := homeEvery
	homeEvery = d
	return prev
}
