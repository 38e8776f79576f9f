package config

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Decode reads b (YAML) into dst, a pointer to a struct with yaml tags,
// without stopping at the first mistake. Every key is checked against the
// struct before anything is set: an unknown key is refused with the
// nearest known key at its level, a value of the wrong kind with what the
// key wants in YAML's terms ("want a whole number, got \"two\""), each
// with its key's path and line. A value refused is left out, so its field
// keeps the value dst had (its default) and every other key is still read.
//
// Nothing is returned as an error: the mistakes are kept in the Doc, whose
// Report lists them with those of the checks that follow (Validate). ok is
// false when dst could not be filled at all (the file is not YAML, or not a
// mapping): checking the result further would only report empty keys.
func Decode(name string, b []byte, dst any) (doc *Doc, ok bool) {
	doc = NewDoc(name)
	var root yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return doc, true // an empty file: every key at its default
		}
		line, msg := cutLine(err.Error())
		doc.read = append(doc.read, &FieldError{Err: fmt.Errorf("not valid YAML: %s", msg), Line: line})
		return doc, false
	}
	top := &root
	if top.Kind == yaml.DocumentNode {
		if len(top.Content) == 0 {
			return doc, true
		}
		top = top.Content[0]
	}
	t := reflect.TypeOf(dst)
	if t == nil || t.Kind() != reflect.Pointer {
		doc.read = append(doc.read, &FieldError{Err: fmt.Errorf("config: Decode into %T, want a pointer", dst)})
		return doc, false
	}
	w := walker{doc: doc, seen: map[visit]bool{}}
	if !w.walk(top, t.Elem(), "", top.Line) {
		return doc, false
	}
	if err := root.Decode(dst); err != nil {
		// What the walk above let through must decode; if it does not,
		// say what YAML says rather than validate a half-read file.
		var te *yaml.TypeError
		if errors.As(err, &te) {
			for _, m := range te.Errors {
				line, msg := cutLine(m)
				doc.read = append(doc.read, &FieldError{Err: errors.New(msg), Line: line})
			}
		} else {
			line, msg := cutLine(err.Error())
			doc.read = append(doc.read, &FieldError{Err: errors.New(msg), Line: line})
		}
		return doc, false
	}
	return doc, true
}

type visit struct {
	n *yaml.Node
	t reflect.Type
}

// walker checks a node tree against a Go type the way yaml.v3 would
// decode it, records where each key is, and prunes what would not decode.
type walker struct {
	doc *Doc
	// seen holds the outcome of each mapping or list already walked as a
	// type: an alias is walked once, so anchors that expand a thousandfold
	// cost no more than they are long, and one that contains itself ends.
	seen map[visit]bool
}

func (w *walker) fail(line int, key string, err error) {
	w.doc.read = append(w.doc.read, &FieldError{Key: key, Err: err, Line: line})
	if key != "" {
		w.doc.unread = append(w.doc.unread, key)
	}
}

func (w *walker) mark(key string, line int) {
	if _, ok := w.doc.lines[key]; !ok {
		w.doc.lines[key] = line
	}
}

var (
	unmarshalerType     = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
	durationType        = reflect.TypeFor[time.Duration]()
	configDurationType  = reflect.TypeFor[Duration]()
)

// walk reports whether n decodes into a t; line is where to place an
// error (the key's line, or the list item's).
func (w *walker) walk(n *yaml.Node, t reflect.Type, path string, line int) bool {
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			w.fail(line, path, fmt.Errorf("alias *%s names no anchor", n.Value))
			return false
		}
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.ShortTag() == "!!null" {
		return true // the field keeps its value (or a pointer, list or map is emptied)
	}
	if n.Kind != yaml.ScalarNode {
		v := visit{n, t}
		if ok, done := w.seen[v]; done {
			return ok
		}
		w.seen[v] = true
		ok := w.collection(n, t, path, line)
		w.seen[v] = ok
		return ok
	}
	return w.scalar(n, t, path, line)
}

func (w *walker) collection(n *yaml.Node, t reflect.Type, path string, line int) bool {
	switch {
	case reflect.PointerTo(t).Implements(unmarshalerType):
		return w.delegate(n, t, path, line)
	case t == timeType || reflect.PointerTo(t).Implements(textUnmarshalerType):
		w.fail(line, path, fmt.Errorf("want %s, got %s", want(t, n), got(n, path)))
		return false
	}
	switch t.Kind() {
	case reflect.Interface:
		return true
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			w.fail(line, path, fmt.Errorf("want %s, got %s", want(t, n), got(n, path)))
			return false
		}
		fs := fieldsOf(t)
		w.entries(n, t, path, func(k, v *yaml.Node) bool {
			key := join(path, k.Value)
			ft, known := fs.byKey[k.Value]
			switch {
			case known:
			case fs.inlineMap != nil:
				ft = fs.inlineMap
			default:
				w.unknown(k, key, fs.keys)
				return false
			}
			w.mark(key, k.Line)
			return w.walk(v, ft, key, k.Line)
		})
		return true
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			w.fail(line, path, fmt.Errorf("want %s, got %s", want(t, n), got(n, path)))
			return false
		}
		kt, et := t.Key(), t.Elem()
		w.entries(n, t, path, func(k, v *yaml.Node) bool {
			key := join(path, k.Value)
			w.mark(key, k.Line)
			if kt.Kind() != reflect.String && !w.walk(k, kt, key, k.Line) {
				return false
			}
			return w.walk(v, et, key, k.Line)
		})
		return true
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			w.fail(line, path, fmt.Errorf("want %s, got %s", want(t, n), got(n, path)))
			return false
		}
		if t.Kind() == reflect.Array && len(n.Content) != t.Len() {
			w.fail(line, path, fmt.Errorf("want a list of exactly %d, got %d", t.Len(), len(n.Content)))
			return false
		}
		et := t.Elem()
		for i, e := range n.Content {
			key := fmt.Sprintf("%s[%d]", path, i)
			w.mark(key, e.Line)
			if !w.walk(e, et, key, e.Line) {
				// Another item in its place keeps the indices of the ones
				// after it, which the checks that follow name.
				n.Content[i] = zeroNode(et)
			}
		}
		return true
	}
	w.fail(line, path, fmt.Errorf("want %s, got %s", want(t, n), got(n, path)))
	return false
}

// entries walks a mapping's pairs: keep says whether a pair stays. A key
// given twice, a key that is not a plain value and a merge (<<) of
// anything but mappings are refused, as yaml.v3 would refuse them.
func (w *walker) entries(n *yaml.Node, t reflect.Type, path string, keep func(k, v *yaml.Node) bool) {
	first := map[string]int{}
	kept := make([]*yaml.Node, 0, len(n.Content))
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.AliasNode && k.Alias != nil {
			k = k.Alias
		}
		ok := false
		switch {
		case k.Kind != yaml.ScalarNode:
			w.fail(k.Line, path, fmt.Errorf("a key must be a plain name, got %s", got(k, path)))
		case k.ShortTag() == "!!null":
			// yaml.v3 would drop the pair without a word.
			w.fail(k.Line, path, errors.New("a key with no name"))
		case first[k.Value] != 0:
			w.fail(k.Line, join(path, k.Value), fmt.Errorf("given twice (first on line %d)", first[k.Value]))
		case isMerge(k):
			first[k.Value] = k.Line
			ok = w.merge(k, v, t, path)
		default:
			first[k.Value] = k.Line
			ok = keep(k, v)
		}
		if ok {
			kept = append(kept, n.Content[i], v)
		}
	}
	n.Content = kept
}

func isMerge(k *yaml.Node) bool {
	return k.Value == "<<" && (k.Tag == "" || k.Tag == "!" || k.ShortTag() == "!!merge")
}

// merge checks "<<: *anchor" (or a list of them): each must be a mapping,
// read as more keys of this one.
func (w *walker) merge(k, v *yaml.Node, t reflect.Type, path string) bool {
	items := []*yaml.Node{v}
	if v.Kind == yaml.SequenceNode {
		items = v.Content
	}
	for _, it := range items {
		if it.Kind == yaml.AliasNode && it.Alias != nil {
			it = it.Alias
		}
		if it.Kind != yaml.MappingNode {
			w.fail(k.Line, join(path, "<<"), fmt.Errorf("want a mapping or a list of mappings to merge, got %s", got(it, path)))
			return false
		}
	}
	ok := true
	for _, it := range items {
		ok = w.walk(it, t, path, k.Line) && ok
	}
	return ok
}

func (w *walker) scalar(n *yaml.Node, t reflect.Type, path string, line int) bool {
	switch {
	case reflect.PointerTo(t).Implements(unmarshalerType), t == timeType, reflect.PointerTo(t).Implements(textUnmarshalerType):
		return w.delegate(n, t, path, line)
	}
	switch t.Kind() {
	case reflect.Interface:
		return true
	case reflect.String, reflect.Bool, reflect.Float32, reflect.Float64,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
	default:
		w.fail(line, path, fmt.Errorf("want %s, got %s", want(t, n), got(n, path)))
		return false
	}
	if err := n.Decode(reflect.New(t).Interface()); err != nil || !whole(n, t) {
		w.fail(line, path, fmt.Errorf("want %s, got %s", want(t, n), got(n, path)))
		return false
	}
	return true
}

// whole refuses a fraction where a whole number is wanted: yaml.v3 would
// cut "rise: 2.5" to 2 without a word.
func whole(n *yaml.Node, t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
	default:
		return true
	}
	if n.ShortTag() != "!!float" {
		return true
	}
	var f float64
	if err := n.Decode(&f); err != nil {
		return false
	}
	return f == math.Trunc(f)
}

// delegate decodes n with the type's own unmarshaler (a duration, an
// address) and says what it refused.
func (w *walker) delegate(n *yaml.Node, t reflect.Type, path string, line int) bool {
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return true
	}
	var te *yaml.TypeError
	msg := err.Error()
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	_, msg = cutLine(msg)
	if credential(path) {
		// The type's own message may quote the value.
		msg = fmt.Sprintf("want %s, got %s", want(t, n), got(n, path))
	}
	w.fail(line, path, errors.New(msg))
	return false
}

// unknown refuses a key the struct does not have, naming the nearest one
// it has (a misspelling) if one is near enough. Its value is never shown:
// a misspelt "secert:" would otherwise print the secret.
func (w *walker) unknown(k *yaml.Node, key string, known []string) {
	if s := nearest(k.Value, known); s != "" {
		w.fail(k.Line, key, fmt.Errorf("%w; did you mean %s?", ErrUnknownKey, s))
		return
	}
	w.fail(k.Line, key, ErrUnknownKey)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// zeroNode is a node that decodes to the zero value of t.
func zeroNode(t reflect.Type) *yaml.Node {
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
	case reflect.Struct, reflect.Map:
		if !reflect.PointerTo(t).Implements(unmarshalerType) && !reflect.PointerTo(t).Implements(textUnmarshalerType) && t != timeType {
			return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		}
	case reflect.Slice:
		return &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	}
	var n yaml.Node
	if err := n.Encode(reflect.Zero(t).Interface()); err != nil || n.Kind != yaml.ScalarNode {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
	}
	return &n
}

// want is what a value of t is, in YAML's words.
func want(t reflect.Type, n *yaml.Node) string {
	switch {
	case t == durationType || t == configDurationType:
		return `a duration such as "200ms", "5s" or "1h"`
	case t == timeType:
		return "a time such as 2026-12-24T02:00:00Z"
	case reflect.PointerTo(t).Implements(textUnmarshalerType):
		return "a single value"
	}
	// A whole number that does not fit is told the range; anything else
	// only what kind of value is wanted.
	numeric := n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float" && whole(n, reflect.TypeFor[int64]()))
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if numeric {
			b := t.Bits()
			return fmt.Sprintf("a whole number from %d to %d", int64(-1)<<(b-1), int64(1)<<(b-1)-1)
		}
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if numeric {
			return fmt.Sprintf("a whole number from 0 to %d", uint64(math.MaxUint64)>>(64-t.Bits()))
		}
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a single value (text)"
	case reflect.Slice, reflect.Array:
		return "a list ([a, b], or one \"- item\" per line)"
	case reflect.Map, reflect.Struct:
		return "a mapping (key: value)"
	}
	return "a value of another kind"
}

// got describes what n holds; a credential's value is never shown.
func got(n *yaml.Node, path string) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if credential(path) {
		return "a value that is not shown (a credential)"
	}
	v := n.Value
	if utf8.RuneCountInString(v) > 60 {
		v = string([]rune(v)[:57]) + "..."
	}
	if n.ShortTag() == "!!str" {
		return strconv.Quote(v)
	}
	return v
}

// credential reports whether the last step of a key path names a
// credential.
func credential(path string) bool {
	last := path[strings.LastIndex(path, ".")+1:]
	return credentialKey.MatchString(last)
}

// fieldSet is a struct's keys as yaml.v3 reads them.
type fieldSet struct {
	byKey map[string]reflect.Type
	// keys in declaration order, for suggestions.
	keys []string
	// inlineMap is the value type of an ",inline" map, which takes every
	// key the struct does not have.
	inlineMap reflect.Type
}

var fieldCache sync.Map // reflect.Type -> fieldSet

// fieldsOf follows yaml.v3's rules: the tag's name, or the field's name in
// lower case; "-" and unexported fields skipped; ",inline" structs
// flattened.
func fieldsOf(t reflect.Type) fieldSet {
	if fs, ok := fieldCache.Load(t); ok {
		return fs.(fieldSet)
	}
	fs := fieldSet{byKey: map[string]reflect.Type{}}
	for f := range t.Fields() {
		if f.PkgPath != "" && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "" && !strings.Contains(string(f.Tag), ":") {
			tag = string(f.Tag)
		}
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if inline(opts) {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft.Kind() == reflect.Map:
				fs.inlineMap = ft.Elem()
			case ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(unmarshalerType):
				inner := fieldsOf(ft)
				for _, k := range inner.keys {
					fs.byKey[k] = inner.byKey[k]
					fs.keys = append(fs.keys, k)
				}
				if inner.inlineMap != nil {
					fs.inlineMap = inner.inlineMap
				}
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fs.byKey[name] = f.Type
		fs.keys = append(fs.keys, name)
	}
	fieldCache.Store(t, fs)
	return fs
}

func inline(opts string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == "inline" {
			return true
		}
	}
	return false
}

// nearest is the known key closest to a misspelt one, if it is near enough
// to be what was meant: at most one edit in three letters (a swap of two
// neighbours is one edit).
func nearest(key string, known []string) string {
	best, bestD := "", math.MaxInt
	for _, k := range known {
		if d := distance(strings.ToLower(key), k); d < bestD {
			best, bestD = k, d
		}
	}
	if bestD <= max(1, utf8.RuneCountInString(key)/3) {
		return best
	}
	return ""
}

// distance is the optimal string alignment distance: insertions,
// deletions, substitutions and swaps of neighbours.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 64 || len(rb) > 64 {
		if a == b {
			return 0
		}
		return math.MaxInt
	}
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
