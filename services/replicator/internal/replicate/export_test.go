package replicate

// AfterHashing runs f with each file's path (relative to its tree) as its
// hash is known in a source's scan, before its content is uploaded (nil:
// nothing): a slow scan, or a file written to between its hashing and its
// upload.
func AfterHashing(f func(path string)) { afterHashing = f }
