package check

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

func run(t *testing.T, c Checker, timeout time.Duration) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	r := c.Run(ctx)
	// Every check must return by its deadline, whatever the peer does.
	if el := time.Since(start); el > timeout+250*time.Millisecond {
		t.Errorf("%s run took %v with a %v timeout", c.Kind(), el, timeout)
	}
	return r
}

func wantOK(t *testing.T, what string, r Result) {
	t.Helper()
	if !r.OK || r.NoVerdict {
		t.Fatalf("%s: %+v, want healthy", what, r)
	}
}

func wantFail(t *testing.T, what string, r Result, class events.ErrorClass) {
	t.Helper()
	if r.OK || r.Class != class || r.Err == nil {
		t.Fatalf("%s: ok=%v class=%q err=%v, want failure of class %q", what, r.OK, r.Class, r.Err, class)
	}
}

func sipCheck(t *testing.T, port int, transport sipoptions.Transport, codes []string) *SIP {
	t.Helper()
	cs, err := ParseCodes(codes)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewSIP(fmt.Sprintf("127.0.0.1:%d", port), sipoptions.Options{Transport: transport, T1: 50 * time.Millisecond}, cs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Real Kamailio over UDP and TCP: 200 is healthy, 503 is not, and a frozen
// Kamailio (SIGSTOP: the kernel still accepts TCP, nothing answers) is a
// timeout within the deadline; thawed, it is healthy again on the same check.
func TestSIPAgainstKamailio(t *testing.T) {
	k, ok, busy := startKamailio(t)
	for _, tr := range []sipoptions.Transport{sipoptions.UDP, sipoptions.TCP} {
		c := sipCheck(t, ok, tr, DefaultSIPCodes)
		wantOK(t, string(tr)+" 200", run(t, c, time.Second))
		if !strings.HasPrefix(c.Target(), string(tr)+":") {
			t.Errorf("target %q", c.Target())
		}
	}
	r := run(t, sipCheck(t, busy, sipoptions.UDP, DefaultSIPCodes), time.Second)
	wantFail(t, "503", r, events.ErrorUnhealth)
	if r.Figures["sip_status"] != 503 {
		t.Fatalf("figures %v", r.Figures)
	}
	// A stricter operator: only 2xx counts.
	wantOK(t, "only 2xx", run(t, sipCheck(t, ok, sipoptions.UDP, []string{"2xx"}), time.Second))

	udp, tcp := sipCheck(t, ok, sipoptions.UDP, DefaultSIPCodes), sipCheck(t, ok, sipoptions.TCP, DefaultSIPCodes)
	wantOK(t, "tcp before freeze", run(t, tcp, time.Second))
	k.Signal(t, syscall.SIGSTOP)
	wantFail(t, "frozen udp", run(t, udp, 200*time.Millisecond), events.ErrorTimeout)
	wantFail(t, "frozen tcp", run(t, tcp, 200*time.Millisecond), events.ErrorTimeout)
	k.Signal(t, syscall.SIGCONT)
	wantOK(t, "thawed udp", run(t, udp, 2*time.Second))
	wantOK(t, "thawed tcp", run(t, tcp, 2*time.Second))
}

func TestSIPRefusedOverTCP(t *testing.T) {
	wantFail(t, "nothing listening", run(t, sipCheck(t, porttest.Port(t), sipoptions.TCP, DefaultSIPCodes), time.Second), events.ErrorRefused)
}

// SIPp answering like Asterisk does to an unknown source: 401 is alive by
// default, and unhealthy for an operator who asks for 2xx only.
func TestSIPAsteriskLike401(t *testing.T) {
	port := startSIPp(t)
	wantOK(t, "401 default", run(t, sipCheck(t, port, sipoptions.UDP, DefaultSIPCodes), 2*time.Second))
	wantFail(t, "401 when 2xx required", run(t, sipCheck(t, port, sipoptions.UDP, []string{"2xx"}), 2*time.Second), events.ErrorUnhealth)
}

func TestDNSAgainstBIND(t *testing.T) {
	named, addr := startNamed(t)
	mk := func(name, typ string) *DNS {
		d, err := NewDNS(addr, name, typ, false)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	wantOK(t, "SOA", run(t, mk("voip.test", "SOA"), time.Second))
	r := run(t, mk("sip.voip.test.", "A"), time.Second)
	wantOK(t, "A", r)
	if r.Figures["dns_answers"] != 1 {
		t.Fatalf("figures %v", r.Figures)
	}
	wantFail(t, "NXDOMAIN", run(t, mk("gone.voip.test", "A"), time.Second), events.ErrorUnhealth)
	wantFail(t, "no AAAA", run(t, mk("sip.voip.test", "AAAA"), time.Second), events.ErrorUnhealth)
	wantFail(t, "zone not served", run(t, mk("other.test", "SOA"), time.Second), events.ErrorUnhealth)
	named.Signal(t, syscall.SIGSTOP)
	wantFail(t, "frozen named", run(t, mk("voip.test", "SOA"), 200*time.Millisecond), events.ErrorTimeout)
	named.Signal(t, syscall.SIGCONT)
	if _, err := NewDNS(addr, "x", "BOGUS", false); err == nil {
		t.Fatal("unknown type accepted")
	}
}

func TestHTTP(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "status: all good") })
	mux.HandleFunc("/err", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "broken", 500) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	slow := make(chan struct{})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-slow:
		case <-r.Context().Done():
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer close(slow)
	codes2xx, _ := ParseCodes([]string{"2xx"})
	mk := func(path string, body string) *HTTP {
		var re *regexp.Regexp
		if body != "" {
			re = regexp.MustCompile(body)
		}
		h := NewHTTP(srv.URL+path, codes2xx, re, false)
		t.Cleanup(func() { h.Close() })
		return h
	}
	wantOK(t, "200", run(t, mk("/ok", ""), time.Second))
	wantOK(t, "200 with body match", run(t, mk("/ok", "all good"), time.Second))
	wantOK(t, "redirect followed, like wget", run(t, mk("/moved", "all good"), time.Second))
	wantFail(t, "body mismatch", run(t, mk("/ok", "^down"), time.Second), events.ErrorUnhealth)
	r := run(t, mk("/err", ""), time.Second)
	wantFail(t, "500", r, events.ErrorUnhealth)
	if r.Figures["http_status"] != 500 {
		t.Fatalf("figures %v", r.Figures)
	}
	wantFail(t, "slow", run(t, mk("/slow", ""), 150*time.Millisecond), events.ErrorTimeout)

	tls := httptest.NewTLSServer(mux)
	defer tls.Close()
	wantOK(t, "https, verification skipped", run(t, NewHTTP(tls.URL+"/ok", codes2xx, nil, true), time.Second))
	if r := run(t, NewHTTP(tls.URL+"/ok", codes2xx, nil, false), time.Second); r.OK {
		t.Fatal("self-signed certificate accepted without insecure_skip_verify")
	}
}

func TestTCPCheck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	wantOK(t, "listening", run(t, NewTCP(addr), time.Second))
	ln.Close()
	wantFail(t, "closed", run(t, NewTCP(addr), time.Second), events.ErrorRefused)
}

func TestExec(t *testing.T) {
	wantOK(t, "true", run(t, NewExec([]string{"true"}, nil), time.Second))
	r := run(t, NewExec([]string{"sh", "-c", "echo 'Unable to connect to remote asterisk'; exit 1"}, nil), time.Second)
	wantFail(t, "exit 1", r, events.ErrorUnhealth)
	if !strings.Contains(r.Err.Error(), "Unable to connect") || r.Figures["exit_code"] != 1 {
		t.Fatalf("err %v figures %v: want the output and exit code", r.Err, r.Figures)
	}
	// A hung command (and the child it forked, holding stdout) is killed at the deadline.
	start := time.Now()
	wantFail(t, "hung", run(t, NewExec([]string{"sh", "-c", "sleep 30 & sleep 30"}, nil), 150*time.Millisecond), events.ErrorTimeout)
	if el := time.Since(start); el > time.Second {
		t.Fatalf("hung command returned after %v", el)
	}
	if r := run(t, NewExec([]string{"/nonexistent/asterisk"}, nil), time.Second); r.OK || r.Class != events.ErrorOther {
		t.Fatalf("missing binary: %+v", r)
	}
}

func TestICMPLoopback(t *testing.T) {
	c, err := NewICMP("127.0.0.1", ICMPAuto)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, c, time.Second)
	if !r.OK && strings.Contains(fmt.Sprint(r.Err), "ping_group_range") {
		t.Skipf("neither a raw socket nor an unprivileged ping socket here: %v", r.Err)
	}
	wantOK(t, "loopback", r)
	// Twice on one check: sequence numbers advance and still match.
	wantOK(t, "loopback again", run(t, c, time.Second))
	// 192.0.2.1 (TEST-NET-1) is not on loopback and has no route in a test
	// namespace: no reply.
	if _, err := NewICMP("not-an-ip", ICMPAuto); err == nil {
		t.Fatal("bad address accepted")
	}
}

func TestParseCodes(t *testing.T) {
	cs, err := ParseCodes([]string{"2xx", "401", "300-302"})
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]bool{200: true, 299: true, 401: true, 301: true, 303: false, 404: false, 503: false} {
		if cs.Has(code) != want {
			t.Errorf("Has(%d) = %v", code, !want)
		}
	}
	for _, bad := range []string{"2x", "abc", "99", "700", "500-400", "7xx"} {
		if _, err := ParseCodes([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
