// Package runbook reads the runnable blocks of an operator's document, so a
// test can run every command the document shows and a document cannot
// promise a command nobody ran. A runnable block is a fenced code block
// whose info string is "<lang> runbook:<name>", for example
//
//	```sh runbook:status-healthy
//	fanctl status
//	```
//
// The name is unique in the document; asking for a name it does not hold is
// an error, so a test and its document cannot drift apart silently. Blocks of
// another language ("yaml runbook:valve-share") carry text a test applies
// itself, such as a configuration snippet the document tells the operator to
// add.
package runbook

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Sentinel errors, for callers that tell a broken document from a test that
// asks for the wrong block.
var (
	ErrDuplicate   = errors.New("runbook: duplicate block name")
	ErrUnknown     = errors.New("runbook: no such block")
	ErrMalformed   = errors.New("runbook: malformed block")
	ErrNotRunnable = errors.New("runbook: block is not a shell block")
)

// Block is one runnable block of a document.
type Block struct {
	Name string
	// Lang is the info string's first word ("sh", "yaml").
	Lang string
	// Text is the block's content with the fence's indentation removed,
	// ending in a newline unless empty.
	Text string
	// Line is the 1-based line of the opening fence, for messages.
	Line int
	// Section is the text of the last level-2 heading ("## ...") above the
	// block, empty before the first one.
	Section string
}

// Doc is a parsed document's runnable blocks, in document order.
type Doc struct {
	blocks []Block
	byName map[string]int
}

// nameRE is what a block name may be: a word an operator can say aloud and
// a test can put in a table.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

const marker = "runbook:"

// ParseFile reads the document at path.
func ParseFile(path string) (*Doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("runbook: %w", err)
	}
	d, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// fence is an open fenced block (CommonMark: three or more backticks or
// tildes, indented by at most three spaces).
type fence struct {
	char   byte
	n      int
	indent int
	line   int
	block  *Block // nil for a block that is not a runbook block
	body   strings.Builder
}

// Parse reads a markdown document and returns its runnable blocks. Fenced
// blocks without the marker are skipped (their content is never mistaken
// for a heading or a fence); an unterminated runbook block, a marker without
// a valid name and a duplicate name are errors.
func Parse(md []byte) (*Doc, error) {
	d := &Doc{byName: map[string]int{}}
	sc := bufio.NewScanner(bytes.NewReader(md))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var open *fence
	section := ""
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if open != nil {
			if closes(line, open) {
				if open.block != nil {
					open.block.Text = open.body.String()
					if err := d.add(*open.block); err != nil {
						return nil, err
					}
				}
				open = nil
				continue
			}
			open.body.WriteString(dedent(line, open.indent))
			open.body.WriteByte('\n')
			continue
		}
		if f := opens(line, n); f != nil {
			info := strings.TrimSpace(line[f.indent+f.n:])
			b, err := blockOf(info, n)
			if err != nil {
				return nil, err
			}
			if b != nil {
				b.Section = section
			}
			f.block = b
			open = f
			continue
		}
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = strings.TrimSpace(strings.TrimRight(strings.TrimSpace(h), "#"))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("runbook: %w", err)
	}
	if open != nil && open.block != nil {
		return nil, fmt.Errorf("%w: block %q opened on line %d is never closed", ErrMalformed, open.block.Name, open.line)
	}
	return d, nil
}

// opens reports the fence line opens, or nil.
func opens(line string, n int) *fence {
	indent := len(line) - len(strings.TrimLeft(line, " "))
	if indent > 3 || indent == len(line) {
		return nil
	}
	c := line[indent]
	if c != '`' && c != '~' {
		return nil
	}
	k := indent
	for k < len(line) && line[k] == c {
		k++
	}
	if k-indent < 3 {
		return nil
	}
	// A backtick fence's info string may not contain a backtick.
	if c == '`' && strings.ContainsRune(line[k:], '`') {
		return nil
	}
	return &fence{char: c, n: k - indent, indent: indent, line: n}
}

// closes reports whether line closes f: the same character, at least as
// many, nothing after but spaces.
func closes(line string, f *fence) bool {
	t := strings.TrimLeft(line, " ")
	if len(line)-len(t) > 3 {
		return false
	}
	k := 0
	for k < len(t) && t[k] == f.char {
		k++
	}
	return k >= f.n && strings.TrimSpace(t[k:]) == ""
}

// dedent removes up to n leading spaces, as CommonMark does for the content
// of an indented fence.
func dedent(line string, n int) string {
	for i := 0; i < n && strings.HasPrefix(line, " "); i++ {
		line = line[1:]
	}
	return line
}

// blockOf reads an info string: nil for a block without the marker.
func blockOf(info string, line int) (*Block, error) {
	words := strings.Fields(info)
	var name string
	found := false
	for _, w := range words[min(1, len(words)):] {
		if v, ok := strings.CutPrefix(w, marker); ok {
			if found {
				return nil, fmt.Errorf("%w: line %d: two %s names in %q", ErrMalformed, line, marker, info)
			}
			name, found = v, true
		}
	}
	if !found {
		if len(words) > 0 && strings.HasPrefix(words[0], marker) {
			return nil, fmt.Errorf("%w: line %d: %q names no language before %s", ErrMalformed, line, info, marker)
		}
		return nil, nil
	}
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("%w: line %d: block name %q (letters, digits, '.', '_', '-')", ErrMalformed, line, name)
	}
	return &Block{Name: name, Lang: words[0], Line: line}, nil
}

func (d *Doc) add(b Block) error {
	if i, dup := d.byName[b.Name]; dup {
		return fmt.Errorf("%w: %q on lines %d and %d", ErrDuplicate, b.Name, d.blocks[i].Line, b.Line)
	}
	d.byName[b.Name] = len(d.blocks)
	d.blocks = append(d.blocks, b)
	return nil
}

// Blocks returns every runnable block in document order.
func (d *Doc) Blocks() []Block { return append([]Block(nil), d.blocks...) }

// Block returns the block called name.
func (d *Doc) Block(name string) (Block, error) {
	i, ok := d.byName[name]
	if !ok {
		return Block{}, fmt.Errorf("%w: %q", ErrUnknown, name)
	}
	return d.blocks[i], nil
}

// Shell returns the shell block called name: ErrUnknown when there is none,
// ErrNotRunnable when the block is of another language.
func (d *Doc) Shell(name string) (Block, error) {
	b, err := d.Block(name)
	if err != nil {
		return b, err
	}
	if b.Lang != "sh" {
		return Block{}, fmt.Errorf("%w: %q is %q (line %d)", ErrNotRunnable, name, b.Lang, b.Line)
	}
	return b, nil
}

// Missing returns the shell blocks in the given sections (every section
// when none is given) whose names are not in ran: what a test promised to
// run and did not.
func (d *Doc) Missing(ran []string, sections ...string) []string {
	done := map[string]bool{}
	for _, n := range ran {
		done[n] = true
	}
	var out []string
	for _, b := range d.blocks {
		if b.Lang != "sh" || done[b.Name] {
			continue
		}
		if len(sections) > 0 && !slices.Contains(sections, b.Section) {
			continue
		}
		out = append(out, b.Name)
	}
	return out
}
