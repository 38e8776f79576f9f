package replicate_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/store"
)

// TestSourceAlone drives only the source half: n1 holds and publishes;
// the test plays the target through the contract alone (it reads the
// manifest and sends confirmations). A confirmation of the latest manifest
// earns CaughtUp; one carrying an error does not.
func TestSourceAlone(t *testing.T) {
	l := newLab(t)
	n1 := newNode(t, "n1")
	write(t, n1.root, "default/1000/INBOX/msg0000.wav", random(10<<10))
	write(t, n1.root, "default/1000/INBOX/msg0000.txt", []byte("callerid=1\n"))
	st := l.holderStore()
	n2 := bustest.Connect(t, l.srv, bus.Identity{Cluster: cluster, Service: "replicator", Node: "n2"})
	mark := l.mark()
	l.start(n1)
	l.setHolder("n1", 1)

	var m *fstree.Manifest
	waittest.Succeeds(l.t, l.patience(10*time.Second), "n1 publishes its manifest", func() error {
		var err error
		m, err = st.GetManifest(l.ctx, events.ReplManifestName(cluster, group, "voicemail", "n1"))
		if errors.Is(err, store.ErrNoManifest) {
			return err
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
	ex, _ := fstree.NewExcluder([]string{"tmp/"})
	scan, err := (&fstree.Scanner{Root: n1.root, Exclude: ex}).Scan(l.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Epoch != 1 || m.Node != "n1" || m.Digest != fstree.Digest(scan.Entries) {
		t.Fatalf("manifest %d/%s/%s is not the tree as scanned", m.Epoch, m.Node, m.Digest)
	}
	for _, e := range m.Entries {
		if e.Kind != fstree.KindFile {
			continue
		}
		rc, err := st.Get(l.ctx, e.Hash)
		if err != nil {
			t.Fatalf("%s published before its content was stored: %v", e.Path, err)
		}
		rc.Close()
	}

	confirm := func(errText string) {
		a := events.ReplicationApplied{Node: "n2", Source: "n1", Group: group, Tree: "voicemail", Epoch: 1,
			Generation: m.Generation, Digest: m.Digest, Files: 2, Error: errText}
		if _, err := n2.Emit(l.ctx, a, events.WithEpoch(1)); err != nil {
			t.Fatal(err)
		}
	}
	status := func(from int, caught bool, errText string) int {
		var at int
		waittest.Succeeds(l.t, l.patience(10*time.Second), fmt.Sprintf("a status with caught up %v", caught), func() error {
			_, _, i := l.find(from, func(env events.Envelope, p events.Payload) bool {
				s, ok := p.(*events.ReplicationStatus)
				return ok && s.Node == "n1" && s.Peer == "n2" && s.Generation == m.Generation &&
					s.CaughtUp == caught && s.Error == errText && env.Epoch == 1
			})
			if i < 0 {
				return fmt.Errorf("none yet")
			}
			at = i
			return nil
		})
		return at
	}
	confirm("apply: disk full")
	i := status(mark, false, "apply: disk full")
	confirm("")
	status(i+1, true, "")
}
