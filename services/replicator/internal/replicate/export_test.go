package replicate

import "time"

// AfterHashing runs f with each file's path (relative to its tree) as its
// hash is known in a source's scan, before its content is uploaded (nil:
// nothing): a slow scan, or a file written to between its hashing and its
// upload.
func AfterHashing(f func(path string)) { afterHashing = f }

// SetFullEvery makes a source publish its full manifest every n deltas
// and returns the previous setting.
func SetFullEvery(n int) int {
	old := fullEvery
	fullEvery = n
	return old
}

// SetStaleManifest sets how old a standby's first manifest of a tenure
// must be for it to ask the holder for a fresh one, and returns the
// previous setting.
func SetStaleManifest(d time.Duration) time.Duration {
	old := staleManifest
	staleManifest = d
	return old
}
