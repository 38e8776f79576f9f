package fanctl

import "slices"

// CommandFlags exposes each command's completion flags to the tests.
func CommandFlags() map[string][]string {
	out := map[string][]string{}
	for k, v := range commandFlags {
		out[k] = slices.Clone(v)
	}
	return out
}
