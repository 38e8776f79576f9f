// Package astdb carries AstDB families (PJSIP's `registrar` contacts above
// all) between two running Asterisks over AMI, as observed on Asterisk 22
// (docs/asterisk22.md): on the holder, the contacts Asterisk reports
// (ContactStatus events) read one by one with DBGet, and whole families
// with DBGetTree to reconcile; on the standby, DBPut and DBDel. The sqlite
// file itself is never copied: a live astdb.sqlite3 copied raw can be
// torn, and replacing it under a running Asterisk loses writes or
// corrupts it.
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
