package astdb

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

// ManifestOptions say how a standby applies a holder's manifest of its
// families.
type ManifestOptions struct {
	// Newer reports a key that a delta changed after the manifest was
	// read: the delta's value (or deletion) stands.
	Newer func(key string) bool
	// MaxDeleteShare and AllowDeletes bound the deletions a manifest may
	// make that nothing explains (see ApplyManifest).
	MaxDeleteShare float64
	AllowDeletes   int
	// Now decides which contacts have expired; zero means time.Now().
	Now time.Time
	// Parallel is how many DBPut or DBDel are in flight at once.
	Parallel int
	// Held reports a key an earlier apply held back: it stays held (until
	// the holder has it again, a delta deletes it, or it expires), however
	// few of the others go.
	Held func(key string) bool
}

// ManifestResult is what an apply did, and what it held back.
type ManifestResult struct {
	Put, Deleted int64
	// Expired counts the deletions of contacts whose expiration_time had
	// come (among Deleted).
	Expired int64
	// Have is how many keys of the families the standby had.
	Have int
	// Held are the deletions held back (sorted); HeldUntil is when the
	// last held contact expires on its own (zero if one of them has no
	// expiry).
	Held      []string
	HeldUntil time.Time
}

// ApplyManifest makes the standby's families match a holder's manifest: it
// reads them once (DBGetTree), then DBPuts what differs or is missing and
// DBDels what the holder does not have, leaving keys a newer delta
// changed as that delta left them.
//
// A key the holder lacks is deleted at once when its contact has expired
// (Asterisk prunes it on every node anyway). The others are deletions
// nothing explains: phones that unregistered were reported and deleted
// by deltas, so these come from a holder that lost its registrations (an
// Asterisk restarted with an empty database) or changes no event
// reported. Up to AllowDeletes of them, or up to MaxDeleteShare of the
// keys the standby has, they are made; more are all held back (Held) and
// the rest of the manifest is applied all the same. A held key stays held
// (ManifestOptions.Held) until the holder has it again, reports it gone,
// or it expires.
func ApplyManifest(ctx context.Context, a Actioner, families []string, want []fstree.Entry, o ManifestOptions) (ManifestResult, error) {
	var res ManifestResult
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.Newer == nil {
		o.Newer = func(string) bool { return false }
	}
	if o.Held == nil {
		o.Held = func(string) bool { return false }
	}
	have, err := Read(ctx, a, families)
	if err != nil {
		return res, err
	}
	res.Have = len(have)
	inFam := func(p string) bool {
		return slices.ContainsFunc(families, func(f string) bool { return strings.HasPrefix(p, f+"/") })
	}
	wm := make(map[string]string, len(want))
	for _, e := range want {
		if e.Kind == fstree.KindValue && inFam(e.Path) {
			wm[e.Path] = e.Value
		}
	}
	hm := make(map[string]string, len(have))
	var expired, unexplained []string
	for _, e := range have {
		hm[e.Path] = e.Value
		if _, ok := wm[e.Path]; ok || o.Newer(e.Path) {
			continue
		}
		if t, ok := Expiry(e.Value); ok && !t.After(o.Now) {
			expired = append(expired, e.Path)
			continue
		}
		unexplained = append(unexplained, e.Path)
	}
	var puts []fstree.Entry
	for _, e := range want {
		v, ok := wm[e.Path]
		if !ok || o.Newer(e.Path) {
			continue
		}
		if old, ok := hm[e.Path]; ok && old == v {
			continue
		}
		puts = append(puts, e)
	}
	dels := expired
	var stillHeld []string
	unexplained = slices.DeleteFunc(unexplained, func(k string) bool {
		if o.Held(k) {
			stillHeld = append(stillHeld, k)
			return true
		}
		return false
	})
	if n := len(unexplained); n > o.AllowDeletes && float64(n) > o.MaxDeleteShare*float64(len(have)) {
		stillHeld = append(stillHeld, unexplained...)
	} else {
		dels = append(dels, unexplained...)
	}
	if len(stillHeld) > 0 {
		res.Held = stillHeld
		slices.Sort(res.Held)
		for i, k := range res.Held {
			t, ok := Expiry(hm[k])
			if !ok {
				res.HeldUntil = time.Time{}
				break
			}
			if i == 0 || t.After(res.HeldUntil) {
				res.HeldUntil = t
			}
		}
	}
	err = each(ctx, puts, o.Parallel, func(ctx context.Context, e fstree.Entry) error {
		return Put(ctx, a, e.Path, e.Value)
	})
	if err != nil {
		return res, err
	}
	res.Put = int64(len(puts))
	err = each(ctx, dels, o.Parallel, func(ctx context.Context, k string) error { return Del(ctx, a, k) })
	if err != nil {
		return res, err
	}
	res.Deleted, res.Expired = int64(len(dels)), int64(len(expired))
	return res, nil
}
