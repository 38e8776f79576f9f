// Package store keeps the replicator's data on JetStream: file contents in
// an object store named by their SHA-256 (so content already there is never
// sent again, whichever node or tree it came from), and each source's
// manifests in a second object store that targets watch.
package store

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go/jetstream"
)

const blobPrefix = "sha256-"

// Store is the replicator's view of its two buckets.
type Store struct {
	blobs, manifests jetstream.ObjectStore

	mu    sync.Mutex
	known map[string]bool // blobs seen in the bucket or put by this process
}

// Open creates the buckets when they are missing and never changes an
// existing one: two replicators with different settings must not
// reconfigure each other on every start (as bus.Provision does for streams).
func Open(ctx context.Context, js jetstream.JetStream, replicas int) (*Store, error) {
	if replicas <= 0 {
		replicas = 1
	}
	blobs, err := ensure(ctx, js, jetstream.ObjectStoreConfig{
		Bucket:      events.ReplBlobBucket,
		Description: "fan replicator: file contents by SHA-256",
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, err
	}
	manifests, err := ensure(ctx, js, jetstream.ObjectStoreConfig{
		Bucket:      events.ReplManifestBucket,
		Description: "fan replicator: each holder's manifest of each tree",
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, err
	}
	s := &Store{blobs: blobs, manifests: manifests, known: map[string]bool{}}
	return s, nil
}

func ensure(ctx context.Context, js jetstream.JetStream, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	os, err := js.ObjectStore(ctx, cfg.Bucket)
	if err == nil {
		return os, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("object store %s: %w", cfg.Bucket, err)
	}
	os, err = js.CreateObjectStore(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Another replicator created it between our look and our create.
		os, err = js.ObjectStore(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("create object store %s: %w", cfg.Bucket, err)
	}
	return os, nil
}

// LoadIndex learns which contents the bucket already holds, in one listing,
// so a source does not ask once per file.
func (s *Store) LoadIndex(ctx context.Context) error {
	infos, err := s.blobs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return fmt.Errorf("list %s: %w", events.ReplBlobBucket, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range infos {
		if h, ok := strings.CutPrefix(in.Name, blobPrefix); ok && !in.Deleted {
			s.known[h] = true
		}
	}
	return nil
}

// Has reports whether the content is known to be stored.
func (s *Store) Has(hash string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known[hash]
}

// Forget drops a hash a target reported missing, so it is sent again.
func (s *Store) Forget(hash string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.known, hash)
}

// ErrChanged means the content read for upload was not the content hashed:
// the file changed in between. Nothing was stored under the hash.
var ErrChanged = errors.New("content changed while uploading")

// Put stores r's content under hash unless it is already stored. It checks
// the digest the server computed, so a blob's name always matches its bytes.
func (s *Store) Put(ctx context.Context, hash string, r io.Reader) (stored bool, err error) {
	if s.Has(hash) {
		return false, nil
	}
	name := blobPrefix + hash
	if in, err := s.blobs.GetInfo(ctx, name); err == nil && !in.Deleted {
		s.markKnown(hash)
		return false, nil
	}
	info, err := s.blobs.Put(ctx, jetstream.ObjectMeta{Name: name}, r)
	if err != nil {
		return false, fmt.Errorf("put %s: %w", name, err)
	}
	if info.Digest != digestOf(hash) {
		_ = s.blobs.Delete(ctx, name)
		return false, fmt.Errorf("put %s: %w", name, ErrChanged)
	}
	s.markKnown(hash)
	return true, nil
}

func (s *Store) markKnown(hash string) {
	s.mu.Lock()
	s.known[hash] = true
	s.mu.Unlock()
}

func digestOf(hexHash string) string {
	b, err := hex.DecodeString(hexHash)
	if err != nil {
		return ""
	}
	return "SHA-256=" + base64.URLEncoding.EncodeToString(b)
}

// Get opens stored content; the error wraps fstree.ErrMissingContent when
// the bucket does not hold it. The object store checks the digest at EOF.
func (s *Store) Get(ctx context.Context, hash string) (io.ReadCloser, error) {
	r, err := s.blobs.Get(ctx, blobPrefix+hash)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("get %s: %w", hash, fstree.ErrMissingContent)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", hash, err)
	}
	return r, nil
}

// PutManifest publishes a manifest, gzipped JSON: a 10,000-file tree's
// manifest is about 2 MB raw and a fifth of that compressed.
func (s *Store) PutManifest(ctx context.Context, m *fstree.Manifest) error {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err := json.NewEncoder(zw).Encode(m); err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	name := events.ReplManifestName(m.Cluster, m.Group, m.Tree, m.Node)
	if _, err := s.manifests.PutBytes(ctx, name, buf.Bytes()); err != nil {
		return fmt.Errorf("put manifest %s: %w", name, err)
	}
	return nil
}

// ErrNoManifest means the named manifest does not exist (yet).
var ErrNoManifest = errors.New("no manifest")

// GetManifest reads a manifest and checks that its digest matches its entries.
func (s *Store) GetManifest(ctx context.Context, name string) (*fstree.Manifest, error) {
	b, err := s.manifests.GetBytes(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%s: %w", name, ErrNoManifest)
	}
	if err != nil {
		return nil, fmt.Errorf("get manifest %s: %w", name, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", name, err)
	}
	var m fstree.Manifest
	if err := json.NewDecoder(zr).Decode(&m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", name, err)
	}
	if d := fstree.Digest(m.Entries); d != m.Digest {
		return nil, fmt.Errorf("manifest %s: digest %s does not match its entries (%s)", name, m.Digest, d)
	}
	return &m, nil
}

// WatchManifests calls fn with the name of every manifest written from now
// on (and, first, of every existing one) until ctx ends.
func (s *Store) WatchManifests(ctx context.Context, fn func(name string)) error {
	w, err := s.manifests.Watch(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("watch manifests: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case in, ok := <-w.Updates():
			if !ok {
				return errors.New("watch manifests: watcher stopped")
			}
			if in != nil {
				fn(in.Name)
			}
		}
	}
}

// GC deletes contents no manifest references and that are older than
// grace (a source uploads contents before publishing the manifest naming
// them). It returns how many it deleted.
func (s *Store) GC(ctx context.Context, grace time.Duration) (int, error) {
	refs := map[string]bool{}
	mans, err := s.manifests.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, fmt.Errorf("gc: list manifests: %w", err)
	}
	for _, in := range mans {
		m, err := s.GetManifest(ctx, in.Name)
		if err != nil {
			return 0, fmt.Errorf("gc: %w", err)
		}
		for _, e := range m.Entries {
			if e.Hash != "" {
				refs[e.Hash] = true
			}
		}
	}
	blobs, err := s.blobs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, fmt.Errorf("gc: list contents: %w", err)
	}
	n := 0
	for _, in := range blobs {
		h, ok := strings.CutPrefix(in.Name, blobPrefix)
		if !ok || refs[h] || time.Since(in.ModTime) < grace {
			continue
		}
		if err := s.blobs.Delete(ctx, in.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return n, fmt.Errorf("gc: delete %s: %w", in.Name, err)
		}
		s.Forget(h)
		n++
	}
	return n, nil
}

// HashOf is the hex SHA-256 of b, as blobs are named.
func HashOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
