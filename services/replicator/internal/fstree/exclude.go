package fstree

import (
	"fmt"
	"path"
	"strings"
)

// TempPrefix starts the name of every file the replicator writes before its
// final rename. Scans skip such names, and Apply removes leftovers of a crash.
const TempPrefix = ".fan-repl-"

// AlwaysExcluded are patterns no tree ever replicates: Asterisk's voicemail
// lock files (.lock and .lock-<pid>) and the replicator's own temp files.
var AlwaysExcluded = []string{".lock*", TempPrefix + "*"}

// Excluder decides which relative paths a tree leaves out.
//
// Patterns follow a small subset of gitignore: a pattern without a slash
// matches any path component (".lock*" at any depth); a pattern with a slash
// matches the relative path from the root ("default/*/tmp"); a trailing slash
// limits the pattern to directories ("tmp/"). An excluded directory excludes
// everything below it. Syntax is path.Match's.
type Excluder struct {
	patterns []pattern
}

type pattern struct {
	glob     string
	anchored bool
	dirOnly  bool
}

// defaultExcluder is what a nil *Excluder means: AlwaysExcluded only.
var defaultExcluder, _ = NewExcluder(nil)

// NewExcluder checks the patterns and adds AlwaysExcluded.
func NewExcluder(patterns []string) (*Excluder, error) {
	x := &Excluder{}
	for _, p := range append(append([]string{}, AlwaysExcluded...), patterns...) {
		pt := pattern{glob: p}
		if strings.HasSuffix(pt.glob, "/") {
			pt.dirOnly = true
			pt.glob = strings.TrimSuffix(pt.glob, "/")
		}
		pt.glob = strings.TrimPrefix(pt.glob, "/")
		pt.anchored = strings.Contains(pt.glob, "/") || strings.HasPrefix(p, "/")
		if pt.glob == "" {
			return nil, fmt.Errorf("fstree: exclude pattern %q is empty", p)
		}
		if _, err := path.Match(pt.glob, ""); err != nil {
			return nil, fmt.Errorf("exclude pattern %q: %w", p, err)
		}
		x.patterns = append(x.patterns, pt)
	}
	return x, nil
}

// Excluded reports whether rel (slash separated, relative to the root) is
// left out. Callers walking a tree stop at an excluded directory, so only
// the last component and the whole path need checking here.
func (x *Excluder) Excluded(rel string, isDir bool) bool {
	if x == nil {
		x = defaultExcluder
	}
	base := path.Base(rel)
	for _, p := range x.patterns {
		if p.dirOnly && !isDir {
			continue
		}
		subject := base
		if p.anchored {
			subject = rel
		}
		if ok, _ := path.Match(p.glob, subject); ok {
			return true
		}
	}
	return false
}

// ExcludedAnywhere is Excluded for a path whose parents were not checked
// (an entry of a manifest from another node): any excluded parent excludes it.
func (x *Excluder) ExcludedAnywhere(rel string, isDir bool) bool {
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		if x.Excluded(strings.Join(parts[:i], "/"), true) {
			return true
		}
	}
	return x.Excluded(rel, isDir)
}
