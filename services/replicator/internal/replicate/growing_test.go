package replicate_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
)

// TestARecordingBeingWrittenDoesNotHoldTheTreeBack: Asterisk's MixMonitor
// writes a call's recording in place, appending for as long as the call
// lasts. A message left meanwhile must still reach the peer, and the
// recording too once the call ends. Every content a pass stores is what
// its scan hashed: the first Size bytes of a file appended to since, not
// whatever the file holds when the upload reads it (which failed the whole
// pass, pass after pass, for the length of the call). A file rewritten
// between its scan and its upload is left for the next pass; the rest of
// the pass goes on.
func TestARecordingBeingWrittenDoesNotHoldTheTreeBack(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	rec := filepath.Join(n1.root, "monitor", "call-1.wav")
	write(t, n1.root, "monitor/call-1.wav", random(512<<10))
	write(t, n1.root, "default/1/INBOX/msg0000.txt", random(4<<10))
	// And a file rewritten in place (not appended to) right after each
	// hashing: its upload never finds what its scan read, which must cost
	// that file alone, not the pass.
	rewritten := filepath.Join(n1.root, "monitor", "mix.wav")
	write(t, n1.root, "monitor/mix.wav", random(256<<10))
	f, err := os.OpenFile(rec, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // after the hook is gone (cleanups run last first)
	// The call: audio appended after each hashing of the recording, so
	// each upload finds it longer than its scan did.
	var calling atomic.Bool
	calling.Store(true)
	var mu sync.Mutex
	chunk := random(8 << 10)
	replicate.AfterHashing(func(path string) {
		mu.Lock()
		defer mu.Unlock()
		if !calling.Load() {
			return
		}
		var err error
		switch path {
		case "monitor/call-1.wav":
			_, err = f.Write(chunk)
		case "monitor/mix.wav":
			err = os.WriteFile(rewritten, random(256<<10), 0o640)
		}
		if err != nil {
			t.Error(err)
		}
	})
	endCall := func() {
		mu.Lock()
		calling.Store(false)
		mu.Unlock()
	}
	t.Cleanup(func() { endCall(); replicate.AfterHashing(nil) })
	// No direct transfer: every content goes through the store.
	l.start(n1)
	l.start(n2)
	l.setHolder("n1", 1)

	// During the call: a message left now reaches n2, and so does the
	// recording as a scan read it (a beginning of what n1 holds now).
	msg := random(6 << 10)
	write(t, n1.root, "default/1/INBOX/msg0001.txt", msg)
	waittest.Succeeds(l.t, l.patience(20*time.Second), "the message and the recording so far on n2 while the call records", func() error {
		got, err := os.ReadFile(filepath.Join(n2.root, "default/1/INBOX/msg0001.txt"))
		if err != nil {
			return err
		}
		if !bytes.Equal(got, msg) {
			return errors.New("the message differs")
		}
		part, err := os.ReadFile(filepath.Join(n2.root, "monitor", "call-1.wav"))
		if err != nil {
			return err
		}
		mu.Lock()
		whole, err := os.ReadFile(rec)
		mu.Unlock()
		if err != nil {
			return err
		}
		if len(part) < 512<<10 || !bytes.HasPrefix(whole, part) {
			return fmt.Errorf("n2's recording (%d bytes) is not a beginning of n1's (%d bytes)", len(part), len(whole))
		}
		return nil
	})
	endCall()
	waittest.Succeeds(l.t, l.patience(20*time.Second), "the whole recording on n2 after the call", func() error {
		return same(n1.root, n2.root)
	})
}
