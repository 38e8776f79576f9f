package config

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// FieldError names the key that is wrong, so messages read "bus.url: ...".
type FieldError struct {
	// Key is the key's path from the top of the file: "bus.url",
	// "checks[1].timeout".
	Key string
	Err error
	// Line is where Key is in the file, once the loader has found it (0:
	// not known, or a key that is not in the file, like a missing required
	// one).
	Line int
	// Warning marks something to fix that does not stop the service (a
	// certificate that expires soon): printed, never refused.
	Warning bool
}

func (e *FieldError) Error() string {
	if e.Key == "" {
		return e.Err.Error()
	}
	return e.Key + ": " + e.Err.Error()
}

func (e *FieldError) Unwrap() error { return e.Err }

// Errf builds a FieldError.
func Errf(key, format string, args ...any) error {
	return &FieldError{Key: key, Err: fmt.Errorf(format, args...)}
}

// Warnf builds a FieldError that is only a warning.
func Warnf(key, format string, args ...any) error {
	return &FieldError{Key: key, Err: fmt.Errorf(format, args...), Warning: true}
}

// Join gathers the results of checks that do not depend on each other, so
// every one that fails is reported; nil ones are dropped, and Join of none
// is nil. errors.As on the result finds the first FieldError.
func Join(errs ...error) error { return errors.Join(errs...) }

// First returns the first non-nil error. Use it only where a failed check
// makes the ones after it meaningless; independent checks are Joined, so
// -check-config reports all of them.
func First(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ErrUnknownKey is what a key the configuration does not have is refused
// with (errors.Is).
var ErrUnknownKey = errors.New("unknown key")

// Errors is every error in a configuration, one per line, each with where
// it is ("/etc/fan/prober.yaml:23: checks[1].timeout: must be ...").
type Errors struct {
	Items []Located
}

// Located is one error and where it is: "file:line", the file alone when
// no line holds the key (a required key that is missing), or where else
// the value came from (a command-line flag).
type Located struct {
	Where string
	Err   error
	// Warning: to print, not to refuse.
	Warning bool
}

func (l Located) String() string {
	if l.Where == "" {
		return l.Err.Error()
	}
	return l.Where + ": " + l.Err.Error()
}

func (e *Errors) Error() string {
	lines := make([]string, len(e.Items))
	for i, it := range e.Items {
		lines[i] = it.String()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.Is and errors.As see every error.
func (e *Errors) Unwrap() []error {
	out := make([]error, len(e.Items))
	for i, it := range e.Items {
		out[i] = it.Err
	}
	return out
}

// Len is how many errors there are.
func (e *Errors) Len() int { return len(e.Items) }

// Count is how many errors err holds: the items of every Errors in it, one
// for any other error, 0 for nil.
func Count(err error) int { return len(flatten(err)) }

// flatten lists the errors err is made of: the items of Errors (as
// Located, already placed) and of errors.Join, recursively.
func flatten(err error) []any {
	switch e := err.(type) {
	case nil:
		return nil
	case *Errors:
		out := make([]any, len(e.Items))
		for i, it := range e.Items {
			out[i] = it
		}
		return out
	case interface{ Unwrap() []error }:
		var out []any
		for _, c := range e.Unwrap() {
			out = append(out, flatten(c)...)
		}
		return out
	}
	return []any{err}
}

// Doc is a configuration file as read: where each key is, and which keys
// could not be read at all (any further error about one of them would only
// repeat that). Its Report places the errors of the checks that follow the
// read (Validate, CheckHost) on the lines of their keys.
type Doc struct {
	name  string
	lines map[string]int
	// unread are keys whose value could not be read into its field.
	unread []string
	// read are the errors found reading the file, already placed.
	read []*FieldError
	// from names where a key's value came from instead of the file.
	from map[string]string
}

// NewDoc is the Doc of a configuration with no file (flags only): errors
// are placed by SetFrom, or nowhere.
func NewDoc(name string) *Doc { return &Doc{name: name, lines: map[string]int{}} }

// SetFrom says key's value came from somewhere other than the file (a
// flag, "-routes"): an error about it, or below it, is placed there.
func (d *Doc) SetFrom(key, origin string) {
	if d.from == nil {
		d.from = map[string]string{}
	}
	d.from[key] = origin
}

// Line is where key (or the nearest key above it that the file has) is;
// 0 when the file has none of them.
func (d *Doc) Line(key string) int {
	for k := key; k != ""; k = parentKey(k) {
		if n, ok := d.lines[k]; ok {
			return n
		}
	}
	return 0
}

// parentKey drops the last step of a key path: checks[1].timeout ->
// checks[1] -> checks -> "".
func parentKey(k string) string {
	i := strings.LastIndexAny(k, ".[")
	if i < 0 {
		return ""
	}
	return k[:i]
}

// under reports whether key is k or below it.
func under(key, k string) bool {
	return key == k || strings.HasPrefix(key, k) && (key[len(k)] == '.' || key[len(k)] == '[')
}

// Report is every error of errs (Validate's, CheckHost's, Joined or
// Errors) and of the read, each placed: on its key's line, or where SetFrom
// says its value came from. An error about a key that could not be read is
// left out (it only repeats the read's error). Warnings come back apart,
// as lines to print; err is an *Errors, nil when there are only warnings.
func (d *Doc) Report(errs ...error) (warnings []string, err error) {
	// The file's errors in its order (those about it as a whole first),
	// then those of values from elsewhere (flags).
	type placed struct {
		origin bool
		line   int
		loc    Located
		warn   bool
	}
	var all []placed
	for _, fe := range d.read {
		all = append(all, placed{line: fe.Line, loc: Located{Where: d.where(fe.Line), Err: fe}})
	}
	var others []Located
	for _, e := range errs {
		for _, f := range flatten(e) {
			if l, ok := f.(Located); ok {
				if l.Warning {
					warnings = append(warnings, l.String())
				} else {
					others = append(others, l)
				}
				continue
			}
			err := f.(error)
			var fe *FieldError
			if !errors.As(err, &fe) {
				all = append(all, placed{loc: Located{Where: d.name, Err: err}})
				continue
			}
			if d.isUnread(fe.Key) {
				continue
			}
			if origin, ok := d.origin(fe.Key); ok {
				all = append(all, placed{origin: true, loc: Located{Where: origin, Err: err}, warn: fe.Warning})
				continue
			}
			fe.Line = d.Line(fe.Key)
			all = append(all, placed{line: fe.Line, loc: Located{Where: d.where(fe.Line), Err: err}, warn: fe.Warning})
		}
	}
	slices.SortStableFunc(all, func(a, b placed) int {
		if a.origin != b.origin {
			if a.origin {
				return 1
			}
			return -1
		}
		return a.line - b.line
	})
	seen := map[string]bool{}
	var out Errors
	for _, p := range all {
		s := p.loc.String()
		if seen[s] {
			continue
		}
		seen[s] = true
		if p.warn {
			warnings = append(warnings, s)
			continue
		}
		out.Items = append(out.Items, p.loc)
	}
	out.Items = append(out.Items, others...)
	if len(out.Items) == 0 {
		return warnings, nil
	}
	return warnings, &out
}

func (d *Doc) where(line int) string {
	if line > 0 {
		return d.name + ":" + strconv.Itoa(line)
	}
	return d.name
}

func (d *Doc) isUnread(key string) bool {
	for _, k := range d.unread {
		if under(key, k) {
			return true
		}
	}
	return false
}

func (d *Doc) origin(key string) (string, bool) {
	for k, o := range d.from {
		if under(key, k) {
			return o, true
		}
	}
	return "", false
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): `)

// cutLine splits "yaml: line 3: msg" into 3 and "msg".
func cutLine(msg string) (int, string) {
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		return 0, strings.TrimPrefix(msg, "yaml: ")
	}
	n, _ := strconv.Atoi(m[1])
	return n, msg[len(m[0]):]
}
