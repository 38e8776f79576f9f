package ami

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// FuzzReader: whatever a peer sends on the AMI port (banner, login answer,
// responses, events, garbage, a connection cut anywhere) the client's
// reader must neither panic nor hang: Dial returns, the events channel
// closes once the peer is gone, and every message's accessors work. The
// peer is a real TCP listener writing the input; the client is Dial's.
// Run: go test -run '^$' -fuzz FuzzReader ./pkg/ami (or make fuzz).
func FuzzReader(f *testing.F) {
	const login = "Asterisk Call Manager/9.0.0\r\nResponse: Success\r\nMessage: Authentication accepted\r\n\r\n"
	f.Add([]byte(login))
	f.Add([]byte(login + "Event: FullyBooted\r\nPrivilege: system,all\r\nStatus: Fully Booted\r\n\r\n"))
	f.Add([]byte(login + "Response: Follows\r\nActionID: x\r\nOutput: 3 active channels\r\nOutput: 1 active call\r\n\r\n"))
	f.Add([]byte(login + "Response: Success\r\nEventList: start\r\nActionID: fan-1\r\n\r\nEvent: DBGetTreeResponse\r\nActionID: fan-1\r\nKey: /a\r\nVal: b\r\n\r\nEvent: DBGetTreeComplete\r\nActionID: fan-1\r\nEventList: Complete\r\nListItems: 1\r\n\r\n"))
	f.Add([]byte("Asterisk Call Manager/9.0.0\r\nResponse: Error\r\nMessage: Authentication failed\r\n\r\n"))
	f.Add([]byte(login + "Event: x\r\n" + strings.Repeat("A: b\r\n", 200)))
	f.Add([]byte(login + "\r\n\r\n:\r\n::::\r\n\r\nEvent\r\n\r\n"))
	f.Add([]byte("SSH-2.0-OpenSSH_9.2\r\n"))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		served := make(chan struct{})
		go func() {
			defer close(served)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = c.Write(data)
			_ = c.(*net.TCPConn).CloseWrite()
			// Read the Login and any action until the client hangs up.
			_, _ = io.Copy(io.Discard, c)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cl, err := Dial(ctx, Config{Addr: ln.Addr().String(), Username: "fan", Secret: "s", Events: true,
			LoginTimeout: 500 * time.Millisecond, DialTimeout: time.Second}, nil)
		if err == nil {
			actx, acancel := context.WithTimeout(ctx, 50*time.Millisecond)
			r, _ := cl.Action(actx, "Command", F("Command", "core show channels count"))
			acancel()
			_ = r.Fields()
			_, _ = ParseChannelsCount(r.Outputs())
			for ev := range cl.Events() {
				_ = ev.Name()
				_ = ev.Fields()
				_ = ev.String()
			}
			cl.Close()
		}
		<-served
		_, _ = ParseChannelsCount(strings.Split(string(data), "\n"))
	})
}
