package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const sampleContact = `{"via_addr":"127.0.0.1","qualify_timeout":"3.000000","qualify_2xx_only":"false","call_id":"c2@x",` +
	`"reg_server":"pbx","prune_on_boot":"no","path":"","endpoint":"6001","via_port":"5370","authenticate_qualify":"no",` +
	`"uri":"sip:6001@127.0.0.1:5370","qualify_frequency":"0","user_agent":"obsphone","expiration_time":"1796660576","outbound_proxy":""}`

func init() {
	addSamples(map[Type]Payload{
		TypeReplicationHeld: ReplicationHeld{Node: "n2", Source: "n1", Group: "pbx", Tree: "astdb", Held: 1500, TargetKeys: 2000,
			MaxShare: 0.1, Until: goldenTime.Add(5 * time.Minute),
			Keys:    []string{"registrar/contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f"},
			Message: "n1's manifest lacks 1500 of 2000 keys that Asterisk did not report gone and that have not expired; held back until n1 has them again, reports them gone or they expire"},
	})
}

func sampleDelta() AstDBDelta {
	return AstDBDelta{Node: "n1", Group: "pbx", Tree: "astdb", Epoch: 7, Seq: 1796660276920447000, Prev: 1796660276001000000,
		Cause: AstDBReported, At: goldenTime, Changes: []AstDBChange{
			{Key: "registrar/contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f", Value: sampleContact},
			{Key: "registrar/contact/6002;@287f2e0058caf86d4883ce9606d1b673", Deleted: true},
		}}
}

// TestAstDBGolden pins the wire form of the core NATS messages between
// replicators (they travel in no envelope); -update rewrites the files.
func TestAstDBGolden(t *testing.T) {
	for name, v := range map[string]interface{ Encode() ([]byte, error) }{
		"astdb.delta":  sampleDelta(),
		"astdb.resync": AstDBResync{Node: "n2", Group: "pbx", Tree: "astdb", After: 1796660276001000000},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := v.Encode()
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := json.Indent(&out, b, "", "  "); err != nil {
				t.Fatal(err)
			}
			out.WriteByte('\n')
			path := filepath.Join("testdata", name+".golden.json")
			if *update {
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run go test -update): %v", err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("wire form of %s changed:\n got: %s\nwant: %s", name, out.Bytes(), want)
			}
		})
	}
	d, err := DecodeAstDBDelta(mustRead(t, "astdb.delta"))
	if err != nil || d.Seq != sampleDelta().Seq || len(d.Changes) != 2 || !d.Changes[1].Deleted {
		t.Fatalf("delta round trip: %+v %v", d, err)
	}
	if r, err := DecodeAstDBResync(mustRead(t, "astdb.resync")); err != nil || r.Node != "n2" {
		t.Fatalf("resync round trip: %+v %v", r, err)
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A delta's keys and values go into AMI actions on the standby: nothing in
// them may end the action early, and only a change Asterisk reported may
// delete.
func TestAstDBDeltaRefused(t *testing.T) {
	if err := sampleDelta().Validate(); err != nil {
		t.Fatalf("good delta refused: %v", err)
	}
	cases := map[string]func(d *AstDBDelta){
		"no node":                 func(d *AstDBDelta) { d.Node = "" },
		"wildcard tree":           func(d *AstDBDelta) { d.Tree = "*" },
		"no epoch":                func(d *AstDBDelta) { d.Epoch = 0 },
		"prev not below seq":      func(d *AstDBDelta) { d.Prev = d.Seq },
		"unknown cause":           func(d *AstDBDelta) { d.Cause = "guess" },
		"no changes":              func(d *AstDBDelta) { d.Changes = nil },
		"key without family":      func(d *AstDBDelta) { d.Changes[0].Key = "contact" },
		"key with a line break":   func(d *AstDBDelta) { d.Changes[0].Key = "registrar/x\r\nAction: DBDelTree" },
		"value with a line break": func(d *AstDBDelta) { d.Changes[0].Value = "v\r\nAction: Originate" },
		"value with a NUL":        func(d *AstDBDelta) { d.Changes[0].Value = "v\x00" },
		"huge value":              func(d *AstDBDelta) { d.Changes[0].Value = strings.Repeat("v", MaxAstDBValue+1) },
		"key twice":               func(d *AstDBDelta) { d.Changes[1] = d.Changes[0] },
		"deletion with a value":   func(d *AstDBDelta) { d.Changes[1].Value = "x" },
		"unreported deletion":     func(d *AstDBDelta) { d.Cause = AstDBReconciled },
		"too many changes": func(d *AstDBDelta) {
			for i := range MaxAstDBChanges {
				d.Changes = append(d.Changes, AstDBChange{Key: "registrar/k" + strings.Repeat("x", i%50) + string(rune('a'+i%26)) + string(rune('a'+i/26%26)), Value: "v"})
			}
		},
	}
	for name, mutate := range cases {
		d := sampleDelta()
		d.Changes = append([]AstDBChange(nil), d.Changes...)
		mutate(&d)
		err := d.Validate()
		if !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) {
			t.Errorf("%s: want a refusal, got %v", name, err)
		}
		if b, merr := json.Marshal(d); merr == nil && len(b) <= MaxAstDBDelta {
			if _, err := DecodeAstDBDelta(b); err == nil {
				t.Errorf("%s: decoded", name)
			}
		}
	}
	big := []byte(`{"pad":"` + strings.Repeat("x", MaxAstDBDelta) + `"}`)
	if _, err := DecodeAstDBDelta(big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized: want ErrTooLarge, got %v", err)
	}
	if err := VerifyAstDBDelta("c1", AstDBDeltaSubject("c1", "n2"), sampleDelta()); !errors.Is(err, ErrSubjectMismatch) {
		t.Errorf("n1's delta on n2's subject: want ErrSubjectMismatch, got %v", err)
	}
	if err := VerifyAstDBDelta("c1", AstDBDeltaSubject("c1", "n1"), sampleDelta()); err != nil {
		t.Errorf("on its own subject: %v", err)
	}
}

// Only a node's own replicator publishes its deltas, and only replicators
// hear them (they carry where every phone is).
func TestAstDBPermissions(t *testing.T) {
	perms := permIdentities(t)
	for key, p := range perms {
		role := roleOf(key)
		own := strings.TrimPrefix(key, string(role)+"@")
		for _, n := range []string{"n1", "n2"} {
			want := role == RoleReplicator && n == own
			if got := p.Publish.Allows(AstDBDeltaSubject("c1", n)); got != want {
				t.Errorf("%s publishes %s: %v, want %v", key, AstDBDeltaSubject("c1", n), got, want)
			}
			if got, want := p.Publish.Allows(AstDBResyncSubject("c1", n)), role == RoleReplicator; got != want {
				t.Errorf("%s asks %s for a reconcile: %v, want %v", key, n, got, want)
			}
		}
		if got, want := p.Subscribe.Allows(AstDBDeltaSubject("c1", "n1")), role == RoleReplicator; got != want {
			t.Errorf("%s hears deltas: %v, want %v", key, got, want)
		}
		if role == RoleReplicator {
			if !p.Subscribe.Allows(AstDBResyncSubject("c1", own)) || p.Subscribe.Allows(AstDBResyncSubject("c1", "n9")) {
				t.Errorf("%s must take reconcile requests on its own subject only", key)
			}
		}
	}
}
