// Package store keeps the replicator's data on JetStream: file contents in
// an object store named by their SHA-256 (so content already there is never
// sent again, whichever node or tree it came from), and each source's
// manifests in a second object store that targets watch.
package store

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

const blobPrefix = "sha256-"

// The object store's layout (ADR-20), written and read here directly for
// speed; jetstream's own ObjectStore reads what this writes and vice versa.
const (
	chunkSize     = 128 << 10
	chunkSubjTmpl = "$O.%s.C.%s"
	metaSubjTmpl  = "$O.%s.M.%s"
	// requestTimeout bounds each read request, so a lost reply fails the
	// pass (which is retried) instead of hanging it.
	requestTimeout = 30 * time.Second
	// putWindow chunks of one upload may wait for their acks at once.
	putWindow = 16
)

// Store is the replicator's view of its two buckets.
type Store struct {
	blobs, manifests jetstream.ObjectStore
	js               jetstream.JetStream
	api              string // the JetStream API prefix js uses
	// The buckets' streams, read directly (see objectReader).
	blobStream, manifestStream jetstream.Stream

	mu    sync.Mutex
	known map[string]bool // blobs seen in the bucket or put by this process
	// absent are blobs a Lookup did not find: their Put need not ask again.
	absent map[string]bool
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
	s := &Store{blobs: blobs, manifests: manifests, js: js, api: apiPrefix(js), known: map[string]bool{}, absent: map[string]bool{}}
	if s.blobStream, err = js.Stream(ctx, events.ObjectStreamName(events.ReplBlobBucket)); err != nil {
		return nil, fmt.Errorf("object store %s: %w", events.ReplBlobBucket, err)
	}
	if s.manifestStream, err = js.Stream(ctx, events.ObjectStreamName(events.ReplManifestBucket)); err != nil {
		return nil, fmt.Errorf("object store %s: %w", events.ReplManifestBucket, err)
	}
	return s, nil
}

// Wait opens the buckets at the replicator's start as Open does, retrying
// with backoff until it succeeds or ctx ends: a cluster electing a leader,
// a server still starting, or buckets that provisioning has not made yet
// (a bus with permissions gives the replicator no right to create them)
// pass, and a replicator that exited on the first of these would need its
// supervisor to start it again. Each failed try is logged once, with the
// wait before the next.
func Wait(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger) (*Store, error) {
	backoff := waitFirstBackoff
	for {
		attempt, cancel := context.WithTimeout(ctx, waitAttempt)
		s, err := Open(attempt, js, replicas)
		cancel()
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("open object stores: %w (last error: %w)", ctx.Err(), err)
		}
		log.Warn("open object stores failed, retrying", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("open object stores: %w (last error: %w)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, waitMaxBackoff)
	}
}

// The bounds of Wait's tries, as the bus's own start-up retries use.
var (
	waitFirstBackoff = 100 * time.Millisecond
	waitMaxBackoff   = 2 * time.Second
	waitAttempt      = 5 * time.Second
)

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

// Put stores r's content under hash unless it is already stored. It hashes
// what it sends and publishes the object's metadata (which makes it
// visible) only when that matches the name, so a blob's name always
// matches its bytes.
//
// It writes the object store's layout itself rather than calling
// ObjectStore.Put: that one opens a reply subscription and looks the name
// up again for every object, and waits for each upload's acks in turn; here
// the chunks of every upload share the connection's async publisher and
// only the metadata waits for them. Profiled on 10,000 files, that was most
// of the source's upload time.
func (s *Store) Put(ctx context.Context, hash string, r io.Reader) (stored bool, err error) {
	s.mu.Lock()
	known, looked := s.known[hash], s.absent[hash]
	delete(s.absent, hash)
	s.mu.Unlock()
	if known {
		return false, nil
	}
	name := blobPrefix + hash
	if !looked {
		old, err := info(ctx, s.blobStream, events.ReplBlobBucket, name)
		switch {
		case err == nil && !old.Deleted:
			s.markKnown(hash)
			return false, nil
		case err != nil && !errors.Is(err, jetstream.ErrObjectNotFound):
			return false, fmt.Errorf("put %s: %w", name, err)
		}
	}
	id := nuid.Next()
	chunkSubj := fmt.Sprintf(chunkSubjTmpl, events.ReplBlobBucket, id)
	purge := func() {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = s.blobStream.Purge(pctx, jetstream.WithPurgeSubject(chunkSubj))
	}
	var pending []jetstream.PubAckFuture
	wait := func(keep int) error {
		for len(pending) > keep {
			timeout := time.NewTimer(requestTimeout)
			select {
			case <-pending[0].Ok():
			case err := <-pending[0].Err():
				timeout.Stop()
				return err
			case <-ctx.Done():
				timeout.Stop()
				return ctx.Err()
			case <-timeout.C:
				return fmt.Errorf("no ack within %v", requestTimeout)
			}
			timeout.Stop()
			pending = pending[1:]
		}
		return nil
	}
	h := sha256.New()
	// A chunk's buffer is reused once its ack is in (until then the
	// publisher may send it again), so an upload holds putWindow+1 of them;
	// a small file needs only a small one.
	bufSize := chunkSize
	if sz, ok := r.(interface{ Stat() (os.FileInfo, error) }); ok {
		if fi, err := sz.Stat(); err == nil && fi.Size() < int64(chunkSize) {
			bufSize = int(fi.Size()) + 1
		}
	}
	ring := make([][]byte, putWindow+1)
	var size uint64
	var chunks uint32
	for {
		buf := ring[chunks%uint32(len(ring))]
		if buf == nil {
			buf = make([]byte, bufSize)
			ring[chunks%uint32(len(ring))] = buf
		}
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			h.Write(buf[:n])
			m := nats.NewMsg(chunkSubj)
			m.Data = buf[:n]
			f, err := s.js.PublishMsgAsync(m)
			if err == nil {
				pending = append(pending, f)
				err = wait(putWindow)
			}
			if err != nil {
				purge()
				return false, fmt.Errorf("put %s: %w", name, err)
			}
			size += uint64(n)
			chunks++
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			purge()
			return false, fmt.Errorf("put %s: read: %w", name, rerr)
		}
	}
	if err := wait(0); err != nil {
		purge()
		return false, fmt.Errorf("put %s: %w", name, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != hash {
		purge()
		return false, fmt.Errorf("put %s: %w", name, ErrChanged)
	}
	info := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunkSize}},
		Bucket:     events.ReplBlobBucket, NUID: id, Size: size, Chunks: chunks, Digest: digestOf(hash),
	}
	mm := nats.NewMsg(fmt.Sprintf(metaSubjTmpl, events.ReplBlobBucket, base64.URLEncoding.EncodeToString([]byte(name))))
	mm.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	if mm.Data, err = json.Marshal(info); err != nil {
		purge()
		return false, fmt.Errorf("put %s: %w", name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, requestTimeout)
	_, err = s.js.PublishMsg(pctx, mm)
	cancel()
	if err != nil {
		purge()
		return false, fmt.Errorf("put %s: metadata: %w", name, err)
	}
	s.markKnown(hash)
	return true, nil
}

// info reads an object's metadata with a direct get (no JSON API call).
func info(ctx context.Context, stream jetstream.Stream, bucket, name string) (*jetstream.ObjectInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	m, err := stream.GetLastMsgForSubject(ctx, fmt.Sprintf(metaSubjTmpl, bucket, base64.URLEncoding.EncodeToString([]byte(name))))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, jetstream.ErrObjectNotFound
	}
	if err != nil {
		return nil, err
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(m.Data, &info); err != nil {
		return nil, fmt.Errorf("%s: %w", name, jetstream.ErrBadObjectMeta)
	}
	return &info, nil
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
// the bucket does not hold it. The content is read with direct gets, chunk
// by chunk, not through ObjectStore.Get: that one creates (and deletes) an
// ordered consumer per object, which was most of the cost of fetching
// 10,000 small files, and hashes every byte once more. The digest is not
// checked here: the caller checks the content's SHA-256 against its name
// (fstree.Apply does, before a byte becomes visible).
func (s *Store) Get(ctx context.Context, hash string) (io.ReadCloser, error) {
	r, err := s.openObject(ctx, s.blobStream, events.ReplBlobBucket, blobPrefix+hash)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("get %s: %w", hash, fstree.ErrMissingContent)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", hash, err)
	}
	return r, nil
}

// openObject reads an object of bucket (whose stream is stream) with direct
// gets. Every request has a deadline: ObjectStore.Get waits forever for the
// chunks of an object that was replaced (its chunks purged) between reading
// its metadata and subscribing, which hung a target on a manifest being
// republished. Here the missing chunk is an error, and the pass is retried.
func (s *Store) openObject(ctx context.Context, stream jetstream.Stream, bucket, name string) (*chunkReader, error) {
	in, err := info(ctx, stream, bucket, name)
	if err == nil && in.Deleted {
		err = jetstream.ErrObjectNotFound
	}
	if err != nil {
		return nil, err
	}
	return s.reader(ctx, events.ObjectStreamName(bucket), bucket, name, in)
}

// reader reads the object whose metadata is in.
func (s *Store) reader(ctx context.Context, stream, bucket, name string, in *jetstream.ObjectInfo) (*chunkReader, error) {
	if in.Opts != nil && in.Opts.Link != nil {
		return nil, fmt.Errorf("%s: a link, which this store never writes: %w", name, jetstream.ErrBadObjectMeta)
	}
	return &chunkReader{ctx: ctx, s: s, stream: stream, name: name, subj: fmt.Sprintf(chunkSubjTmpl, bucket, in.NUID),
		left: in.Chunks, size: in.Size}, nil
}

// chunkReader reads an object's chunks in order, a batch of them per
// request (nextChunks).
type chunkReader struct {
	ctx       context.Context
	s         *Store
	stream    string
	name      string
	subj      string
	next      uint64 // stream sequence to look from
	left      uint32 // chunks not yet asked for
	size, got uint64
	queue     [][]byte // chunks received, not yet read
	buf       []byte
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		if len(c.queue) == 0 {
			if c.left == 0 {
				if c.got != c.size {
					return 0, fmt.Errorf("%s: %d bytes, metadata says %d", c.name, c.got, c.size)
				}
				return 0, io.EOF
			}
			if err := c.nextChunks(); err != nil {
				return 0, err
			}
		}
		c.buf, c.queue = c.queue[0], c.queue[1:]
		c.got += uint64(len(c.buf))
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *chunkReader) Close() error { return nil }

// PutManifest publishes a manifest, gzipped JSON: a 10,000-file tree's
// manifest is about 2 MB raw and a fifth of that compressed.
func (s *Store) PutManifest(ctx context.Context, m *fstree.Manifest) error {
	return s.putManifest(ctx, events.ReplManifestName(m.Cluster, m.Group, m.Tree, m.Node), m)
}

func (s *Store) putManifest(ctx context.Context, name string, m *fstree.Manifest) error {
	b, err := fstree.EncodeManifest(m)
	if err != nil {
		return err
	}
	return s.putManifestMeta(ctx, name, m, b)
}

// progressSuffix marks a progress manifest: a source publishes one now and
// then during a long upload, listing only what is already stored, so
// targets can start fetching before the pass ends. It is named after the
// manifest with a suffix so that a replicator that does not know progress
// manifests reads its name as its tree's and just re-reads the (unchanged)
// full manifest; it must never take one for a full manifest, which would
// delete whatever is not stored yet.
const progressSuffix = ".progress"

// ProgressName names a source's progress manifest of a tree.
func ProgressName(cluster, group, tree, node string) string {
	return events.ReplManifestName(cluster, group, tree, node) + progressSuffix
}

// IsProgress says whether a manifest object's name is a progress manifest's.
func IsProgress(name string) bool { return strings.HasSuffix(name, progressSuffix) }

// PutProgress publishes a progress manifest (m lists part of the tree).
func (s *Store) PutProgress(ctx context.Context, m *fstree.Manifest) error {
	return s.putManifest(ctx, ProgressName(m.Cluster, m.Group, m.Tree, m.Node), m)
}

// DeleteProgress removes a source's progress manifest once its full
// manifest is out.
func (s *Store) DeleteProgress(ctx context.Context, cluster, group, tree, node string) error {
	err := s.manifests.Delete(ctx, ProgressName(cluster, group, tree, node))
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("delete progress manifest: %w", err)
	}
	return nil
}

// ErrNoManifest means the named manifest does not exist (yet).
var ErrNoManifest = errors.New("no manifest")

// GetManifest reads a manifest and checks it (fstree.DecodeManifest: size,
// entries, digest).
func (s *Store) GetManifest(ctx context.Context, name string) (*fstree.Manifest, error) {
	b, err := s.readManifestObject(ctx, name)
	if err != nil {
		return nil, err
	}
	m, err := fstree.DecodeManifest(b)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", name, err)
	}
	return m, nil
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
		var es []fstree.Entry
		if IsDelta(in.Name) {
			d, err := s.GetDelta(ctx, in.Name)
			if errors.Is(err, ErrNoManifest) || errors.Is(err, ErrManifestReplaced) {
				continue // deleted since the listing: a full manifest holds its contents
			}
			if err != nil {
				return 0, fmt.Errorf("gc: %w", err)
			}
			es = d.Entries
		} else {
			m, err := s.GetManifest(ctx, in.Name)
			if err != nil {
				return 0, fmt.Errorf("gc: %w", err)
			}
			es = m.Entries
		}
		for _, e := range es {
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
