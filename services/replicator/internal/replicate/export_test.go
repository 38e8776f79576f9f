package replicate

// SlowHashing makes every file's hashing wait in f (nil: no wait).
func SlowHashing(f func()) { slowHashing = f }
