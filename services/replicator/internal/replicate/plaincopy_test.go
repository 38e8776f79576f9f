package replicate_test

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"
)

// The plain checked copy is what the replicator's initial sync is read
// against beside rsync: the least work a copy does that checks what it
// writes, as the replicator's target does. Read each file once while
// hashing it (SHA-256), hand the bytes over a hop, write them into a temp
// file while hashing them again, compare, rename into place, and flush the
// file system once at the end. It has none of a replicator's work: no
// manifest, no plan, no safety checks, no group commit, no second read to
// answer a fetch. Run with no hop (in memory), through one NATS server (the
// bus's path), and over one direct TLS connection, it separates what the
// checks cost from what the hop costs.

// plainChunk is one piece of one file: bytes, or, with end set, the SHA-256
// of the whole file the reader computed, which the writer must match.
type plainChunk struct {
	file int
	end  bool
	data []byte
}

// plainHop carries chunks from the reader to the writers: every chunk
// sent on the link open returns reaches deliver, in order.
type plainHop interface {
	open(deliver func(plainChunk)) (plainLink, error)
}

type plainLink struct {
	send func(plainChunk) error
	stop func()
	// room is the bytes a chunk's buffer keeps free in front of its data,
	// chunk the most data a chunk carries.
	room, chunk int
}

// plainChunkSize is the most a chunk carries where the hop allows it.
const plainChunkSize = 1 << 20

// memoryHop hands the bytes over in memory: no transport at all.
type memoryHop struct{}

func (memoryHop) open(deliver func(plainChunk)) (plainLink, error) {
	send := func(c plainChunk) error { deliver(c); return nil }
	return plainLink{send: send, stop: func() {}, chunk: plainChunkSize}, nil
}

// busHop publishes each chunk through a NATS server to a subscriber on
// another connection: the one hop the replicator's direct transfer takes
// (holder to server to target), in messages of up to a MiB.
type busHop struct{ srv *server.Server }

// busFrame is the chunk's header inside the message: file index and a
// flag byte, written into the room in front of the data (no copy).
const busFrame = 5

// putFrame writes c's file index and end flag into the first busFrame
// bytes of c.data, the room its reader left in front of the bytes.
func putFrame(c plainChunk) {
	binary.BigEndian.PutUint32(c.data, uint32(c.file))
	c.data[4] = 0
	if c.end {
		c.data[4] = 1
	}
}

func (h busHop) open(deliver func(plainChunk)) (plainLink, error) {
	pub, err := nats.Connect(h.srv.ClientURL())
	if err != nil {
		return plainLink{}, fmt.Errorf("plain copy publisher: %w", err)
	}
	subc, err := nats.Connect(h.srv.ClientURL())
	if err != nil {
		pub.Close()
		return plainLink{}, fmt.Errorf("plain copy subscriber: %w", err)
	}
	stop := func() { pub.Close(); subc.Close() }
	subject := nats.NewInbox()
	sub, err := subc.Subscribe(subject, func(m *nats.Msg) {
		if len(m.Data) < busFrame {
			return
		}
		deliver(plainChunk{file: int(binary.BigEndian.Uint32(m.Data)), end: m.Data[4] == 1, data: m.Data[busFrame:]})
	})
	if err == nil {
		// The reader's credits bound what is in flight; the client's
		// own limit would drop messages instead.
		err = sub.SetPendingLimits(-1, -1)
	}
	if err == nil {
		err = subc.Flush()
	}
	if err != nil {
		stop()
		return plainLink{}, fmt.Errorf("plain copy subscription: %w", err)
	}
	send := func(c plainChunk) error {
		putFrame(c)
		return pub.Publish(subject, c.data)
	}
	return plainLink{
		send: send, stop: func() { _ = pub.Flush(); stop() },
		room: busFrame, chunk: int(min(pub.MaxPayload(), plainChunkSize)) - busFrame,
	}, nil
}

// tlsHop sends the chunks over one TLS 1.3 connection on loopback, the
// server's certificate checked: what a direct connection from holder to
// peer would cost instead of the bus, encrypted as the bus is between
// hosts.
type tlsHop struct{}

// tlsFrame is busFrame and the chunk's length: the stream has no messages.
const tlsFrame = busFrame + 4

func (tlsHop) open(deliver func(plainChunk)) (plainLink, error) {
	serverConf, clientConf, err := loopbackTLS()
	if err != nil {
		return plainLink{}, err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverConf)
	if err != nil {
		return plainLink{}, fmt.Errorf("plain copy listen: %w", err)
	}
	received := make(chan struct{})
	go func() {
		defer close(received)
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReaderSize(c, 256<<10)
		var hdr [tlsFrame]byte
		for {
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return
			}
			data := make([]byte, binary.BigEndian.Uint32(hdr[busFrame:]))
			if _, err := io.ReadFull(r, data); err != nil {
				return
			}
			deliver(plainChunk{file: int(binary.BigEndian.Uint32(hdr[:])), end: hdr[4] == 1, data: data})
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), clientConf)
	if err != nil {
		ln.Close()
		<-received
		return plainLink{}, fmt.Errorf("plain copy dial: %w", err)
	}
	send := func(ch plainChunk) error {
		putFrame(ch)
		binary.BigEndian.PutUint32(ch.data[busFrame:], uint32(len(ch.data)-tlsFrame))
		_, err := c.Write(ch.data)
		return err
	}
	stop := func() { c.Close(); <-received }
	return plainLink{send: send, stop: stop, room: tlsFrame, chunk: plainChunkSize}, nil
}

// loopbackTLS is a throwaway certificate for 127.0.0.1 and the two ends'
// configurations, the client's trusting that certificate alone.
func loopbackTLS() (serverConf, clientConf *tls.Config, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("plain copy key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "plain copy"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("plain copy certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("plain copy certificate: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	serverConf = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	clientConf = &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots}
	return serverConf, clientConf, nil
}

// plainCopy copies the regular files under src to dst through hop and
// returns once dst's file system is flushed.
func plainCopy(src, dst string, hop plainHop) error {
	type file struct {
		rel  string
		info fs.FileInfo
		in   chan plainChunk
	}
	var files []*file
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files = append(files, &file{rel: rel, info: info, in: make(chan plainChunk, 16)})
		return nil
	})
	if err != nil {
		return fmt.Errorf("plain copy walk: %w", err)
	}
	// credits bound the chunks read and not yet written (64 MiB).
	credits := make(chan struct{}, 64)
	link, err := hop.open(func(c plainChunk) { files[c.file].in <- c })
	if err != nil {
		return err
	}
	defer link.stop()

	var (
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	order := make(chan *file, len(files))
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for f := range order {
				if err := plainWrite(filepath.Join(dst, f.rel), f.info, f.in, credits); err != nil {
					fail(fmt.Errorf("plain copy write %s: %w", f.rel, err))
				}
			}
		})
	}
	readErr := func() error {
		defer close(order)
		for i, f := range files {
			order <- f
			if err := plainRead(filepath.Join(src, f.rel), i, f.info.Size(), link, credits); err != nil {
				// The file's writer waits for its end: an empty hash fails it.
				_ = link.send(plainChunk{file: i, end: true, data: make([]byte, link.room)})
				return fmt.Errorf("plain copy read %s: %w", f.rel, err)
			}
		}
		return nil
	}()
	wg.Wait()
	if err := errors.Join(readErr, firstErr); err != nil {
		return err
	}
	d, err := os.Open(dst)
	if err != nil {
		return fmt.Errorf("plain copy flush: %w", err)
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("plain copy flush: %w", err)
	}
	return nil
}

// plainRead sends the file's bytes in chunks as it hashes them, then the
// hash; each chunk takes a credit the writer gives back.
func plainRead(p string, file int, size int64, link plainLink, credits chan struct{}) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	room := link.room
	for left := size; left > 0; {
		buf := make([]byte, room+int(min(left, int64(link.chunk))))
		n, err := io.ReadFull(f, buf[room:])
		if err != nil {
			return err
		}
		h.Write(buf[room : room+n])
		left -= int64(n)
		credits <- struct{}{}
		if err := link.send(plainChunk{file: file, data: buf[:room+n]}); err != nil {
			return err
		}
	}
	return link.send(plainChunk{file: file, end: true, data: h.Sum(make([]byte, room, room+sha256.Size))})
}

// plainWrite writes a file's chunks into a temp file beside p, hashing
// them, and renames it into place once the reader's hash matches. It takes
// every chunk of the file whatever fails, so the reader never waits for a
// credit nobody gives back.
func plainWrite(p string, info fs.FileInfo, in <-chan plainChunk, credits chan struct{}) (err error) {
	ended := false
	defer func() {
		if err == nil || ended {
			return
		}
		for c := range in {
			if c.end {
				return
			}
			<-credits
		}
	}()
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(p), ".plain-"+filepath.Base(p))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // after a rename, nothing is left to remove
	h := sha256.New()
	for c := range in {
		if c.end {
			ended = true
			if !bytes.Equal(h.Sum(nil), c.data) {
				f.Close()
				return errors.New("content does not match the reader's hash")
			}
			if err := f.Chmod(info.Mode().Perm()); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			if err := os.Chtimes(tmp, info.ModTime(), info.ModTime()); err != nil {
				return err
			}
			return os.Rename(tmp, p)
		}
		h.Write(c.data)
		_, err := f.Write(c.data)
		<-credits
		if err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	return errors.New("the reader stopped before the end")
}

// TestPlainCopyCopies: what the benchmark reads fan against is a real,
// checked copy through every hop, so its figure cannot come from skipping
// work.
func TestPlainCopyCopies(t *testing.T) {
	src := t.TempDir()
	write(t, src, "a/INBOX/msg0001.txt", random(100))
	write(t, src, "a/INBOX/msg0001.wav", random(3*plainChunkSize+17))
	write(t, src, "b/empty.txt", nil)
	for name, hop := range map[string]plainHop{"memory": memoryHop{}, "bus": busHop{srv: bustest.Server(t)}, "tls": tlsHop{}} {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			if err := plainCopy(src, dst, hop); err != nil {
				t.Fatal(err)
			}
			if err := same(src, dst); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPlainCopyChecksWhatItCopies: a byte changed on the way is refused and
// the file is not renamed into place, as the replicator's target refuses it.
func TestPlainCopyChecksWhatItCopies(t *testing.T) {
	src := t.TempDir()
	write(t, src, "INBOX/msg0001.wav", random(2*plainChunkSize))
	dst := t.TempDir()
	err := plainCopy(src, dst, corruptingHop{})
	if err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("corrupted copy: err = %v, want a hash mismatch", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "INBOX", "msg0001.wav")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("corrupted file in place: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dst, "INBOX", ".plain-*")); len(left) > 0 {
		t.Fatalf("temp files left: %v", left)
	}
}

// corruptingHop flips a bit in the first chunk of bytes it carries.
type corruptingHop struct{}

func (corruptingHop) open(deliver func(plainChunk)) (plainLink, error) {
	link, err := memoryHop{}.open(deliver)
	first := true
	link.send = func(c plainChunk) error {
		if first && !c.end && len(c.data) > 0 {
			first = false
			c.data[0] ^= 1
		}
		deliver(c)
		return nil
	}
	return link, err
}
