package app

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// sipUDP answers SIP OPTIONS over UDP on loopback with 200, after delay,
// except while silent and for the requests (retransmissions included) it
// was told to drop.
type sipUDP struct {
	conn     *net.UDPConn
	silent   atomic.Bool
	delay    atomic.Int64 // nanoseconds
	requests atomic.Int64 // received, retransmissions included

	mu      sync.Mutex
	drop    int             // the next drop distinct requests go unanswered
	dropped map[string]bool // their Call-IDs
}

func startSIPUDP(tb testing.TB) *sipUDP {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	s := &sipUDP{conn: c, dropped: map[string]bool{}}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			req := buf[:n]
			s.requests.Add(1)
			if s.silent.Load() || s.dropping(req) {
				continue
			}
			answer := sipAnswer(req)
			if d := time.Duration(s.delay.Load()); d > 0 {
				time.AfterFunc(d, func() { _, _ = c.WriteToUDPAddrPort(answer, from) })
				continue
			}
			_, _ = c.WriteToUDPAddrPort(answer, from)
		}
	}()
	return s
}

func (s *sipUDP) addr() string { return s.conn.LocalAddr().String() }

// dropNext leaves the next n distinct requests unanswered.
func (s *sipUDP) dropNext(n int) {
	s.mu.Lock()
	s.drop = n
	s.mu.Unlock()
}

func (s *sipUDP) dropping(req []byte) bool {
	s.mu.Lock()
	none := s.drop == 0 && len(s.dropped) == 0
	s.mu.Unlock()
	if none {
		return false // the benchmark's path: no parsing
	}
	var callID string
	for _, l := range strings.Split(string(req), "\r\n") {
		if name, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(name, "call-id") {
			callID = strings.TrimSpace(v)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropped[callID] {
		return true
	}
	if s.drop > 0 {
		s.drop--
		s.dropped[callID] = true
		return true
	}
	return false
}

// The decisive run of a peer check waits the target's round trip plus the
// margin, not the whole timeout, so the verdict on a target that stopped
// answering comes fall intervals plus a margin after its last answer. A
// self check, or a peer check with the margin off, waits the timeout.
func TestDecisiveRunWaitsTheMarginNotTheTimeout(t *testing.T) {
	const interval, timeout, fall = 200 * time.Millisecond, 150 * time.Millisecond, 3
	cases := []struct {
		name    string
		role    events.Role
		margin  time.Duration
		hurried bool
	}{
		{"peer check", events.RolePeer, 10 * time.Millisecond, true},
		{"peer check with the margin off", events.RolePeer, -1, false},
		{"self check", events.RoleSelf, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sip := startSIPUDP(t)
			cc := CheckConfig{Name: "pbx", Kind: "sip", Role: tc.role, Address: sip.addr(),
				Interval: config.Duration(interval), Timeout: config.Duration(timeout), Rise: 2, Fall: fall,
				DecisiveMargin: config.Duration(tc.margin)}
			if tc.role == events.RolePeer {
				cc.TargetNode = "n2"
			}
			h := runProber(t, []CheckConfig{cc}, nil)
			if up, _ := h.next(t, 5*time.Second); up == nil || up.To != events.HealthUp {
				t.Fatalf("first transition %+v, want up", up)
			}
			sip.silent.Store(true)
			down, _ := h.next(t, 5*time.Second)
			if down == nil || down.To != events.HealthDown || len(down.Evidence) != fall {
				t.Fatalf("silent target: %+v, want down with %d results", down, fall)
			}
			if said := strings.Contains(down.Reason, "decisive_margin"); said != tc.hurried {
				t.Fatalf("reason %q: mentions the shortened wait %v, want %v", down.Reason, said, tc.hurried)
			}
			// Timer and scheduling delays only lengthen a run, so the bounds
			// below hold on a loaded machine: the runs that waited the
			// timeout took at least it, and a hurried one ends far sooner.
			took := func(e events.Evidence) time.Duration { return time.Duration(e.DurationMS * float64(time.Millisecond)) }
			for i, e := range down.Evidence {
				if e.OK || e.ErrorClass != events.ErrorTimeout {
					t.Fatalf("evidence %d %+v, want a timeout", i, e)
				}
				hurried := tc.hurried && i == fall-1
				switch d := took(e); {
				case !hurried && d < timeout-5*time.Millisecond:
					t.Fatalf("run %d took %v, want the whole timeout %v", i, d, timeout)
				case hurried && d >= timeout*2/3:
					t.Fatalf("decisive run took %v, want about the margin %v (timeout %v)", d, tc.margin, timeout)
				}
			}
		})
	}
}

// The decisive wait is learnt from the answers: a target that always
// answers in 40 ms, twice not at all and then again in 40 ms, stays up with
// a 30 ms margin, where a wait of the margin alone would call it down.
func TestSlowPeerIsNotHurriedDown(t *testing.T) {
	const answerIn, margin = 40 * time.Millisecond, 30 * time.Millisecond
	sip := startSIPUDP(t)
	sip.delay.Store(int64(answerIn))
	h := runProber(t, []CheckConfig{{Name: "peer", Kind: "sip", Role: events.RolePeer, TargetNode: "n2", Address: sip.addr(),
		Interval: config.Duration(200 * time.Millisecond), Timeout: config.Duration(150 * time.Millisecond), Rise: 2, Fall: 3,
		DecisiveMargin: config.Duration(margin)}}, nil)
	if up, _ := h.next(t, 5*time.Second); up == nil || up.To != events.HealthUp {
		t.Fatalf("first transition %+v, want up", up)
	}
	// Five more answers to learn from: a check's runs do not overlap, so
	// the sixth request comes after the fifth answer was read.
	seen := sip.requests.Load()
	waittest.Until(t, 5*time.Second, "five more answers read", func() bool { return sip.requests.Load() >= seen+6 })
	sip.dropNext(2)
	if tr, _ := h.next(t, 2*time.Second); tr != nil {
		t.Fatalf("a peer answering in %v after two lost probes moved: %+v", answerIn, tr)
	}
	sip.mu.Lock()
	lost := len(sip.dropped)
	sip.mu.Unlock()
	if lost != 2 {
		t.Fatalf("%d probes dropped, want 2: the test did not test the decisive run", lost)
	}
}
