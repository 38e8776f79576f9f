package netlab

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func testPlaces() []PlaceSpec {
	return []PlaceSpec{
		{Name: "a", Prefix: netip.MustParsePrefix("192.0.2.0/24"), Delay: 20 * time.Millisecond,
			Hosts: []HostSpec{{Name: "a1", Addr: netip.MustParsePrefix("192.0.2.10/24")}}},
		{Name: "b", Prefix: netip.MustParsePrefix("203.0.113.0/24"), Delay: 25 * time.Millisecond,
			Hosts: []HostSpec{{Name: "b1", Addr: netip.MustParsePrefix("203.0.113.20/24")}}},
		{Name: "c", Prefix: netip.MustParsePrefix("198.51.100.128/25"), Delay: 30 * time.Millisecond,
			Hosts: []HostSpec{{Name: "c1", Addr: netip.MustParsePrefix("198.51.100.150/25")}}},
	}
}

// connectTime dials addr over TCP from host and returns how long the
// handshake took (one round trip).
func connectTime(t *testing.T, w *WAN, host, addr string, timeout time.Duration) (time.Duration, error) {
	t.Helper()
	var took time.Duration
	err := w.Do(host, func() error {
		start := time.Now()
		c, err := net.DialTimeout("tcp", addr, timeout)
		took = time.Since(start)
		if err == nil {
			c.Close()
		}
		return err
	})
	return took, err
}

func listenOn(t *testing.T, w *WAN, host, addr string) {
	t.Helper()
	var ln net.Listener
	if err := w.Do(host, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// A WAN lab: places on LANs of their own, joined by a router whose uplinks
// delay every packet (netem where the kernel has it, else the delay line,
// and the delay line when asked); a round trip between two places takes at
// least twice the sum of their delays; a cut uplink makes its place
// unreachable while the others still talk, and its restoration brings it
// back; Close removes everything.
func TestWANDelaysAndCuts(t *testing.T) {
	requireRoot(t, "tc")
	for _, noNetem := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "delay line"}[noNetem], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			w, err := BuildWAN(ctx, WANSpec{Places: testPlaces(), Logger: testLogger(t), NoNetem: noNetem})
			if err != nil {
				t.Fatal(err)
			}
			prefix, dir := w.Prefix(), w.Dir()
			t.Cleanup(func() {
				if err := w.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
				if _, err := os.Stat(filepath.Join(netnsDir, prefix+"-"+WANRouter)); err == nil {
					t.Errorf("router namespace left after Close")
				}
				if _, err := os.Stat(dir); err == nil {
					t.Errorf("lab dir %s left after Close", dir)
				}
			})
			if noNetem && w.DelayMode() != DelayLine {
				t.Fatalf("delay mode %s, want the delay line", w.DelayMode())
			}
			t.Logf("delay mode: %s", w.DelayMode())
			listenOn(t, w, "a1", "192.0.2.10:7000")
			listenOn(t, w, "b1", "203.0.113.20:7000")

			rtt, err := connectTime(t, w, "c1", "192.0.2.10:7000", 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if want := 2 * (30 + 20) * time.Millisecond; rtt < want {
				t.Fatalf("c1 -> a1 handshake %v, shorter than the WAN's %v", rtt, want)
			}
			t.Logf("c1 -> a1 handshake %v (delays 30 + 20 ms each way)", rtt)
			for range 20 { // a stream keeps its order: many small exchanges in a row
				if _, err := connectTime(t, w, "b1", "192.0.2.10:7000", 2*time.Second); err != nil {
					t.Fatal(err)
				}
			}

			if err := w.CutUplink("a"); err != nil {
				t.Fatal(err)
			}
			if took, err := connectTime(t, w, "c1", "192.0.2.10:7000", 500*time.Millisecond); err == nil {
				t.Fatalf("a1 reached through a cut uplink in %v", took)
			}
			if _, err := connectTime(t, w, "c1", "203.0.113.20:7000", 2*time.Second); err != nil {
				t.Fatalf("b1 unreachable while only a's uplink is cut: %v", err)
			}
			if err := w.RestoreUplink("a"); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				if _, err := connectTime(t, w, "c1", "192.0.2.10:7000", time.Second); err == nil {
					break
				} else if time.Now().After(deadline) {
					t.Fatalf("a1 unreachable after its uplink came back: %v", err)
				}
			}
		})
	}
}

// Places that would break the lab or the test networks are refused.
func TestWANRefusesBadPlaces(t *testing.T) {
	good := testPlaces()
	for name, change := range map[string]func([]PlaceSpec){
		"outside the test networks": func(p []PlaceSpec) { p[0].Prefix = netip.MustParsePrefix("10.0.0.0/24") },
		"overlapping":               func(p []PlaceSpec) { p[1].Prefix = netip.MustParsePrefix("192.0.2.128/25") },
		"host outside its place":    func(p []PlaceSpec) { p[0].Hosts[0].Addr = netip.MustParsePrefix("203.0.113.9/24") },
		"host on the gateway":       func(p []PlaceSpec) { p[0].Hosts[0].Addr = netip.MustParsePrefix("192.0.2.1/24") },
		"duplicate host":            func(p []PlaceSpec) { p[1].Hosts[0].Name = "a1" },
		"router's name":             func(p []PlaceSpec) { p[1].Hosts[0].Name = WANRouter },
	} {
		p := testPlaces()
		for i := range p {
			p[i].Hosts = append([]HostSpec(nil), good[i].Hosts...)
		}
		change(p)
		if err := checkPlaces(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := checkPlaces(testPlaces()); err != nil {
		t.Fatalf("good places refused: %v", err)
	}
}
