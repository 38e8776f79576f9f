package astdb

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
)

// ReportedFamily is the family whose changes Asterisk reports as they
// happen: PJSIP's contacts, one AMI ContactStatus event (class system)
// for each new contact (NonQualified), each refresh (NonQualified again,
// only with send_contact_status_on_update_registration=yes), each removal
// (Removed: an unregistration, an expiry, remove_existing), and each
// qualify result (Reachable, Unreachable: the contact's value unchanged).
const ReportedFamily = "registrar"

// ContactStatusEvent is the event's name; followers ask for it alone.
const ContactStatusEvent = "ContactStatus"

// EventSource is what follows Asterisk's events: *ami.Session with
// Config.Events.
type EventSource interface {
	Events() <-chan ami.Event
	Gaps() <-chan struct{}
	DroppedEvents() uint64
}

// ContactKey is the "family/key" path of a PJSIP contact in AstDB:
// registrar/contact/<aor>;@<MD5 of the contact URI, hex>, the contact's
// sorcery id (res/res_pjsip/location.c).
func ContactKey(aor, uri string) string {
	h := md5.Sum([]byte(uri))
	return ReportedFamily + "/contact/" + aor + ";@" + hex.EncodeToString(h[:])
}

// EventKey is the contact a ContactStatus event is about, and whether it
// says the contact is gone; ok is false for any other event.
func EventKey(ev ami.Event) (key string, removed, ok bool) {
	if ev.Name() != ContactStatusEvent {
		return "", false, false
	}
	aor, uri := ev.Field("AOR"), ev.Field("URI")
	if aor == "" || uri == "" {
		return "", false, false
	}
	return ContactKey(aor, uri), ev.Field("ContactStatus") == "Removed", true
}

// Get reads one "family/key" with DBGet; found is false when Asterisk has
// no such key ("Database entry not found").
func Get(ctx context.Context, a Actioner, path string) (value string, found bool, err error) {
	fam, key, _ := strings.Cut(path, "/")
	r, err := a.Action(ctx, "DBGet", ami.F("Family", fam), ami.F("Key", key))
	if err != nil {
		return "", false, fmt.Errorf("astdb: DBGet %s: %w", path, err)
	}
	if !r.Success() {
		if strings.Contains(r.Message(), "not found") {
			return "", false, nil
		}
		return "", false, fmt.Errorf("astdb: DBGet %s: %s", path, r.Message())
	}
	for _, ev := range r.Events() {
		if ev.Name() == "DBGetResponse" {
			return ev.Field("Val"), true, nil
		}
	}
	return "", false, fmt.Errorf("astdb: DBGet %s: an answer without DBGetResponse", path)
}

// Put writes one "family/key" with DBPut.
func Put(ctx context.Context, a Actioner, path, value string) error {
	fam, key, _ := strings.Cut(path, "/")
	r, err := a.Action(ctx, "DBPut", ami.F("Family", fam), ami.F("Key", key), ami.F("Val", value))
	if err != nil {
		return fmt.Errorf("astdb: DBPut %s: %w", path, err)
	}
	if !r.Success() {
		return fmt.Errorf("astdb: DBPut %s: %s", path, r.Message())
	}
	return nil
}

// Del deletes one "family/key" with DBDel. A key that is not there is what
// was wanted: Asterisk 22 answers it "Database entry could not be
// deleted" (the same words as a failed delete, which the next reconcile
// finds again).
func Del(ctx context.Context, a Actioner, path string) error {
	fam, key, _ := strings.Cut(path, "/")
	r, err := a.Action(ctx, "DBDel", ami.F("Family", fam), ami.F("Key", key))
	if err != nil {
		return fmt.Errorf("astdb: DBDel %s: %w", path, err)
	}
	if !r.Success() && !strings.Contains(r.Message(), "not found") && !strings.Contains(r.Message(), "could not be deleted") {
		return fmt.Errorf("astdb: DBDel %s: %s", path, r.Message())
	}
	return nil
}

// Expiry is a contact value's expiration_time; false when the value is not
// a contact with one.
func Expiry(value string) (time.Time, bool) {
	if !strings.Contains(value, `"expiration_time"`) {
		return time.Time{}, false
	}
	var c struct {
		Expiration string `json:"expiration_time"`
	}
	if json.Unmarshal([]byte(value), &c) != nil {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(c.Expiration, 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// each runs f for every item, at most parallel at a time (one AMI
// connection answers many actions at once), and returns the first error.
func each[T any](ctx context.Context, items []T, parallel int, f func(context.Context, T) error) error {
	if parallel < 1 {
		parallel = 1
	}
	if len(items) == 1 {
		// The usual case, one registration: no goroutine to hand it to.
		if err := f(ctx, items[0]); err != nil {
			return err
		}
		return ctx.Err()
	}
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, parallel)
	for _, it := range items {
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed || ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(ctx, it); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// Lookup reads the keys with DBGet, parallel at a time: the value of each
// one found, none for one Asterisk does not have.
func Lookup(ctx context.Context, a Actioner, keys []string, parallel int) (map[string]string, error) {
	out := make(map[string]string, len(keys))
	var mu sync.Mutex
	err := each(ctx, keys, parallel, func(ctx context.Context, k string) error {
		v, found, err := Get(ctx, a, k)
		if err != nil || !found {
			return err
		}
		mu.Lock()
		out[k] = v
		mu.Unlock()
		return nil
	})
	return out, err
}

// ApplyChanges makes the changes of one delta on a standby: DBPut each new
// value, DBDel each deletion, parallel at a time (its keys are distinct,
// so their order does not matter).
func ApplyChanges(ctx context.Context, a Actioner, changes []events.AstDBChange, parallel int) (put, deleted int64, err error) {
	var mu sync.Mutex
	err = each(ctx, changes, parallel, func(ctx context.Context, c events.AstDBChange) error {
		var err error
		if c.Deleted {
			err = Del(ctx, a, c.Key)
		} else {
			err = Put(ctx, a, c.Key, c.Value)
		}
		if err == nil {
			mu.Lock()
			if c.Deleted {
				deleted++
			} else {
				put++
			}
			mu.Unlock()
		}
		return err
	})
	return put, deleted, err
}
