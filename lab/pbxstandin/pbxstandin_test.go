package pbxstandin

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/lab/ctlsock"
)

func TestRespond(t *testing.T) {
	opt := "OPTIONS sip:203.0.113.10 SIP/2.0\r\n" +
		"v: SIP/2.0/UDP 203.0.113.20:5060;branch=z9hG4bKa\r\n" +
		"Via: SIP/2.0/UDP 198.51.100.1;branch=z9hG4bKb\r\n" +
		"f: <sip:c@x>;tag=1\r\nt: <sip:203.0.113.10>\r\ni: abc@x\r\nCSeq: 7 OPTIONS\r\nContent-Length: 0\r\n\r\n"
	got := string(Respond([]byte(opt), "n2"))
	for _, want := range []string{
		"SIP/2.0 200 OK\r\n",
		"Via: SIP/2.0/UDP 203.0.113.20:5060;branch=z9hG4bKa\r\nVia: SIP/2.0/UDP 198.51.100.1;branch=z9hG4bKb\r\n",
		"Call-ID: abc@x\r\n", "CSeq: 7 OPTIONS\r\n", "To: <sip:203.0.113.10>;tag=", "Server-Node: n2\r\n",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("reply lacks %q:\n%s", want, got)
		}
	}
	reg := strings.NewReplacer("OPTIONS", "REGISTER").Replace(opt)
	reg = strings.Replace(reg, "Content-Length", "Contact: <sip:c@203.0.113.20>\r\nExpires: 60\r\nContent-Length", 1)
	if got := string(Respond([]byte(reg), "n1")); !strings.HasPrefix(got, "SIP/2.0 200 OK") || !strings.Contains(got, "Contact: <sip:c@203.0.113.20>;expires=60\r\n") {
		t.Fatalf("register reply:\n%s", got)
	}
	inv := strings.NewReplacer("OPTIONS", "INVITE").Replace(opt)
	if got := string(Respond([]byte(inv), "n1")); !strings.HasPrefix(got, "SIP/2.0 501 ") {
		t.Fatalf("invite reply:\n%s", got)
	}
	for name, msg := range map[string]string{
		"ack":       strings.NewReplacer("OPTIONS", "ACK").Replace(opt),
		"response":  "SIP/2.0 200 OK\r\nVia: x\r\nCall-ID: a\r\nCSeq: 1 OPTIONS\r\n\r\n",
		"garbage":   "\x00\x01hello",
		"no callid": "OPTIONS sip:x SIP/2.0\r\nVia: SIP/2.0/UDP a;branch=z9hG4bKa\r\nCSeq: 1 OPTIONS\r\n\r\n",
	} {
		if r := Respond([]byte(msg), "n1"); r != nil {
			t.Errorf("%s answered:\n%s", name, r)
		}
	}
}

func start(t *testing.T) *PBX {
	t.Helper()
	p, err := Start(Config{Node: "n1", SIP: []string{"127.0.0.1:0"},
		AMI: amipeer.Config{Addr: "127.0.0.1:0", Username: "fan", Secret: "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func ping(t *testing.T, method, target string, wait time.Duration) (Answer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return Ping(ctx, method, target)
}

// amiBanner reads the greeting a live Asterisk sends first.
func amiBanner(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	return bufio.NewReader(c).ReadString('\n')
}

func TestModes(t *testing.T) {
	p := start(t)
	sip := p.SIPAddrs()[0]
	for _, m := range []string{"OPTIONS", "REGISTER"} {
		a, err := ping(t, m, sip, 5*time.Second)
		if err != nil || a.Status != "200 OK" || a.Node != "n1" {
			t.Fatalf("%s: %+v %v", m, a, err)
		}
	}
	if b, err := amiBanner(p.AMIAddr()); err != nil || !strings.HasPrefix(b, "Asterisk Call Manager/") {
		t.Fatalf("ami banner %q %v", b, err)
	}

	// Frozen: SIP silent, AMI accepts TCP and says nothing.
	if err := p.SetMode(Frozen); err != nil {
		t.Fatal(err)
	}
	if a, err := ping(t, "OPTIONS", sip, 300*time.Millisecond); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("frozen answered: %+v %v", a, err)
	}
	if b, err := amiBanner(p.AMIAddr()); err == nil || b != "" {
		t.Fatalf("frozen AMI: banner %q err %v", b, err)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("frozen AMI must accept and stay silent, got %v", err)
	}

	// Dead: nothing listens at all.
	if err := p.SetMode(Dead); err != nil {
		t.Fatal(err)
	}
	if len(p.SIPAddrs()) != 0 {
		t.Fatalf("dead still bound: %v", p.SIPAddrs())
	}
	if a, err := ping(t, "OPTIONS", sip, 300*time.Millisecond); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("dead answered: %+v %v", a, err)
	}
	if _, err := net.DialTimeout("tcp", p.AMIAddr(), time.Second); err == nil {
		t.Fatal("dead AMI accepted a connection")
	}

	// Back to normal, on the same addresses.
	if err := p.SetMode(Normal); err != nil {
		t.Fatal(err)
	}
	if a, err := ping(t, "OPTIONS", sip, 5*time.Second); err != nil || a.Node != "n1" {
		t.Fatalf("after revival: %+v %v", a, err)
	}
}

func TestControlSocket(t *testing.T) {
	p := start(t)
	dir, err := os.MkdirTemp("", "fan-pbx")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "run", "control.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stop, err := ListenControl(ctx, p, path)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if r, err := ctlsock.Call(ctx, path, "dead"); err != nil || r != "ok dead\n" || p.Mode() != Dead {
		t.Fatalf("dead: %q %v mode %s", r, err, p.Mode())
	}
	if r, err := ctlsock.Call(ctx, path, "status"); err != nil || !strings.Contains(r, `"mode":"dead"`) {
		t.Fatalf("status: %q %v", r, err)
	}
	if _, err := ctlsock.Call(ctx, path, "explode"); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Fatalf("bad command: %v", err)
	}
	if r, err := ctlsock.Call(ctx, path, "normal"); err != nil || r != "ok normal\n" {
		t.Fatalf("normal: %q %v", r, err)
	}
}
