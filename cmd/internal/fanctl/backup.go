package fanctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/durablefile"
	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats-server/v2/server/archive"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The audit stream's backup is a JetStream snapshot: every message with its
// subject, headers (the Nats-Msg-Id that is the event's id), sequence and
// time, as the server keeps them. A restore makes the stream again from it
// in a bus that lost it, so the trail keeps its ages (90 days count from the
// original times) and every id fanctl explain looks up. Republishing the
// messages instead could not put the audit stream's copies of commands back
// (their subjects belong to the command stream, whose executors would
// receive them) and would restart every age. The file is the server's
// snapshot as sent, after one header line; the restore renames one header
// of the command copies on the way (keptTTLHeader).

func init() {
	registerCommand(commandSpec{Name: "backup", Section: sectionInstall, Synopsis: "--out FILE",
		Summary:  "write a snapshot of the audit stream FAN_EVENTS to FILE (the admin identity)",
		Examples: []string{"fanctl --config fan-site/admin/fanctl.yaml backup --out /var/backups/fan/FAN_EVENTS-$(date +%F).snap"},
		Values:   map[string]valueKind{"out": kindFile}})
	registerCommand(commandSpec{Name: "restore", Section: sectionInstall, Synopsis: "[--replicas N] FILE",
		Summary: "make FAN_EVENTS again from a backup, in a bus that lost it, before provision (the admin identity)",
		Examples: []string{"fanctl --config fan-site/admin/fanctl.yaml restore /var/backups/fan/FAN_EVENTS.snap",
			"fanctl --config fan-site/admin/fanctl.yaml restore --replicas 3 FAN_EVENTS.snap"},
		Args: []argSpec{{Name: "FILE", Kind: kindFile}}})
}

// backupFormat names the file's header line; the snapshot follows it.
const backupFormat = "fan-stream-snapshot"

// backupVersion is the header's version; a newer one is refused.
const backupVersion = 1

// backupChunk is the size of the chunks a snapshot is sent and restored in.
const backupChunk = 128 << 10

// backupIdle bounds the wait for the next chunk, or a chunk's answer.
const backupIdle = 30 * time.Second

// backupHeader is the file's first line.
type backupHeader struct {
	Format  string          `json:"format"`
	Version int             `json:"version"`
	Stream  string          `json:"stream"`
	TakenAt time.Time       `json:"taken_at"`
	Config  json.RawMessage `json:"config"`
	State   json.RawMessage `json:"state"`
	// line is the header line as read, newline included.
	line []byte
}

// streamState is what fanctl prints of a stream's state.
type streamState struct {
	Msgs     uint64    `json:"messages"`
	Bytes    uint64    `json:"bytes"`
	FirstSeq uint64    `json:"first_seq"`
	FirstTS  time.Time `json:"first_ts"`
	LastSeq  uint64    `json:"last_seq"`
	LastTS   time.Time `json:"last_ts"`
}

func (s streamState) String() string {
	if s.Msgs == 0 {
		return "0 messages"
	}
	return fmt.Sprintf("%d messages, sequences %d..%d, %s..%s, %d bytes", s.Msgs, s.FirstSeq, s.LastSeq,
		s.FirstTS.UTC().Format(time.RFC3339), s.LastTS.UTC().Format(time.RFC3339), s.Bytes)
}

// apiError is a JetStream API error answer.
type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

func (e *apiError) Error() string { return fmt.Sprintf("%s (err_code %d)", e.Description, e.ErrCode) }

// runBackup writes a snapshot of the audit stream to --out, with the admin
// identity (the only one allowed to take one).
func runBackup(ctx context.Context, args []string, connect connector, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	out := fs.String("out", "", "the file to write (required); written whole or not at all")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return usagef("backup needs --out FILE")
	}
	b, err := connect(bus.EventsStream)
	if err != nil {
		return err
	}
	defer b.Close()
	st, err := snapshot(ctx, b.NC, bus.EventsStream, *out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s, written to %s\n", bus.EventsStream, st, *out)
	return nil
}

// snapshot asks the stream's leader for a snapshot and writes it, after its
// header, to path (replaced whole and durably, or not at all).
func snapshot(ctx context.Context, nc *nats.Conn, stream, path string) (streamState, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return streamState{}, fmt.Errorf("backup: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	req, _ := json.Marshal(map[string]any{"deliver_subject": inbox, "no_consumers": true, "jsck": true, "chunk_size": backupChunk})
	m, err := ask(ctx, nc, events.JSStreamSnapshotSubject(stream), req, 10*time.Second)
	if err != nil {
		return streamState{}, fmt.Errorf("backup: snapshot request: %w", err)
	}
	var resp struct {
		Config json.RawMessage `json:"config"`
		State  json.RawMessage `json:"state"`
		Error  *apiError       `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return streamState{}, fmt.Errorf("backup: snapshot answer: %w", err)
	}
	if resp.Error != nil {
		return streamState{}, fmt.Errorf("backup: snapshot of %s refused: %w", stream, resp.Error)
	}
	var st streamState
	_ = json.Unmarshal(resp.State, &st)

	// The snapshot streams to disk through durablefile: a reader (or a
	// crash) sees the previous backup or this one, never a part.
	err = durablefile.WriteFrom(path, 0o600, func(f io.Writer) error {
		w := bufio.NewWriterSize(f, backupChunk)
		hdr, _ := json.Marshal(backupHeader{Format: backupFormat, Version: backupVersion, Stream: stream,
			TakenAt: time.Now().UTC(), Config: resp.Config, State: resp.State})
		if _, err := w.Write(append(hdr, '\n')); err != nil {
			return err
		}
		acked := false
		for {
			cctx, cancel := context.WithTimeout(ctx, backupIdle)
			c, err := sub.NextMsgWithContext(cctx)
			cancel()
			if err != nil {
				return fmt.Errorf("waiting for the snapshot's next chunk: %w", err)
			}
			if len(c.Data) == 0 {
				// The last message is empty; after a full chunk it carries a
				// status (the client library's status and description
				// headers), 204 when the snapshot is complete.
				if st := c.Header.Get("Status"); st != "" && st != "204" {
					return fmt.Errorf("the server ended the snapshot with %s %s", st, c.Header.Get("Description"))
				}
				break
			}
			if _, err := w.Write(c.Data); err != nil {
				return err
			}
			if c.Reply != "" {
				// Flow control: the server sends more once told this arrived.
				if err := nc.Publish(c.Reply, nil); err != nil {
					return fmt.Errorf("acknowledging a chunk: %w", err)
				}
				if !acked {
					// A server whose configuration denies the acknowledgement
					// would wait for it: learn that now, not at a timeout.
					if err := refused(nc, c.Reply); err != nil {
						return fmt.Errorf("acknowledging a chunk: %w", err)
					}
					acked = true
				}
			}
		}
		return w.Flush()
	})
	if err != nil {
		return streamState{}, fmt.Errorf("backup: %w", err)
	}
	return st, nil
}

// ttlHeader is the header a command carries in the command stream (its
// deadline, after which the server removes it there); the audit stream's
// copy of the command keeps it, without effect, since the audit stream
// has no per-message TTLs.
const ttlHeader = "Nats-TTL"

// keptTTLHeader is what a restore renames it to. nats-server's restore
// (its snapshot format with per-message entries) drops a message whose
// Nats-TTL has passed, whatever the stream's settings: every audit copy of
// a command would be lost. Renamed, the copy is restored as it was stored,
// and the value stays readable.
const keptTTLHeader = "Fan-Command-TTL"

// runRestore makes the audit stream again from a backup, in a bus that has
// none (a restore never touches a stream that exists), with the admin
// identity.
func runRestore(ctx context.Context, args []string, connect connector, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	replicas := fs.Int("replicas", 0, "the restored stream's replicas (default: as backed up; 1..5)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(pos, "FILE"); err != nil {
		return err
	}
	if *replicas < 0 || *replicas > 5 {
		return usagef("restore --replicas %d: want 1..5", *replicas)
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer f.Close()
	hdr, snap, err := openBackup(f)
	if err != nil {
		return fmt.Errorf("restore %s: %w", pos[0], err)
	}
	b, err := connect()
	if err != nil {
		return err
	}
	defer b.Close()
	// The server refuses too; asking first says why in fan's words.
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = b.JS.Stream(ictx, hdr.Stream)
	cancel()
	switch {
	case err == nil:
		return fmt.Errorf("restore: %s exists on this bus; a restore only makes it again where it was lost (the audit stream is never replaced, purged or deleted)", hdr.Stream)
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("restore: looking up %s: %w", hdr.Stream, err)
	}
	body, done, err := keepCommandCopies(snap)
	if err != nil {
		return fmt.Errorf("restore %s: %w", pos[0], err)
	}
	defer done()
	st, err := restore(ctx, b.NC, hdr, body, *replicas)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s restored: %s\n", hdr.Stream, st)
	return nil
}

// openBackup reads and checks the file's header line and returns the
// snapshot that follows it, to be read from its start (as many times as
// needed).
func openBackup(f *os.File) (backupHeader, func() io.Reader, error) {
	r := bufio.NewReaderSize(f, backupChunk)
	hdr, err := readBackupHeader(r)
	if err != nil {
		return backupHeader{}, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return backupHeader{}, nil, err
	}
	start := int64(len(hdr.line))
	return hdr, func() io.Reader { return io.NewSectionReader(f, start, fi.Size()-start) }, nil
}

// keepCommandCopies returns the snapshot to send: with every ttlHeader
// renamed keptTTLHeader when it is in the server's format of per-message
// entries (the only one whose restore applies the header), as it is
// otherwise. done stops the rewriting.
func keepCommandCopies(snap func() io.Reader) (body io.Reader, done func(), err error) {
	dec := bufio.NewReader(s2.NewReader(snap()))
	magic, err := dec.Peek(len(archive.MagicBytes))
	if err != nil || string(magic) != archive.MagicBytes {
		return snap(), func() {}, nil
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(renameTTLs(dec, pw))
	}()
	return pr, func() { _ = pr.Close() }, nil
}

// renameTTLs copies a snapshot's entries from dec (decompressed) to w
// (compressed again), renaming ttlHeader in each message's headers.
func renameTTLs(dec io.Reader, w io.Writer) error {
	enc := s2.NewWriter(w)
	ar, aw := archive.NewReader(dec), archive.NewWriter(enc)
	var buf []byte
	for {
		h, err := ar.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the snapshot: %w", err)
		}
		buf = slices.Grow(buf[:0], int(h.HeaderSize+h.PayloadSize))[:h.HeaderSize+h.PayloadSize]
		if _, err := io.ReadFull(ar, buf); err != nil {
			return fmt.Errorf("reading the snapshot: %w", err)
		}
		if h.Sequence > 0 && h.HeaderSize > 0 {
			if hdr := renameHeader(buf[:h.HeaderSize], ttlHeader, keptTTLHeader); hdr != nil {
				buf = append(hdr, buf[h.HeaderSize:]...)
				h.HeaderSize = int64(len(hdr))
			}
		}
		if err := aw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := aw.Write(buf); err != nil {
			return err
		}
	}
	if err := aw.Close(); err != nil {
		return err
	}
	return enc.Close()
}

// renameHeader returns the NATS headers hdr ("NATS/1.0\r\nKey: value\r\n...")
// with the key from renamed to, nil when from is not among them.
func renameHeader(hdr []byte, from, to string) []byte {
	lines := strings.Split(string(hdr), "\r\n")
	found := false
	for i, l := range lines[1:] {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(strings.TrimSpace(k), from) {
			lines[i+1] = to + ":" + v
			found = true
		}
	}
	if !found {
		return nil
	}
	return []byte(strings.Join(lines, "\r\n"))
}

// readBackupHeader reads and checks the file's first line.
func readBackupHeader(r *bufio.Reader) (backupHeader, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return backupHeader{}, fmt.Errorf("not a fanctl backup (no header line): %w", err)
	}
	var h backupHeader
	h.line = line
	if err := json.Unmarshal(line, &h); err != nil || h.Format != backupFormat {
		return backupHeader{}, errors.New("not a fanctl backup (its first line is not the header fanctl backup writes)")
	}
	if h.Version > backupVersion {
		return backupHeader{}, fmt.Errorf("written by a newer fanctl (format version %d; this one reads %d)", h.Version, backupVersion)
	}
	if h.Stream != bus.EventsStream || len(h.Config) == 0 {
		return backupHeader{}, fmt.Errorf("holds stream %q without its configuration; fanctl restores %s only", h.Stream, bus.EventsStream)
	}
	return h, nil
}

// restore sends the snapshot to the cluster, which makes the stream from
// it with the backed-up configuration (replicas changed when asked).
func restore(ctx context.Context, nc *nats.Conn, h backupHeader, r io.Reader, replicas int) (streamState, error) {
	cfg := map[string]any{}
	if err := json.Unmarshal(h.Config, &cfg); err != nil {
		return streamState{}, fmt.Errorf("restore: the backup's stream configuration: %w", err)
	}
	if replicas > 0 {
		cfg["num_replicas"] = replicas
	}
	req, _ := json.Marshal(map[string]any{"config": cfg, "state": h.State})
	m, err := ask(ctx, nc, events.JSStreamRestoreSubject(h.Stream), req, 10*time.Second)
	if err != nil {
		return streamState{}, fmt.Errorf("restore: request: %w", err)
	}
	var resp struct {
		DeliverSubject string    `json:"deliver_subject"`
		Error          *apiError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return streamState{}, fmt.Errorf("restore: answer: %w", err)
	}
	if resp.Error != nil {
		return streamState{}, fmt.Errorf("restore of %s refused: %w", h.Stream, resp.Error)
	}
	buf := make([]byte, backupChunk)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			reply, aerr := ask(ctx, nc, resp.DeliverSubject, buf[:n], backupIdle)
			if aerr != nil {
				return streamState{}, fmt.Errorf("restore: sending a chunk: %w", aerr)
			}
			if err := chunkRefused(reply); err != nil {
				return streamState{}, err
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return streamState{}, fmt.Errorf("restore: reading the backup: %w", err)
		}
	}
	// An empty chunk ends the transfer; the answer is the made stream.
	m, err = ask(ctx, nc, resp.DeliverSubject, nil, 2*time.Minute)
	if err != nil {
		return streamState{}, fmt.Errorf("restore: waiting for the stream to be made: %w", err)
	}
	var done struct {
		State streamState `json:"state"`
		Error *apiError   `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &done); err != nil {
		return streamState{}, fmt.Errorf("restore: final answer: %w", err)
	}
	if done.Error != nil {
		return streamState{}, fmt.Errorf("restore of %s failed: %w", h.Stream, done.Error)
	}
	return done.State, nil
}

// chunkRefused reads the server's answer to a restore chunk: empty when it
// took it.
func chunkRefused(m *nats.Msg) error {
	if len(m.Data) == 0 {
		return nil
	}
	var resp struct {
		Error *apiError `json:"error"`
	}
	if json.Unmarshal(m.Data, &resp) == nil && resp.Error != nil {
		return fmt.Errorf("restore: the server refused a chunk: %w", resp.Error)
	}
	return nil
}

// ask sends a request and waits up to within for its answer. A publish the
// server's permissions deny is answered by nobody: it is reported at once
// (the server says so before it answers the ping that follows), not when
// within has passed.
func ask(ctx context.Context, nc *nats.Conn, subject string, body []byte, within time.Duration) (*nats.Msg, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, body); err != nil {
		return nil, err
	}
	if err := refused(nc, subject); err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	return sub.NextMsgWithContext(actx)
}

// refused reports whether the server denied the publish to subject, once
// what was sent before has reached it.
func refused(nc *nats.Conn, subject string) error {
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		return err
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
		return fmt.Errorf("%w (the admin takes and restores snapshots with the permissions this version of fanctl init writes into the servers' configuration: on an older site, run fanctl init again and install.sh on each host)", err)
	}
	return nil
}
