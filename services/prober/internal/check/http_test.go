package check

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// An HTTP check keeps its connection between runs and reads on it itself;
// these are the ways a server ends or spoils that connection, each met with
// a healthy verdict where the server is healthy and a new connection where
// the old one cannot carry the next run.
func TestHTTPKeptConnection(t *testing.T) {
	var opened atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "status: all good") })
	mux.HandleFunc("/close", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Connection", "close")
		fmt.Fprint(w, "ok, and goodbye")
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "all good")
		_, _ = w.Write(make([]byte, 2<<20))
	})
	// A body that never ends: only the status is asked for.
	mux.HandleFunc("/endless", func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 32<<10)
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/auth", func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "admin" || p != "s3cret" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, "welcome")
	})
	mux.HandleFunc("/agent", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, r.UserAgent()) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	codes2xx, _ := ParseCodes([]string{"2xx"})
	mk := func(url, body string) *HTTP {
		var re *regexp.Regexp
		if body != "" {
			re = regexp.MustCompile(body)
		}
		h := NewHTTP(url, codes2xx, re, false)
		t.Cleanup(func() { h.Close() })
		return h
	}
	conns := func(what string, want int64) {
		t.Helper()
		if got := opened.Load(); got != want {
			t.Fatalf("%s: %d connections opened in all, want %d", what, got, want)
		}
	}

	ok := mk(srv.URL+"/ok", "all good")
	for range 5 {
		wantOK(t, "200 on a kept connection", run(t, ok, time.Second))
	}
	conns("five runs", 1)

	// The server closes its idle connections (a keep-alive timeout, a
	// restart): the next run is sent again on a new one, and is healthy.
	srv.CloseClientConnections()
	wantOK(t, "after the server closed the idle connection", run(t, ok, time.Second))
	conns("after the close", 2)

	bye := mk(srv.URL+"/close", "goodbye")
	wantOK(t, "Connection: close", run(t, bye, time.Second))
	wantOK(t, "Connection: close, again", run(t, bye, time.Second))
	conns("each Connection: close answer ends its connection", 4)

	big := mk(srv.URL+"/big", "^all good")
	wantOK(t, "a body past what is matched", run(t, big, time.Second))
	wantOK(t, "a body past what is matched, again", run(t, big, time.Second))
	conns("a long rest of a body is not read to keep the connection", 6)

	endless := mk(srv.URL+"/endless", "")
	start := time.Now()
	wantOK(t, "status only, body endless", run(t, endless, 2*time.Second))
	if el := time.Since(start); el > time.Second {
		t.Fatalf("a body that never ends held the run %v", el)
	}

	u := strings.Replace(srv.URL, "http://", "http://admin:s3cret@", 1)
	wantOK(t, "credentials in the URL sent as basic authentication", run(t, mk(u+"/auth", "welcome"), time.Second))
	wantFail(t, "without them", run(t, mk(srv.URL+"/auth", ""), time.Second), events.ErrorUnhealth)
	wantOK(t, "user agent", run(t, mk(srv.URL+"/agent", "^fan-prober$"), time.Second))

	// A cancel (the prober stopping) ends a run at once, not at its deadline.
	slow := mk(srv.URL+"/slow", "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	time.AfterFunc(100*time.Millisecond, cancel)
	start = time.Now()
	if r := slow.Run(ctx); r.OK || time.Since(start) > 2*time.Second {
		t.Fatalf("cancelled run: ok=%v after %v", r.OK, time.Since(start))
	}
	// And a run after a timeout starts on a fresh connection.
	wantFail(t, "slow", run(t, slow, 150*time.Millisecond), events.ErrorTimeout)
}

// A server that sends more than one answer to a GET: the extra bytes are
// not taken for the next run's answer.
func TestHTTPExtraBytesAfterAnswer(t *testing.T) {
	var accepted atomic.Int64
	ln := serveTCP(t, func(c net.Conn) {
		n := accepted.Add(1)
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			// The first connection's first answer carries a stray
			// second one saying 503.
			answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
			if n == 1 {
				answer += "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
			}
			n = 0
			if _, err := c.Write([]byte(answer)); err != nil {
				return
			}
		}
	})
	codes2xx, _ := ParseCodes([]string{"2xx"})
	h := NewHTTP("http://"+ln.Addr().String()+"/", codes2xx, nil, false)
	defer h.Close()
	wantOK(t, "first answer", run(t, h, time.Second))
	wantOK(t, "the stray 503 is not this run's answer", run(t, h, time.Second))
	if got := accepted.Load(); got != 2 {
		t.Fatalf("%d connections, want 2 (the one with stray bytes dropped)", got)
	}
}

// A server that answers with something that is not HTTP fails the run,
// and a server gone between runs fails it as refused.
func TestHTTPNotHTTPAndGone(t *testing.T) {
	ln := serveTCP(t, func(c net.Conn) {
		buf := make([]byte, 1024)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("SIP/2.0 200 OK\r\n\r\n"))
	})
	codes2xx, _ := ParseCodes([]string{"2xx"})
	h := NewHTTP("http://"+ln.Addr().String()+"/", codes2xx, nil, false)
	defer h.Close()
	if r := run(t, h, time.Second); r.OK {
		t.Fatalf("a SIP answer judged a healthy HTTP one: %+v", r)
	}
	ln.Close()
	wantFail(t, "server gone", run(t, h, time.Second), events.ErrorRefused)
}

// serveTCP answers every connection to a loopback listener with serve, on
// a goroutine of its own, and closes the connection after; the listener
// closes with the test.
func serveTCP(t *testing.T, serve func(net.Conn)) net.Listener {
	t.Helper()
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
				serve(c)
			}()
		}
	}()
	return ln
}
