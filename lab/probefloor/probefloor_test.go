package probefloor

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
)

func TestParseSpec(t *testing.T) {
	got, err := ParseSpec("http,3,http://127.0.0.1:8080/a,b")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[2] != (Check{Kind: "http", Addr: "http://127.0.0.1:8080/a,b"}) {
		t.Fatalf("got %v", got)
	}
	for _, bad := range []string{"", "tcp", "tcp,2", "tcp,x,127.0.0.1:1", "tcp,-1,127.0.0.1:1", "icmp,1,127.0.0.1", "tcp,1,"} {
		if _, err := ParseSpec(bad); err == nil {
			t.Errorf("ParseSpec(%q) accepted", bad)
		}
	}
}

func TestResultRoundTrip(t *testing.T) {
	r := Result{Mode: "exec", Window: 10 * time.Second, CPU: 1500 * time.Millisecond, Failed: 2,
		Runs: map[string]int{"http": 5, "ami": 7, "tcp": 1}}
	line := r.String()
	if want := "probefloor mode=exec window_ms=10000 cpu_us=1500000 failed=2 runs=ami:7,tcp:1,http:5"; line != want {
		t.Fatalf("String() = %q, want %q", line, want)
	}
	got, err := ParseResult("noise\n" + line + "\nmore\n")
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode != r.Mode || got.Window != r.Window || got.CPU != r.CPU || got.Failed != 2 || got.Total() != 13 || got.Runs["ami"] != 7 {
		t.Fatalf("ParseResult = %+v", got)
	}
	for _, bad := range []string{"", "probefloor mode=floor", "probefloor mode=floor window_ms=x", "probefloor mode=floor window_ms=5 runs=ami"} {
		if _, err := ParseResult(bad); err == nil {
			t.Errorf("ParseResult(%q) accepted", bad)
		}
	}
}

func TestPerProbeAndRatio(t *testing.T) {
	// 200 probes a 200 ms over 10 s is 10,000 runs; 1 s of CPU over them
	// is 100 µs each.
	if got := PerProbeUS(time.Second, 10000); got != 100 {
		t.Fatalf("PerProbeUS = %v", got)
	}
	if got := PerProbeUS(time.Second, 0); got != 0 {
		t.Fatalf("PerProbeUS with no runs = %v", got)
	}
	if got := Ratio(130, 100); got != 1.3 {
		t.Fatalf("Ratio = %v", got)
	}
	if got := Ratio(130, 0); got != 0 {
		t.Fatalf("Ratio against nothing = %v", got)
	}
}

// TestFloorRunsEveryKind runs the floor and Once against real peers: each
// kind's runs succeed, and the kept connections stay kept.
func TestFloorRunsEveryKind(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	var accepted int
	var httpConns atomic.Int32
	acceptedCh := make(chan struct{}, 1000)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			acceptedCh <- struct{}{}
		}
	}()
	web := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	web.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			httpConns.Add(1)
		}
	}
	web.Start()
	defer web.Close()
	udp := sipUDPPeer(t)
	sipTCP := sipTCPPeer(t)
	cred := Credentials{Username: "fan", Secret: "s"}
	checks := []Check{{"ami", peer.Addr()}, {"sip", udp}, {"siptcp", sipTCP}, {"tcp", ln.Addr().String()}, {"http", web.URL + "/"}}

	for _, c := range checks {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := Once(ctx, c, cred); err != nil {
			t.Errorf("Once %s: %v", c.Kind, err)
		}
		cancel()
	}
	// Cancelled, not timed out: a run in flight then ends by itself and is
	// not counted, where a deadline would fail it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(600*time.Millisecond, cancel)
	var counts Counts
	Floor(ctx, checks, cred, 50*time.Millisecond, time.Second, &counts)
	runs, failed := counts.Snapshot()
	for _, k := range Kinds {
		if runs[k] < 5 || failed[k] != 0 {
			t.Errorf("%s: %d runs, %d failed; want at least 5, none failed", k, runs[k], failed[k])
		}
	}
	for len(acceptedCh) > 0 {
		<-acceptedCh
		accepted++
	}
	if accepted < runs["tcp"] {
		t.Errorf("tcp: %d connections accepted for %d runs", accepted, runs["tcp"])
	}
	web.Close()
	// One connection for Once, one kept by the floor for all its runs.
	if n := httpConns.Load(); n != 2 {
		t.Errorf("http: %d connections, want 2 (the floor keeps its own)", n)
	}
}

func sipAnswer(req string) string {
	var out strings.Builder
	out.WriteString("SIP/2.0 200 OK\r\n")
	for l := range strings.SplitSeq(req, "\r\n") {
		name, _, _ := strings.Cut(l, ":")
		switch strings.ToLower(name) {
		case "via", "from", "call-id", "cseq", "to":
			out.WriteString(l + "\r\n")
		}
	}
	out.WriteString("Content-Length: 0\r\n\r\n")
	return out.String()
}

func sipUDPPeer(t *testing.T) string {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort([]byte(sipAnswer(string(buf[:n]))), from)
		}
	}()
	return c.LocalAddr().String()
}

func sipTCPPeer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var head strings.Builder
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					head.WriteString(line)
					if line == "\r\n" {
						if _, err := c.Write([]byte(sipAnswer(head.String()))); err != nil {
							return
						}
						head.Reset()
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
