package ami

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWireReaderFraming(t *testing.T) {
	in := "Response: Success\r\nActionID: a\r\nMessage:   spaced\r\n\r\n" +
		"\r\n\r\n" + // empty lines between messages
		"Event: X\nKey: bare LF\n\n" +
		"Broken line\r\nActionID: lost\r\n\r\n" +
		"Response: Success\r\nOutput: 1\r\nOutput: \r\nOutput: 3\r\nEmpty:\r\n\r\n"
	r := newWireReader(strings.NewReader(in))
	m, err := r.next()
	if err != nil || m.get("response") != "Success" || m.actionID() != "a" || m.get("Message") != "spaced" {
		t.Fatalf("first: %+v %v", m, err)
	}
	if m.String() != "Response: Success\r\nActionID: a\r\nMessage: spaced\r\n\r\n" {
		t.Errorf("String = %q", m.String())
	}
	m, err = r.next()
	if err != nil || !m.isEvent() || m.get("Key") != "bare LF" {
		t.Fatalf("second: %+v %v", m, err)
	}
	// A line that is no header costs its message, not the stream.
	if _, err := r.next(); !errors.Is(err, errMalformed) {
		t.Fatalf("malformed: %v", err)
	}
	m, err = r.next()
	if err != nil || strings.Join(m.values("Output"), "|") != "1||3" || m.get("Empty") != "" || m.g.Len() != 5 {
		t.Fatalf("after the malformed one: %+v %v", m, err)
	}
	if _, err := r.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("at the end: %v", err)
	}
}

// A peer that never ends a line or a message cannot make the reader buffer
// without end: past the limits the stream ends with ErrProtocol.
func TestWireReaderLimits(t *testing.T) {
	for name, in := range map[string]string{
		"line":   "Event: " + strings.Repeat("x", maxLine) + "\r\n\r\n",
		"fields": "Event: X\r\n" + strings.Repeat("A: b\r\n", maxFields) + "\r\n",
		"bytes":  "Event: X\r\n" + strings.Repeat("Output: "+strings.Repeat("y", 1000)+"\r\n", maxMessage/1000+1) + "\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := newWireReader(strings.NewReader(in)).next()
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		})
	}
	// Just under the line limit is fine, across several buffer fills.
	long := strings.Repeat("z", maxLine-len("Val: ")-2)
	m, err := newWireReader(strings.NewReader("Val: " + long + "\r\n\r\n")).next()
	if err != nil || m.get("Val") != long {
		t.Fatalf("long line: %v", err)
	}
}

func TestLoginRefusesWrongBannerAndLineBreaks(t *testing.T) {
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
			_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
			_ = c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, Config{Addr: ln.Addr().String(), Username: "u", Secret: "s"}, nil); !errors.Is(err, ErrProtocol) {
		t.Errorf("SSH banner: %v, want ErrProtocol", err)
	}
	if _, err := Dial(ctx, Config{Addr: ln.Addr().String(), Username: "u", Secret: "s\r\nAction: Logoff"}, nil); err == nil {
		t.Error("a secret with a line break was sent")
	}
}

// The reader never gives up on a message because nobody took it in time:
// answers that arrive while the reader is held up (a starved scheduler, a
// busy dispatch) all reach their callers. A reader that waited a bounded
// time and then dropped lost one answer in forty under a loaded -race run.
func TestHeldUpReaderLosesNothing(t *testing.T) {
	const n = 60
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	allRead, release := make(chan struct{}), make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte(bannerStart + "11.0.0\r\n"))
		r := newWireReader(c)
		if _, err := r.next(); err != nil { // Login
			return
		}
		_, _ = c.Write([]byte("Response: Success\r\nMessage: Authentication accepted\r\n\r\n"))
		var ids []string
		for len(ids) < n {
			m, err := r.next()
			if err != nil {
				return
			}
			ids = append(ids, m.actionID())
		}
		close(allRead)
		<-release
		// Every answer in one burst, each a list of three messages.
		w := bufio.NewWriter(c)
		for _, id := range ids {
			fmt.Fprintf(w, "Response: Success\r\nActionID: %s\r\nEventList: start\r\n\r\n", id)
			fmt.Fprintf(w, "Event: DBGetResponse\r\nActionID: %s\r\nVal: v-%s\r\n\r\n", id, id)
			fmt.Fprintf(w, "Event: DBGetComplete\r\nActionID: %s\r\nEventList: Complete\r\nListItems: 1\r\n\r\n", id)
		}
		_ = w.Flush()
		_, _ = io.Copy(io.Discard, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, Config{Addr: ln.Addr().String(), Username: "u", Secret: "s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Action(ctx, "DBGet", F("Family", "f"), F("Key", "k"))
			if err != nil || len(r.Events()) != 1 || r.Events()[0].Field("Val") != "v-"+r.Field("ActionID") {
				errs <- fmt.Errorf("%q %v", r.String(), err)
			}
		}()
	}
	select {
	case <-allRead:
	case <-ctx.Done():
		t.Fatal("the actions never reached the peer")
	}
	// Hold the reader at its first hand-over for far longer than any
	// scheduler hiccup while the whole burst arrives.
	c.mu.Lock()
	close(release)
	time.Sleep(200 * time.Millisecond) // the reader is stalled on purpose; nothing to poll
	c.mu.Unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// goami2.Parse panics on an input that stops after a CR or inside a header
// name; the reader never hands it one, whatever the stream ends with.
// Header names goami2 does not take (one character, an underscore) and a CR
// inside a value cost their message, not the stream.
func TestWireReaderGoami2Edges(t *testing.T) {
	for _, in := range []string{"A", "\r", "Ab:\r", "Ab: x\r", "Event: X\r\nAb: x\r"} {
		if _, err := newWireReader(strings.NewReader(in)).next(); !errors.Is(err, io.EOF) {
			t.Errorf("%q: err = %v, want io.EOF", in, err)
		}
	}
	r := newWireReader(strings.NewReader("Event: X\r\nA: b\r\n\r\n" + "Event: X\r\nX_Y: z\r\n\r\n" +
		"Event: X\r\nAb: x\ry\r\n\r\n" + "Event: Y\r\nCall-ID: 1\r\n\r\n"))
	for range 3 {
		if _, err := r.next(); !errors.Is(err, errMalformed) {
			t.Fatalf("err = %v, want errMalformed", err)
		}
	}
	if m, err := r.next(); err != nil || m.get("Event") != "Y" || m.get("call-id") != "1" {
		t.Fatalf("after the refused ones: %v %v", m, err)
	}
}
