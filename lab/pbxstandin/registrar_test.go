package pbxstandin

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
)

// phoneConn is a phone: one UDP socket, its contact.
type phoneConn struct {
	t *testing.T
	c *net.UDPConn
}

func newPhone(t *testing.T) *phoneConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &phoneConn{t: t, c: c}
}

func (ph *phoneConn) port() int { return ph.c.LocalAddr().(*net.UDPAddr).Port }

func (ph *phoneConn) send(to string, msg string) {
	ph.t.Helper()
	a, err := net.ResolveUDPAddr("udp", to)
	if err != nil {
		ph.t.Fatal(err)
	}
	if _, err := ph.c.WriteToUDP([]byte(msg), a); err != nil {
		ph.t.Fatal(err)
	}
}

func (ph *phoneConn) read() (string, *net.UDPAddr) {
	ph.t.Helper()
	_ = ph.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 65535)
	n, from, err := ph.c.ReadFromUDP(buf)
	if err != nil {
		ph.t.Fatalf("phone read: %v", err)
	}
	return string(buf[:n]), from
}

func (ph *phoneConn) register(server, user string, cseq, expires int) string {
	ph.t.Helper()
	ph.send(server, fmt.Sprintf("REGISTER sip:%s SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:%d;branch=z9hG4bK%d;rport\r\n"+
		"Max-Forwards: 70\r\nFrom: <sip:%s@%s>;tag=%d\r\nTo: <sip:%s@%s>\r\nCall-ID: %s-reg@x\r\nCSeq: %d REGISTER\r\n"+
		"Contact: <sip:%s@127.0.0.1:%d>\r\nExpires: %d\r\nUser-Agent: phone\r\nContent-Length: 0\r\n\r\n",
		server, ph.port(), cseq, user, server, cseq, user, server, user, cseq, user, ph.port(), expires))
	r, _ := ph.read()
	return r
}

func TestRegistrarAndOriginate(t *testing.T) {
	p, err := Start(Config{Node: "n1", SIP: []string{"127.0.0.1:0"},
		AMI:       amipeer.Config{Addr: "127.0.0.1:0", Username: "fan", Secret: "s", SystemName: "pbx"},
		Registrar: &amipeer.RegistrarConfig{SendContactStatusOnUpdate: true, RemoveExisting: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	server := p.SIPAddrs()[0]
	ph := newPhone(t)
	uri := fmt.Sprintf("sip:6001@127.0.0.1:%d", ph.port())

	r := ph.register(server, "6001", 1, 300)
	for _, want := range []string{"SIP/2.0 200 OK\r\n", ";rport=" + fmt.Sprint(ph.port()) + ";received=127.0.0.1",
		"Contact: <" + uri + ">;expires=", "Expires: 300\r\n", "CSeq: 1 REGISTER\r\n", "Date: "} {
		if !strings.Contains(r, want) {
			t.Fatalf("200 lacks %q:\n%s", want, r)
		}
	}
	key := "/registrar/contact/" + amipeer.ContactID("6001", uri)
	v, ok := p.AMI().DB()[key]
	if !ok || !strings.Contains(v, `"uri":"`+uri+`"`) || !strings.Contains(v, `"via_port":"`+fmt.Sprint(ph.port())+`"`) ||
		!strings.Contains(v, `"user_agent":"phone"`) || !strings.Contains(v, `"reg_server":"pbx"`) {
		t.Fatalf("stored %q under %s: %v", v, key, p.AMI().DB())
	}

	// Originate PJSIP/6001 reaches the phone with an INVITE to its URI.
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- p.Dial(ctx, p.AMI().Contacts("6001"))
	}()
	inv, from := ph.read()
	if !strings.HasPrefix(inv, "INVITE "+uri+" SIP/2.0\r\n") || from.String() != server {
		t.Fatalf("INVITE from %s:\n%s", from, inv)
	}
	_, hs, _ := parse([]byte(inv))
	busy := "SIP/2.0 486 Busy Here\r\nVia: " + get(hs, "via") + "\r\nFrom: " + get(hs, "from") + "\r\nTo: " + get(hs, "to") +
		";tag=b1\r\nCall-ID: " + get(hs, "call-id") + "\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
	ph.send(server, busy)
	if ack, _ := ph.read(); !strings.HasPrefix(ack, "ACK "+uri) || !strings.Contains(ack, ";tag=b1") {
		t.Fatalf("want the ACK of the 486, got:\n%s", ack)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Expires: 0 removes it.
	if r := ph.register(server, "6001", 2, 0); !strings.Contains(r, "Expires: 0\r\n") || strings.Contains(r, "Contact:") {
		t.Fatalf("unregister answered:\n%s", r)
	}
	if _, ok := p.AMI().DB()[key]; ok {
		t.Fatal("contact stored after Expires: 0")
	}
}
