package fstree

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// realManifest scans a small voicemail-like tree and encodes its manifest
// the way a source publishes it.
func realManifest(t testing.TB) []byte {
	root := t.TempDir()
	for rel, data := range map[string]string{
		"default/1000/INBOX/msg0000.txt":  "[message]\ncallerid=\"Alice\" <1001>\nduration=4\n",
		"default/1000/INBOX/msg0000.wav":  "RIFF....WAVEfmt ",
		"default/1000/greet/greet.wav":    "RIFF",
		"default/1001/Old/msg0000.txt":    "[message]\n",
		"extensions.conf":                 "[default]\nexten => 1000,1,VoiceMail(1000)\n",
		"pjsip.d/endpoints/1000.conf":     "[1000]\ntype=endpoint\n",
		"default/1000/INBOX/.lock-1234":   "",
		"default/1000/INBOX/msg0001.WAV":  "RIFF",
		"default/1000/INBOX/msg0001.gsm":  "gsm",
		"default/1000/INBOX/msg0001.txt":  "[message]\n",
		"default/1002/INBOX/tmp/partial":  "x",
		"default/1002/INBOX/Urgent/x.txt": "u",
	} {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../1000", filepath.Join(root, "default/alias")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "default/1001"), 0o2770); err != nil {
		t.Fatal(err)
	}
	ex, _ := NewExcluder([]string{"tmp/"})
	r, err := (&Scanner{Root: root, Exclude: ex}).Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Cluster: "lab", Group: "pbx", Tree: "voicemail", Node: "n1", Epoch: 3, Generation: 42,
		Created: time.Now(), Changed: time.Now(), Digest: Digest(r.Entries), Entries: r.Entries}
	b, err := EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fuzzLimit bounds what the fuzz target decompresses.
const fuzzLimit = 1 << 20

func gunzip(b []byte) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	var out bytes.Buffer
	_, _ = out.ReadFrom(io.LimitReader(zr, fuzzLimit))
	return out.Bytes()
}

// FuzzDecodeManifest feeds the manifest decoder (a target's first contact
// with what a holder, or whoever can write the manifest bucket, sends).
// Input that is not gzipped is gzipped first, so the fuzzer works on the
// JSON too. It must never panic, and what it accepts must survive a round
// trip and pass its own checks; Validate must never let a path out.
func FuzzDecodeManifest(f *testing.F) {
	real := realManifest(f)
	f.Add(real)
	f.Add(gunzip(real))
	f.Add([]byte(`{"entries":[{"p":"x","k":"l","l":"/outside"},{"p":"x/pwned","k":"f","m":2541,"h":"` +
		"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" + `"}]}`))
	f.Add([]byte(`{"entries":[{"p":"registrar/contact/1000;@1","k":"v","v":"x\r\n\r\nAction: Originate"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			_, _ = zw.Write(b)
			_ = zw.Close()
			b = buf.Bytes()
		}
		if m, err := decodeManifest(b, fuzzLimit); err == nil {
			again, err := EncodeManifest(m)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			m2, err := decodeManifest(again, fuzzLimit)
			if err != nil {
				t.Fatalf("a decoded manifest does not decode again: %v", err)
			}
			if m2.Digest != m.Digest || len(m2.Entries) != len(m.Entries) {
				t.Fatalf("round trip changed the manifest")
			}
		}
		// Whatever the digest, the tree's rules hold on any entries.
		var m Manifest
		if json.Unmarshal(gunzip(b), &m) != nil {
			return
		}
		for _, allow := range []bool{false, true} {
			wanted, err := Validate(m.Entries, ApplyOptions{AllowOutsideSymlinks: allow})
			if err != nil {
				continue
			}
			for _, e := range wanted {
				if !safeRel(e.Path) {
					t.Fatalf("Validate let %q through", e.Path)
				}
				if e.Kind == KindSymlink && !allow && !LinkStaysInside(e.Path, e.Link) {
					t.Fatalf("Validate let the symlink %q -> %q through", e.Path, e.Link)
				}
			}
		}
	})
}

// TestDecodeManifestBounds: a compressed bomb, a value entry that would
// inject an AMI action, and a wrong digest are refused.
func TestDecodeManifestBounds(t *testing.T) {
	// The bound's mechanism, on a 2 MiB bomb against a 1 MiB bound (the
	// real one, 128 MiB, takes seconds to inflate under the race detector).
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	_, _ = zw.Write([]byte(`{"entries":[`))
	_, _ = zw.Write(make([]byte, 2<<20))
	_ = zw.Close()
	if _, err := decodeManifest(buf.Bytes(), 1<<20); err == nil || !strings.Contains(err.Error(), "decompressed") {
		t.Errorf("a %d-byte bomb of 2 MiB decoded under a 1 MiB bound: %v", buf.Len(), err)
	}
	inject := []Entry{{Path: "registrar/contact/1000", Kind: KindValue, Value: "x\r\n\r\nAction: Originate"}}
	b, _ := EncodeManifest(&Manifest{Digest: Digest(inject), Entries: inject})
	if _, err := DecodeManifest(b); err == nil {
		t.Error("an AMI injection in a value decoded")
	}
	ok := []Entry{{Path: "a", Kind: KindDir, Mode: 0o755}}
	b, _ = EncodeManifest(&Manifest{Digest: "0", Entries: ok})
	if _, err := DecodeManifest(b); err == nil {
		t.Error("a wrong digest decoded")
	}
	if _, err := DecodeManifest(realManifest(t)); err != nil {
		t.Errorf("a real manifest: %v", err)
	}
}
