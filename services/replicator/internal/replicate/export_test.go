package replicate

// AfterHashing runs f as each file's hash is known in a source's scan,
// before the file's content is uploaded (nil: nothing): a slow scan, or a
// file written to between its hashing and its upload.
func AfterHashing(f func()) { afterHashing = f }
