package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

// TestPrefetch: contents fetched through a prefetch come back byte for
// byte whatever their size (empty, single-chunk in several batches,
// multi-chunk), including a content listed twice far apart (its batch must
// not hold back the ones after it) and a content listed but never stored
// (missing, as Get says); a hash that was not listed is fetched as Get
// does; and no content stays held after its last fetch.
func TestPrefetch(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var datas [][]byte
	datas = append(datas, nil, random(1), random(3*chunkSize+5))
	// Enough single-chunk contents for several batches (and more batches
	// than the prefetch may hold at once).
	for range 6 * prefetchAhead * (batchBytes / 2 / (chunkSize - 1)) / 4 {
		datas = append(datas, random(chunkSize-1))
	}
	var hashes []string
	for _, d := range datas {
		h := HashOf(d)
		if _, err := s.Put(ctx, h, bytes.NewReader(d)); err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, h)
	}
	missing := HashOf([]byte("never stored"))
	extra := random(100)
	if _, err := s.Put(ctx, HashOf(extra), bytes.NewReader(extra)); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{HashOf(extra): extra}
	for _, d := range datas {
		want[HashOf(d)] = d
	}
	// hashes[3] listed again at the end, far behind its first listing.
	listed := append(append([]string{missing}, hashes...), hashes[3])
	p := s.prefetch(ctx, listed)
	fetch := p.get
	order := append(listed, HashOf(extra)) // not listed: fetched as Get does
	for i, h := range order {
		r, err := fetch(ctx, h)
		if h == missing {
			if !errors.Is(err, fstree.ErrMissingContent) {
				t.Fatalf("missing content: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, want[h]) {
			t.Fatalf("%d (%d bytes): got %d bytes back, %v", i, len(want[h]), len(got), err)
		}
	}
	// Nothing fetched stays held once its last fetch is done.
	p.mu.Lock()
	defer p.mu.Unlock()
	for h, sl := range p.slots {
		if sl.data != nil {
			t.Errorf("content %s still held after its last fetch", h)
		}
	}
}

// TestLookup: one batch look-up marks what the bucket holds as stored and
// what it lacks as not, and a Put after it stores what was lacking.
func TestLookup(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	stored, lacking := random(10), random(chunkSize+1)
	hs, hl := HashOf(stored), HashOf(lacking)
	if _, err := s.Put(ctx, hs, bytes.NewReader(stored)); err != nil {
		t.Fatal(err)
	}
	s.Forget(hs)
	if err := s.Lookup(ctx, []string{hs, hl}); err != nil {
		t.Fatal(err)
	}
	if !s.Has(hs) || s.Has(hl) {
		t.Fatalf("after look-up: has stored %v (want true), has lacking %v (want false)", s.Has(hs), s.Has(hl))
	}
	if ok, err := s.Put(ctx, hl, bytes.NewReader(lacking)); err != nil || !ok {
		t.Fatalf("put after look-up: stored %v, %v", ok, err)
	}
	r, err := s.Get(ctx, hl)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, lacking) {
		t.Fatalf("got %d bytes, %v", len(got), err)
	}
}
