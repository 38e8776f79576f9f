package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrManifestReplaced means a manifest (or delta) was replaced or deleted
// while it was being read: its chunks went with the old version. It is
// no fault: read it again.
var ErrManifestReplaced = errors.New("store: manifest replaced while read")

// deltaInfix names a source's deltas of a tree after its manifest, so a
// replicator that does not know deltas reads the name as its tree's and
// just re-reads the (unchanged) full manifest.
const deltaInfix = ".delta."

// DeltaName names the delta seq of a source's tree.
func DeltaName(cluster, group, tree, node string, seq uint64) string {
	return events.ReplManifestName(cluster, group, tree, node) + deltaInfix + strconv.FormatUint(seq, 10)
}

// IsDelta says whether a manifest object's name is a delta's.
func IsDelta(name string) bool { return strings.Contains(name, deltaInfix) }

// PutDelta publishes a delta under DeltaName.
func (s *Store) PutDelta(ctx context.Context, d *fstree.Delta) error {
	b, err := fstree.EncodeDelta(d)
	if err != nil {
		return err
	}
	name := DeltaName(d.Cluster, d.Group, d.Tree, d.Node, d.Seq)
	if _, err := s.manifests.PutBytes(ctx, name, b); err != nil {
		return fmt.Errorf("put delta %s: %w", name, err)
	}
	return nil
}

// GetDelta reads and checks a delta (fstree.DecodeDelta).
func (s *Store) GetDelta(ctx context.Context, name string) (*fstree.Delta, error) {
	b, err := s.readManifestObject(ctx, name)
	if err != nil {
		return nil, err
	}
	d, err := fstree.DecodeDelta(b)
	if err != nil {
		return nil, fmt.Errorf("delta %s: %w", name, err)
	}
	return d, nil
}

// afterManifestInfo, when set by a test, runs between reading a manifest's
// metadata and its chunks: the moment its holder may replace it.
var afterManifestInfo func(name string)

// readManifestObject reads an object of the manifest bucket whole.
func (s *Store) readManifestObject(ctx context.Context, name string) ([]byte, error) {
	r, err := s.openObject(ctx, s.manifestStream, events.ReplManifestBucket, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%s: %w", name, ErrNoManifest)
	}
	if err != nil {
		return nil, fmt.Errorf("get manifest %s: %w", name, err)
	}
	if afterManifestInfo != nil {
		afterManifestInfo(name)
	}
	// Compressed, it is a fraction of its decompressed bound.
	b, err := io.ReadAll(io.LimitReader(r, fstree.MaxManifestBytes+1))
	if errors.Is(err, fstree.ErrMissingContent) {
		return nil, fmt.Errorf("get manifest %s: %w", name, ErrManifestReplaced)
	}
	if err != nil {
		return nil, fmt.Errorf("get manifest %s: %w", name, err)
	}
	if len(b) > fstree.MaxManifestBytes {
		return nil, fmt.Errorf("manifest %s: more than %d bytes", name, fstree.MaxManifestBytes)
	}
	return b, nil
}

// Head is what a full manifest's object metadata says of it, read without
// reading the manifest: enough for a target that follows the source's
// deltas to tell whether the manifest holds anything it lacks. It is a
// hint only: whatever is applied is read and checked whole.
type Head struct {
	Generation, Epoch, AsOf uint64
	Node                    string
}

// ManifestHead reads the head of the manifest name; ok is false when the
// object carries none (a release without deltas wrote it).
func (s *Store) ManifestHead(ctx context.Context, name string) (h Head, ok bool, err error) {
	in, err := info(ctx, s.manifestStream, events.ReplManifestBucket, name)
	if err == nil && in.Deleted {
		err = jetstream.ErrObjectNotFound
	}
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return Head{}, false, fmt.Errorf("%s: %w", name, ErrNoManifest)
	}
	if err != nil {
		return Head{}, false, fmt.Errorf("manifest head %s: %w", name, err)
	}
	md := in.Metadata
	g, err1 := strconv.ParseUint(md["fan-generation"], 10, 64)
	e, err2 := strconv.ParseUint(md["fan-epoch"], 10, 64)
	a, err3 := strconv.ParseUint(md["fan-as-of"], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return Head{}, false, nil
	}
	return Head{Generation: g, Epoch: e, AsOf: a, Node: md["fan-node"]}, true, nil
}

// putManifestMeta stores b under name with m's head in its metadata.
func (s *Store) putManifestMeta(ctx context.Context, name string, m *fstree.Manifest, b []byte) error {
	meta := jetstream.ObjectMeta{Name: name, Metadata: map[string]string{
		"fan-generation": strconv.FormatUint(m.Generation, 10),
		"fan-epoch":      strconv.FormatUint(m.Epoch, 10),
		"fan-as-of":      strconv.FormatUint(m.AsOf, 10),
		"fan-node":       m.Node,
	}}
	if _, err := s.manifests.Put(ctx, meta, bytes.NewReader(b)); err != nil {
		return fmt.Errorf("put manifest %s: %w", name, err)
	}
	return nil
}

// DeleteDeltas removes a source's deltas of a tree numbered at most upTo
// (a full manifest that includes them is out) and returns how many.
func (s *Store) DeleteDeltas(ctx context.Context, cluster, group, tree, node string, upTo uint64) (int, error) {
	prefix := events.ReplManifestName(cluster, group, tree, node) + deltaInfix
	list, err := s.manifests.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list deltas: %w", err)
	}
	n := 0
	for _, in := range list {
		rest, ok := strings.CutPrefix(in.Name, prefix)
		if !ok {
			continue
		}
		seq, err := strconv.ParseUint(rest, 10, 64)
		if err != nil || seq > upTo {
			continue
		}
		if err := s.manifests.Delete(ctx, in.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return n, fmt.Errorf("delete delta %s: %w", in.Name, err)
		}
		n++
	}
	return n, nil
}
