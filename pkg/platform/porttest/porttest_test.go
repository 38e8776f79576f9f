package porttest

import (
	"net"
	"testing"
)

func TestAddrCanBeListenedOn(t *testing.T) {
	addr := Addr(t)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatalf("listen on udp %s: %v", addr, err)
	}
	u.Close()
}
