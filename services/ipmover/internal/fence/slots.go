package fence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"syscall"

	"github.com/fanpbx/fan/pkg/platform/durablefile"
)

// The state file is two slots of equal size, one after the other. Each
// slot is a header and the state's JSON encoding:
//
//	magic "fanfence" | sequence u64 | payload length u32 | CRC-32C u32 | payload
//
// (little endian; the CRC covers the sequence, the length and the
// payload). The valid slot with the higher sequence is the state. A write
// goes to the other slot, in place, and is made durable with one
// fdatasync: the file's size never changes, so no metadata has to reach
// the disk with it, where replacing the file by rename costs an fsync of
// the new file and one of the directory (several times longer on the
// disks measured, and on the path from a claim to the address added). A
// write torn by a crash fails its CRC and leaves the other slot, the state
// before that Record, which had not returned.
const (
	slotMagic     = "fanfence"
	slotHeaderLen = len(slotMagic) + 8 + 4 + 4
	// minSlotSize holds the state of DefaultKeep command ids with room to
	// spare; a state that outgrows its slot is moved to a larger file.
	minSlotSize = 16 << 10
	// maxSlotSize bounds what Open reads as slots: no state comes near it.
	maxSlotSize = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// slotFile is where the current state is on disk.
type slotFile struct {
	size int    // bytes per slot; zero: the file has no slots (yet)
	seq  uint64 // sequence of the current state
	slot int    // the slot holding it (0 or 1)
}

// fits reports whether a payload of n bytes can be written into a slot.
func (f slotFile) fits(n int) bool { return f.size > 0 && slotHeaderLen+n <= f.size }

// isSlotFile tells the slot layout from the older one, a JSON document.
func isSlotFile(b []byte) bool { return len(b) > 0 && b[0] != '{' }

// readSlots returns the layout of a slot file and its current state's
// payload.
func readSlots(b []byte) (slotFile, []byte, error) {
	if len(b)%2 != 0 || len(b) < 2*slotHeaderLen || len(b) > 2*maxSlotSize {
		return slotFile{}, nil, fmt.Errorf("fence: %d bytes is not two state slots", len(b))
	}
	size := len(b) / 2
	best := slotFile{}
	var payload []byte
	var errs []error
	for i := range 2 {
		seq, p, err := parseSlot(b[i*size : (i+1)*size])
		if err != nil {
			errs = append(errs, fmt.Errorf("slot %d: %w", i, err))
			continue
		}
		if payload == nil || seq > best.seq {
			best, payload = slotFile{size: size, seq: seq, slot: i}, p
		}
	}
	if payload == nil {
		return slotFile{}, nil, errors.Join(errs...)
	}
	return best, payload, nil
}

func parseSlot(b []byte) (uint64, []byte, error) {
	if string(b[:len(slotMagic)]) != slotMagic {
		return 0, nil, errors.New("fence: no slot header")
	}
	h := b[len(slotMagic):slotHeaderLen]
	seq := binary.LittleEndian.Uint64(h[0:8])
	n := binary.LittleEndian.Uint32(h[8:12])
	sum := binary.LittleEndian.Uint32(h[12:16])
	if int64(n) > int64(len(b)-slotHeaderLen) {
		return 0, nil, fmt.Errorf("fence: payload of %d bytes in a %d-byte slot", n, len(b))
	}
	payload := b[slotHeaderLen : slotHeaderLen+int(n)]
	if checksum(h[0:12], payload) != sum {
		return 0, nil, errors.New("fence: checksum mismatch (a write cut short)")
	}
	return seq, payload, nil
}

func checksum(seqAndLen, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(seqAndLen, castagnoli), castagnoli, payload)
}

// encodeSlot returns a slot's header followed by payload.
func encodeSlot(seq uint64, payload []byte) []byte {
	b := make([]byte, slotHeaderLen+len(payload))
	copy(b, slotMagic)
	h := b[len(slotMagic):slotHeaderLen]
	binary.LittleEndian.PutUint64(h[0:8], seq)
	binary.LittleEndian.PutUint32(h[8:12], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[12:16], checksum(h[0:12], payload))
	copy(b[slotHeaderLen:], payload)
	return b
}

// writeSlot writes payload into the slot after f's and flushes it. A file
// that is no longer the slot file f describes (removed, or replaced by
// hand) is written anew, whole.
func writeSlot(path string, f slotFile, payload []byte) (slotFile, error) {
	file, err := os.OpenFile(path, os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return createSlots(path, f.seq+1, payload)
	}
	if err != nil {
		return f, fmt.Errorf("open state file: %w", err)
	}
	defer file.Close()
	if fi, err := file.Stat(); err != nil {
		return f, fmt.Errorf("stat state file: %w", err)
	} else if fi.Size() != int64(2*f.size) {
		return createSlots(path, f.seq+1, payload)
	}
	next := slotFile{size: f.size, seq: f.seq + 1, slot: 1 - f.slot}
	if _, err := file.WriteAt(encodeSlot(next.seq, payload), int64(next.slot*f.size)); err != nil {
		return f, fmt.Errorf("write state slot: %w", err)
	}
	if err := fdatasync(file); err != nil {
		return f, fmt.Errorf("fdatasync %s: %w", path, err)
	}
	if err := file.Close(); err != nil {
		return f, fmt.Errorf("close state file: %w", err)
	}
	return next, nil
}

func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = syscall.Fdatasync(int(fd)); !errors.Is(serr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}

// createSlots puts a new slot file in place holding payload in slot 0 (the
// other slot empty), sized for it to grow, so that a reader, or a restart
// after a crash, sees the old file or the new one, complete.
func createSlots(path string, seq uint64, payload []byte) (slotFile, error) {
	need := slotHeaderLen + len(payload)
	if need > maxSlotSize {
		return slotFile{}, fmt.Errorf("fence: state of %d bytes is larger than a slot may be", len(payload))
	}
	// Room to grow to twice the state, but never past what Open reads.
	size := min(maxSlotSize, max(minSlotSize, roundUp(2*need, 4096)))
	b := make([]byte, 2*size)
	copy(b, encodeSlot(seq, payload))
	if err := durablefile.Write(path, b, 0o600); err != nil {
		return slotFile{}, fmt.Errorf("create state slots: %w", err)
	}
	return slotFile{size: size, seq: seq, slot: 0}, nil
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }
