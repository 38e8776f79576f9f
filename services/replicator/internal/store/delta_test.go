package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

// TestManifestReplacedWhileRead: a manifest the holder replaces between
// a reader's look at its metadata and its chunks reads as
// ErrManifestReplaced (read it again), not as a fault; the next read gets
// the new one.
func TestManifestReplacedWhileRead(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	manifest := func(gen uint64) *fstree.Manifest {
		// Random hashes do not compress: several chunks.
		es := make([]fstree.Entry, 6000)
		for i := range es {
			h := make([]byte, 32)
			_, _ = rand.Read(h)
			es[i] = fstree.Entry{Path: fmt.Sprintf("d/%05d.wav", i), Kind: fstree.KindFile, Size: 1, Hash: hex.EncodeToString(h)}
		}
		return &fstree.Manifest{Cluster: "lab", Group: "pbx", Tree: "voicemail", Node: "n1", Epoch: 1, Generation: gen,
			AsOf: gen, Digest: fstree.Digest(es), Entries: es}
	}
	if err := s.PutManifest(ctx, manifest(1)); err != nil {
		t.Fatal(err)
	}
	name := events.ReplManifestName("lab", "pbx", "voicemail", "n1")
	afterManifestInfo = func(string) {
		afterManifestInfo = nil
		if err := s.PutManifest(ctx, manifest(2)); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { afterManifestInfo = nil })
	if _, err := s.GetManifest(ctx, name); !errors.Is(err, ErrManifestReplaced) {
		t.Fatalf("read while replaced: %v, want ErrManifestReplaced", err)
	}
	m, err := s.GetManifest(ctx, name)
	if err != nil || m.Generation != 2 {
		t.Fatalf("read again: generation %v, %v", m, err)
	}
	h, ok, err := s.ManifestHead(ctx, name)
	if err != nil || !ok || h.Generation != 2 || h.AsOf != 2 || h.Node != "n1" {
		t.Fatalf("head %+v %v %v", h, ok, err)
	}
}
