package fanctl

// ParseUntil exposes the reading of --until to the tests.
var ParseUntil = parseUntil
