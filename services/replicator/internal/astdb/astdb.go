// Package astdb carries AstDB families (PJSIP's `registrar` contacts above
// all) between two running Asterisks over AMI: DBGetTree on the holder,
// DBPut and DBDel on the standby, as observed to work on Asterisk 22
// (docs/asterisk22.md). The sqlite file itself is never copied: a
// live astdb.sqlite3 copied raw can be torn, and replacing it under a
// running Asterisk loses writes or corrupts it.
package astdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

// Actioner runs one AMI action; *ami.Session is one.
type Actioner interface {
	Action(ctx context.Context, name string, fields ...ami.Field) (ami.Response, error)
}

// Read lists the families as value entries whose path is "family/key".
func Read(ctx context.Context, a Actioner, families []string) ([]fstree.Entry, error) {
	var out []fstree.Entry
	for _, fam := range families {
		r, err := a.Action(ctx, "DBGetTree", ami.F("Family", fam))
		if err != nil {
			return nil, fmt.Errorf("astdb: DBGetTree %s: %w", fam, err)
		}
		if !r.Success() {
			return nil, fmt.Errorf("astdb: DBGetTree %s: %s", fam, r.Message())
		}
		if _, ok := r.Complete(); !ok {
			return nil, fmt.Errorf("astdb: DBGetTree %s: list not complete", fam)
		}
		for _, ev := range r.Events() {
			if ev.Name() != "DBGetTreeResponse" {
				continue
			}
			k := strings.TrimPrefix(ev.Field("Key"), "/")
			if !strings.HasPrefix(k, fam+"/") {
				continue
			}
			out = append(out, fstree.Entry{Path: k, Kind: fstree.KindValue, Value: ev.Field("Val")})
		}
	}
	fstree.Sort(out)
	return out, nil
}

// Options bound what one apply may do.
type Options struct {
	// MaxDeleteShare and AllowDeletes work as for file trees.
	MaxDeleteShare float64
	AllowDeletes   int
}

// Result counts what an apply changed.
type Result struct {
	Put, Deleted int64
}

// Apply makes the families on a match want: DBPut what differs or is
// missing, DBDel what the source no longer has. Keys outside families are
// never touched.
func Apply(ctx context.Context, a Actioner, families []string, want []fstree.Entry, o Options) (Result, error) {
	var res Result
	have, err := Read(ctx, a, families)
	if err != nil {
		return res, err
	}
	inFam := func(p string) bool {
		for _, f := range families {
			if strings.HasPrefix(p, f+"/") {
				return true
			}
		}
		return false
	}
	wm := map[string]string{}
	for _, e := range want {
		if e.Kind == fstree.KindValue && inFam(e.Path) {
			wm[e.Path] = e.Value
		}
	}
	hm := map[string]string{}
	var dels []string
	for _, e := range have {
		hm[e.Path] = e.Value
		if _, ok := wm[e.Path]; !ok {
			dels = append(dels, e.Path)
		}
	}
	if n := len(dels); n > o.AllowDeletes && float64(n) > o.MaxDeleteShare*float64(len(have)) {
		return res, &fstree.ValveError{Deletes: n, TargetFiles: len(have), MaxShare: o.MaxDeleteShare}
	}
	for _, e := range want {
		v, ok := wm[e.Path]
		if !ok {
			continue
		}
		if old, ok := hm[e.Path]; ok && old == v {
			continue
		}
		fam, key, _ := strings.Cut(e.Path, "/")
		r, err := a.Action(ctx, "DBPut", ami.F("Family", fam), ami.F("Key", key), ami.F("Val", v))
		if err != nil {
			return res, fmt.Errorf("astdb: DBPut %s: %w", e.Path, err)
		}
		if !r.Success() {
			return res, fmt.Errorf("astdb: DBPut %s: %s", e.Path, r.Message())
		}
		res.Put++
	}
	for _, p := range dels {
		fam, key, _ := strings.Cut(p, "/")
		r, err := a.Action(ctx, "DBDel", ami.F("Family", fam), ami.F("Key", key))
		if err != nil {
			return res, fmt.Errorf("astdb: DBDel %s: %w", p, err)
		}
		// "Database entry not found": gone already, which is what we want.
		if !r.Success() && !strings.Contains(r.Message(), "not found") {
			return res, fmt.Errorf("astdb: DBDel %s: %s", p, r.Message())
		}
		res.Deleted++
	}
	return res, nil
}
