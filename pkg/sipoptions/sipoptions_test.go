package sipoptions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// responder is an in-test SIP peer on 127.0.0.1. For each request it sends whatever
// replies reply returns, in order.
type responder struct {
	conn  *net.UDPConn
	mu    sync.Mutex
	reqs  []*message
	raws  []string
	froms []netip.AddrPort
}

func newResponder(t *testing.T, reply func(req *message, raw string) [][]byte) *responder {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	r := &responder{conn: conn}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			raw := string(buf[:n])
			req, err := parseMessage(buf[:n])
			if err != nil {
				t.Errorf("responder: unparsable request: %v\n%s", err, raw)
				continue
			}
			r.mu.Lock()
			r.reqs, r.raws, r.froms = append(r.reqs, req), append(r.raws, raw), append(r.froms, from)
			r.mu.Unlock()
			for _, out := range reply(req, raw) {
				if _, err := conn.WriteToUDPAddrPort(out, from); err != nil {
					return
				}
			}
		}
	}()
	return r
}

func (r *responder) addr() string { return r.conn.LocalAddr().String() }

// response echoes the request's matching headers, with optional overrides.
func response(req *message, status int, reason string, mod func(h map[string]string), extra ...string) []byte {
	h := map[string]string{
		"Via":     req.header("via") + ";received=127.0.0.1",
		"From":    req.header("from"),
		"To":      req.header("to") + ";tag=srv1",
		"Call-ID": req.callID,
		"CSeq":    fmt.Sprintf("%d %s", req.cseq, req.cseqMethod),
	}
	if mod != nil {
		mod(h)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SIP/2.0 %d %s\r\n", status, reason)
	for _, k := range []string{"Via", "From", "To", "Call-ID", "CSeq"} {
		fmt.Fprintf(&b, "%s: %s\r\n", k, h[k])
	}
	for _, e := range extra {
		b.WriteString(e + "\r\n")
	}
	b.WriteString("Content-Length: 0\r\n\r\n")
	return []byte(b.String())
}

func withBranch(req *message, branch string) func(map[string]string) {
	return func(h map[string]string) {
		h["Via"] = strings.Replace(h["Via"], req.branch, branch, 1)
	}
}

func TestPingRequestFormatAndReply(t *testing.T) {
	r := newResponder(t, func(req *message, _ string) [][]byte {
		return [][]byte{response(req, 200, "OK", nil, "Server-Node: n1")}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rep, err := Ping(ctx, r.addr())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != 200 || rep.Reason != "OK" || rep.ServerNode != "n1" || rep.RTT <= 0 {
		t.Fatalf("reply = %+v", rep)
	}
	if rep.From.String() != r.addr() {
		t.Errorf("reply from %s, want %s", rep.From, r.addr())
	}

	r.mu.Lock()
	req, raw, from := r.reqs[0], r.raws[0], r.froms[0]
	r.mu.Unlock()
	if req.method != "OPTIONS" || req.uri != "sip:"+r.addr() {
		t.Errorf("request line: %s %s", req.method, req.uri)
	}
	if !strings.HasSuffix(raw, "\r\n\r\n") || strings.Contains(strings.ReplaceAll(raw, "\r\n", ""), "\n") {
		t.Errorf("request must use CRLF and end with an empty line:\n%q", raw)
	}
	via := req.header("via")
	wantVia := "SIP/2.0/UDP " + from.String() + ";"
	if !strings.HasPrefix(via, wantVia) || !strings.Contains(via, ";rport") {
		t.Errorf("Via %q, want prefix %q and rport", via, wantVia)
	}
	if !strings.HasPrefix(req.branch, "z9hG4bK") || len(req.branch) < 7+16 {
		t.Errorf("branch %q", req.branch)
	}
	checks := map[string]string{"max-forwards": "70", "content-length": "0", "cseq": "1 OPTIONS", "to": "<sip:" + r.addr() + ">"}
	for k, want := range checks {
		if got := req.header(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if f := req.header("from"); !strings.Contains(f, ";tag=") {
		t.Errorf("From without tag: %q", f)
	}
	if req.callID == "" {
		t.Error("no Call-ID")
	}
}

// A reply must match branch, Call-ID and CSeq; everything else before it is ignored.
func TestPingIgnoresNonMatchingReplies(t *testing.T) {
	r := newResponder(t, func(req *message, _ string) [][]byte {
		return [][]byte{
			response(req, 200, "OK", withBranch(req, "z9hG4bKstale"), "Server-Node: stale-branch"),
			response(req, 200, "OK", func(h map[string]string) { h["Call-ID"] = "other@x" }, "Server-Node: wrong-callid"),
			response(req, 200, "OK", func(h map[string]string) { h["CSeq"] = fmt.Sprintf("%d OPTIONS", req.cseq+7) }, "Server-Node: wrong-cseq"),
			response(req, 200, "OK", func(h map[string]string) { h["CSeq"] = fmt.Sprintf("%d INVITE", req.cseq) }, "Server-Node: wrong-method"),
			response(req, 100, "Trying", nil, "Server-Node: provisional"),
			[]byte("garbage\r\n\r\n"),
			response(req, 200, "OK", nil, "Server-Node: right"),
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rep, err := Ping(ctx, r.addr())
	if err != nil {
		t.Fatal(err)
	}
	if rep.ServerNode != "right" {
		t.Fatalf("matched %q, want the reply with the right branch, Call-ID and CSeq", rep.ServerNode)
	}
}

func TestPingTimeout(t *testing.T) {
	r := newResponder(t, func(*message, string) [][]byte { return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Ping(ctx, r.addr())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if el := time.Since(start); el < 90*time.Millisecond || el > time.Second {
		t.Errorf("timed out after %v", el)
	}
}

// A late reply to a probe that already timed out must not satisfy the next probe.
func TestPingerLateReplyToEarlierProbe(t *testing.T) {
	var mu sync.Mutex
	var first *message
	r := newResponder(t, func(req *message, _ string) [][]byte {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = req
			return nil
		}
		return [][]byte{
			response(first, 200, "OK", nil, "Server-Node: late"),
			response(req, 200, "OK", nil, "Server-Node: current"),
		}
	})
	p, err := NewPinger(r.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = p.Ping(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first ping: %v, want timeout", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rep, err := p.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ServerNode != "current" {
		t.Fatalf("second ping matched %q", rep.ServerNode)
	}
}

// High-rate and overlapping probes share one socket and each gets its own reply.
func TestPingerReusesSocketConcurrently(t *testing.T) {
	r := newResponder(t, func(req *message, _ string) [][]byte {
		return [][]byte{response(req, 200, "OK", nil, "Server-Node: "+req.callID)}
	})
	p, err := NewPinger(r.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for range n {
		<-tick.C
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			rep, err := p.Ping(ctx)
			if err != nil {
				errs <- err
				return
			}
			if !strings.HasSuffix(rep.ServerNode, "@"+p.LocalAddr().Addr().String()) {
				errs <- fmt.Errorf("odd Server-Node %q", rep.ServerNode)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	calls, branches := map[string]bool{}, map[string]bool{}
	for i, req := range r.reqs {
		if r.froms[i] != p.LocalAddr() {
			t.Errorf("request %d from %s, want the one socket %s", i, r.froms[i], p.LocalAddr())
		}
		calls[req.callID], branches[req.branch] = true, true
	}
	if len(r.reqs) != n || len(calls) != n || len(branches) != n {
		t.Errorf("%d requests, %d Call-IDs, %d branches; want %d distinct each", len(r.reqs), len(calls), len(branches), n)
	}
}

func TestPingerClose(t *testing.T) {
	asked := make(chan struct{}, 1)
	r := newResponder(t, func(*message, string) [][]byte {
		select {
		case asked <- struct{}{}:
		default:
		}
		return nil
	})
	p, err := NewPinger(r.addr())
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := p.Ping(context.Background())
		errc <- err
	}()
	// Closed while the ping waits for its answer.
	select {
	case <-asked:
	case <-time.After(5 * time.Second):
		t.Fatal("the ping's request never arrived")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("pending ping: %v, want ErrClosed", err)
	}
	if _, err := p.Ping(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("ping after close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestParseResponseForms(t *testing.T) {
	raw := "SIP/2.0 486 Busy Here\r\n" +
		"v: SIP/2.0/UDP 192.0.2.1:5060;BRANCH=z9hG4bKabc;rport=5060, SIP/2.0/UDP 192.0.2.9;branch=z9hG4bKother\r\n" +
		"i: id1@192.0.2.1\r\n" +
		"cseq: 7\r\n  OPTIONS\r\n" +
		"SERVER-NODE: n2\r\n" +
		"l: 0\r\n\r\n"
	m, err := parseMessage([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if m.status != 486 || m.reason != "Busy Here" || m.branch != "z9hG4bKabc" || m.callID != "id1@192.0.2.1" ||
		m.cseq != 7 || m.cseqMethod != "OPTIONS" || m.header("server-node") != "n2" {
		t.Fatalf("parsed %+v", m)
	}
	for _, bad := range []string{"", "HTTP/1.1 200 OK\r\n\r\n", "SIP/2.0 20 OK\r\nVia: x;branch=y\r\n\r\n", "SIP/2.0 200 OK\r\nCall-ID: a\r\n\r\n"} {
		if _, err := parseMessage([]byte(bad)); err == nil {
			t.Errorf("parsed %q without error", bad)
		}
	}
}

// buildOptionsFmt is how requests were built before buildOptions appended
// instead of formatting; the bytes must not change.
func buildOptionsFmt(target, local netip.AddrPort, transport Transport, branch, tag, callID string, cseq uint32) []byte {
	var b bytes.Buffer
	uriParams := ""
	if transport == TCP {
		uriParams = ";transport=tcp"
	}
	host := local.Addr().String()
	if local.Addr().Is6() {
		host = "[" + host + "]"
	}
	fmt.Fprintf(&b, "OPTIONS sip:%s%s SIP/2.0\r\n", target, uriParams)
	fmt.Fprintf(&b, "Via: SIP/2.0/%s %s;branch=%s;rport\r\n", transport.viaName(), local, branch)
	b.WriteString("Max-Forwards: 70\r\n")
	fmt.Fprintf(&b, "From: <sip:fan-probe@%s>;tag=%s\r\n", host, tag)
	fmt.Fprintf(&b, "To: <sip:%s>\r\n", target)
	fmt.Fprintf(&b, "Call-ID: %s\r\n", callID)
	fmt.Fprintf(&b, "CSeq: %d OPTIONS\r\n", cseq)
	fmt.Fprintf(&b, "Contact: <sip:fan-probe@%s>\r\n", local)
	b.WriteString("Accept: application/sdp\r\n")
	b.WriteString("User-Agent: fan-sipclient\r\n")
	b.WriteString("Content-Length: 0\r\n\r\n")
	return b.Bytes()
}

func TestBuildOptionsBytes(t *testing.T) {
	for _, tc := range []struct{ target, local string }{
		{"192.0.2.10:5060", "192.0.2.1:40000"},
		{"[2001:db8::10]:5060", "[2001:db8::1]:40000"},
	} {
		for _, tr := range []Transport{UDP, TCP} {
			dst, src := netip.MustParseAddrPort(tc.target), netip.MustParseAddrPort(tc.local)
			got := buildOptions(dst, src, tr, "z9hG4bKabc", "t1", "c1@x", 4294967295)
			if want := buildOptionsFmt(dst, src, tr, "z9hG4bKabc", "t1", "c1@x", 4294967295); !bytes.Equal(got, want) {
				t.Fatalf("%s %s:\n%q\nwant\n%q", tr, tc.target, got, want)
			}
			m, err := parseMessage(got)
			if err != nil || m.method != "OPTIONS" || m.branch != "z9hG4bKabc" || m.callID != "c1@x" || m.cseq != 4294967295 || m.header("max-forwards") != "70" {
				t.Fatalf("parse own request: %+v, %v", m, err)
			}
		}
	}
}
