package sipoptions

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzParseMessage: the SIP response parser (datagrams) and the stream
// reader (TCP framing, Content-Length) must never panic on what a peer
// sends, and whatever they accept has what matching needs: a status in
// 100..699 or a request line, a Via branch, a Call-ID and a CSeq method.
// Run: go test -run '^$' -fuzz FuzzParseMessage ./pkg/sipoptions (or make fuzz).
func FuzzParseMessage(f *testing.F) {
	ok := "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKabc;rport=5060\r\n" +
		"From: <sip:fan@192.0.2.1>;tag=1\r\nTo: <sip:192.0.2.2>;tag=2\r\nCall-ID: c1@192.0.2.1\r\n" +
		"CSeq: 1 OPTIONS\r\nContent-Length: 4\r\n\r\nbody"
	f.Add([]byte(ok))
	f.Add([]byte("\r\n\r\n" + ok))
	f.Add([]byte("SIP/2.0 503 Service Unavailable\nv: SIP/2.0/TCP h;branch=b\ni: x\nCSeq: 7 OPTIONS\n\n"))
	f.Add([]byte("OPTIONS sip:x SIP/2.0\r\nVia: SIP/2.0/UDP h;BRANCH=b,\r\n SIP/2.0/UDP g;branch=c\r\nCall-ID: y\r\nCSeq: 1 OPTIONS\r\nContent-Length: -1\r\n\r\n"))
	f.Add([]byte("SIP/2.0 99 x\r\n\r\n"))
	f.Add([]byte("SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP h;branch=b\r\nCall-ID: y\r\nCSeq: 4294967296 OPTIONS\r\nContent-Length: 99999999999\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(how string, m *message) {
			if m.status != 0 && (m.status < 100 || m.status > 699) {
				t.Fatalf("%s accepted status %d", how, m.status)
			}
			if m.status == 0 && m.method == "" {
				t.Fatalf("%s accepted a message with neither status nor method", how)
			}
			if m.branch == "" || m.callID == "" || m.cseqMethod == "" {
				t.Fatalf("%s accepted a message matching cannot use: %+v", how, m)
			}
		}
		if m, err := parseMessage(data); err == nil {
			check("parseMessage", m)
		}
		br := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		for i := 0; i < 8; i++ {
			m, err := readStreamMessage(br)
			if err != nil {
				break
			}
			check("readStreamMessage", m)
		}
	})
}
