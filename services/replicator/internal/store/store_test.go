package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

func open(t testing.TB) *Store {
	t.Helper()
	srv := bustest.Server(t)
	b := bustest.Connect(t, srv, bus.Identity{Cluster: "lab", Service: "replicator", Node: "n1"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Open(ctx, b.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func random(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// TestPutGet: contents of every size come back byte for byte, through the
// direct reads and through the object store's own reader (so what Put
// writes is a well-formed object), and a stored content is not sent twice.
func TestPutGet(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	for _, n := range []int{0, 1, chunkSize - 1, chunkSize, chunkSize + 1, 8*chunkSize + 7, 3<<20 + 5} {
		data := random(n)
		h := HashOf(data)
		stored, err := s.Put(ctx, h, bytes.NewReader(data))
		if err != nil || !stored {
			t.Fatalf("%d bytes: stored %v, %v", n, stored, err)
		}
		if stored, err := s.Put(ctx, h, bytes.NewReader(data)); err != nil || stored {
			t.Fatalf("%d bytes again: stored %v, %v", n, stored, err)
		}
		s.Forget(h) // known only in the bucket now
		if stored, err := s.Put(ctx, h, bytes.NewReader(data)); err != nil || stored {
			t.Fatalf("%d bytes, index forgotten: stored %v, %v", n, stored, err)
		}
		r, err := s.Get(ctx, h)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: got %d bytes back, %v", n, len(got), err)
		}
		got, err = s.blobs.GetBytes(ctx, blobPrefix+h)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%d bytes through the object store: got %d bytes, %v", n, len(got), err)
		}
		in, err := s.blobs.GetInfo(ctx, blobPrefix+h)
		if err != nil || in.Digest != digestOf(h) || in.Size != uint64(n) {
			t.Fatalf("%d bytes: info %+v, %v", n, in, err)
		}
	}
	// Written by the object store itself, read here.
	data := random(chunkSize*2 + 3)
	h := HashOf(data)
	if _, err := s.blobs.PutBytes(ctx, blobPrefix+h, data); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("object store's own object: %d bytes, %v", len(got), err)
	}
	if _, err := s.Get(ctx, HashOf([]byte("never stored"))); !errors.Is(err, fstree.ErrMissingContent) {
		t.Fatalf("missing content: %v", err)
	}
}

// TestPutRefusesChangedContent: bytes that do not match the name never
// become an object, and leave no chunks behind.
func TestPutRefusesChangedContent(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	data := random(3*chunkSize + 10)
	h := HashOf(data)
	changed := bytes.Clone(data)
	changed[len(changed)-1] ^= 1
	if _, err := s.Put(ctx, h, bytes.NewReader(changed)); !errors.Is(err, ErrChanged) {
		t.Fatalf("err %v, want ErrChanged", err)
	}
	if s.Has(h) {
		t.Fatal("changed content marked as stored")
	}
	if _, err := s.Get(ctx, h); !errors.Is(err, fstree.ErrMissingContent) {
		t.Fatalf("get after refused put: %v", err)
	}
	si, err := s.blobStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if si.State.Msgs != 0 {
		t.Fatalf("%d messages left in %s after a refused put", si.State.Msgs, events.ReplBlobBucket)
	}
}

// BenchmarkStore measures what a sync of a spool's shape costs the store
// alone: many small contents and a few large ones, put then got, with
// the given parallelism.
func BenchmarkStore(b *testing.B) {
	for _, c := range []struct {
		files, size int
	}{{2000, 10 << 10}, {20, 9 << 20}} {
		b.Run(fmt.Sprintf("%dx%dKiB", c.files, c.size>>10), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				s := open(b)
				datas := make([][]byte, c.files)
				for i := range datas {
					datas[i] = random(c.size)
				}
				b.StartTimer()
				t0 := time.Now()
				run(b, 4, len(datas), func(i int) error {
					_, err := s.Put(context.Background(), HashOf(datas[i]), bytes.NewReader(datas[i]))
					return err
				})
				put := time.Since(t0)
				t0 = time.Now()
				run(b, 4, len(datas), func(i int) error {
					r, err := s.Get(context.Background(), HashOf(datas[i]))
					if err != nil {
						return err
					}
					defer r.Close()
					_, err = io.Copy(io.Discard, r)
					return err
				})
				get := time.Since(t0)
				mb := float64(c.files*c.size) / (1 << 20)
				b.ReportMetric(mb/put.Seconds(), "put_MiB/s")
				b.ReportMetric(mb/get.Seconds(), "get_MiB/s")
				b.ReportMetric(float64(c.files)/put.Seconds(), "put_files/s")
				b.ReportMetric(float64(c.files)/get.Seconds(), "get_files/s")
			}
		})
	}
}

func run(b *testing.B, workers, n int, fn func(i int) error) {
	ch := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				if err := fn(i); err != nil {
					b.Error(err)
				}
			}
		}()
	}
	for i := range n {
		ch <- i
	}
	close(ch)
	wg.Wait()
}
