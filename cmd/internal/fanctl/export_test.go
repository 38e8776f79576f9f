package fanctl

// CommandFlags exposes each command's completion flags to the tests: the
// flags of its FlagSet, as the completion scripts offer them.
func CommandFlags() map[string][]string {
	out := map[string][]string{}
	for c, flags := range commandFlags() {
		for _, f := range flags {
			out[c] = append(out[c], f.name)
		}
	}
	return out
}

// FlagValueKinds exposes what each command's flags complete to ("file",
// "dir", "node", ..., "value"; "" for a switch) and each flag's help text.
func FlagValueKinds() map[string]map[string][2]string {
	out := map[string]map[string][2]string{}
	for c, flags := range commandFlags() {
		out[c] = map[string][2]string{}
		fs := describe(c)
		for _, f := range flags {
			out[c][f.name] = [2]string{string(f.kind), fs.Lookup(f.name).Usage}
		}
	}
	return out
}

// Specs exposes the registered help of every command: its summary and
// examples, and the flags Values names.
func Specs() map[string]struct {
	Summary  string
	Examples []string
	Values   []string
} {
	out := map[string]struct {
		Summary  string
		Examples []string
		Values   []string
	}{}
	for name, s := range specs {
		v := out[name]
		v.Summary, v.Examples = s.Summary, s.Examples
		for f := range s.Values {
			v.Values = append(v.Values, f)
		}
		out[name] = v
	}
	return out
}

// Commands exposes the commands fanctl dispatches.
func Commands() []string { return append([]string(nil), commands...) }

// Nearest exposes the "did you mean" choice.
func Nearest(word string, candidates []string) string { return nearest(word, candidates) }
