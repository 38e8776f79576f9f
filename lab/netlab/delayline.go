package netlab

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// The delay line: a user-space stand-in for netem on kernels built without
// it. The router routes every packet between places into a TUN device; the
// line reads it, holds it for the delays of its source's and destination's
// uplinks, and writes it back into the same device, from which the router
// sends it out of the destination's uplink. Packets leave in the order of
// their due times, and in arrival order when those are equal, so a stream
// between two places is never reordered.

// openTUN creates a TUN device (no packet information header) in the
// calling thread's network namespace, and returns its file, read and
// written one IP packet at a time through the runtime's poller. The file is
// handed to the poller only once the device is attached: a TUN file polled
// before TUNSETIFF never registers its wait queue, and reads would never
// wake.
func openTUN(name string) (*os.File, error) {
	fd, err := syscall.Open("/dev/net/tun", syscall.O_RDWR|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	const (
		tunSetIff = 0x400454ca // TUNSETIFF
		iffTun    = 0x0001
		iffNoPI   = 0x1000
	)
	var req [40]byte // struct ifreq: name, then the flags
	copy(req[:15], name)
	binary.NativeEndian.PutUint16(req[16:], iffTun|iffNoPI)
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), tunSetIff, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		syscall.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, errno)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

type lineRoute struct {
	prefix netip.Prefix
	delay  time.Duration
}

type heldPacket struct {
	due  time.Time
	seq  uint64
	data []byte
}

type packetHeap []heldPacket

func (h packetHeap) Len() int { return len(h) }
func (h packetHeap) Less(i, j int) bool {
	if c := h[i].due.Compare(h[j].due); c != 0 {
		return c < 0
	}
	return h[i].seq < h[j].seq
}
func (h packetHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)   { *h = append(*h, x.(heldPacket)) }
func (h *packetHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	return p
}

// maxHeld bounds the packets the line holds; beyond it new ones are
// dropped, as a full queue would.
const maxHeld = 65536

type delayLine struct {
	f      *os.File
	routes []lineRoute
	log    *slog.Logger

	mu      sync.Mutex
	held    packetHeap
	seq     uint64
	wake    chan struct{}
	quit    chan struct{}
	done    sync.WaitGroup
	stopped sync.Once
}

func newDelayLine(f *os.File, places []PlaceSpec, log *slog.Logger) *delayLine {
	d := &delayLine{f: f, log: log, wake: make(chan struct{}, 1), quit: make(chan struct{})}
	for _, p := range places {
		d.routes = append(d.routes, lineRoute{p.Prefix.Masked(), p.Delay})
	}
	d.done.Add(2)
	go d.read()
	go d.write()
	return d
}

// delayOf is the delay of the uplink of the place that holds a.
func (d *delayLine) delayOf(a netip.Addr) time.Duration {
	for _, r := range d.routes {
		if r.prefix.Contains(a) {
			return r.delay
		}
	}
	return 0
}

func (d *delayLine) read() {
	defer d.done.Done()
	buf := make([]byte, 65536)
	for {
		n, err := d.f.Read(buf)
		if err != nil {
			select {
			case <-d.quit:
			default:
				d.log.Warn("netlab: delay line stopped reading", "err", err)
			}
			return
		}
		if n < 20 || buf[0]>>4 != 4 {
			continue // IPv4 only: the router's IPv6 is off
		}
		src, _ := netip.AddrFromSlice(buf[12:16])
		dst, _ := netip.AddrFromSlice(buf[16:20])
		due := time.Now().Add(d.delayOf(src) + d.delayOf(dst))
		d.mu.Lock()
		if len(d.held) < maxHeld {
			d.seq++
			heap.Push(&d.held, heldPacket{due: due, seq: d.seq, data: append([]byte(nil), buf[:n]...)})
		}
		d.mu.Unlock()
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

func (d *delayLine) write() {
	defer d.done.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d.mu.Lock()
		var next time.Duration = time.Hour
		var out [][]byte
		now := time.Now()
		for len(d.held) > 0 {
			if wait := d.held[0].due.Sub(now); wait > 0 {
				next = wait
				break
			}
			out = append(out, heap.Pop(&d.held).(heldPacket).data)
		}
		d.mu.Unlock()
		for _, p := range out {
			if _, err := d.f.Write(p); err != nil {
				select {
				case <-d.quit:
					return
				default:
				}
			}
		}
		if len(out) > 0 {
			continue // the clock moved while writing
		}
		t.Reset(next)
		select {
		case <-d.quit:
			return
		case <-d.wake:
			t.Stop() // Go 1.23 timers: no stale tick survives Stop or Reset
		case <-t.C:
		}
	}
}

// stop ends both goroutines and closes the device's file (which lets the
// kernel free the device and, with it, its hold on the namespace).
func (d *delayLine) stop() {
	d.stopped.Do(func() {
		close(d.quit)
		d.f.Close()
		d.done.Wait()
	})
}
