package fanctl

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// usageError is a mistake in the command line, found before anything is
// sent: a bad flag or argument, or a name that does not exist. Main prints
// it on one line and exits 2, so a script can tell its own mistake from a
// failure of the bus.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// helpRequested: -h or --help was given to a command. It carries the
// command's flags, so that help prints exactly what the command parses.
type helpRequested struct{ fs *flag.FlagSet }

func (h *helpRequested) Error() string { return "help requested" }
func (h *helpRequested) Unwrap() error { return flag.ErrHelp }

// errReported marks an error a command has already shown to the user; Main
// exits 2 without printing it again.
var errReported = errors.New("reported")

// parseOnly parses a command's flags up to its first argument. The flag
// package prints nothing: a bad flag becomes Main's one usage line, and -h
// the command's help on standard output.
func parseOnly(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &helpRequested{fs: fs}
		}
		return &usageError{err.Error()}
	}
	return nil
}

// parseFlags parses a command's flags, which come before its arguments
// (fs.Args()), and refuses more arguments than the command's spec declares
// (commandSpec.Args; none for most commands). Every command parses its
// flags with it or parseInterspersed before doing anything else: help and
// shell completion run the command with -h to learn its flags.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := parseOnly(fs, args); err != nil {
		return err
	}
	return tooMany(fs.Name(), fs.Args())
}

// parseInterspersed parses flags that may come before or after positional
// arguments (fanctl node standby n1 --reason x) and returns the arguments;
// wantArgs checks them.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseOnly(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, tooMany(fs.Name(), pos)
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// tooMany refuses arguments beyond those cmd's spec declares.
func tooMany(cmd string, pos []string) error {
	s := specs[cmd]
	if s == nil || len(pos) <= len(s.Args) {
		return nil
	}
	if len(s.Args) == 0 {
		return usagef("unexpected argument %q (%s takes no arguments)", pos[0], cmd)
	}
	return usagef("unexpected argument %q", pos[len(s.Args)])
}

// wantArgs checks that pos holds exactly the arguments names.
func wantArgs(pos []string, names ...string) error {
	switch {
	case len(pos) < len(names):
		return usagef("missing %s", names[len(pos)])
	case len(pos) > len(names):
		return usagef("unexpected argument %q", pos[len(names)])
	}
	return nil
}

// nearest is the candidate a mistyped word most likely meant: the shortest
// one containing it, or else the one fewest edits away.
func nearest(word string, candidates []string) string {
	best, bestScore := "", 0
	for _, c := range candidates {
		score := editDistance(word, c)
		if word != "" && strings.Contains(c, word) {
			score = -1000 + len(c)
		}
		if best == "" || score < bestScore {
			best, bestScore = c, score
		}
	}
	return best
}

// closeTo is nearest's answer when it is close enough to be worth saying.
func closeTo(word string, candidates []string) (string, bool) {
	n := nearest(word, candidates)
	if n == "" {
		return "", false
	}
	return n, strings.Contains(n, word) || editDistance(word, n) <= max(2, len(word)/3)
}

// unknownName words the refusal of a name that is not among known:
// "did you mean X? (known: a, b)".
func unknownName(name string, known []string) string {
	known = slices.Clone(known)
	sort.Strings(known)
	var b strings.Builder
	if n, ok := closeTo(name, known); ok {
		fmt.Fprintf(&b, "did you mean %s? ", n)
	}
	fmt.Fprintf(&b, "(%s)", strings.Join(known, ", "))
	return b.String()
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
