package keeper

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden SIP messages")

func readSIP(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// What the keeper reads of real messages: requests of the phones (one with
// compact headers, a folded From and a body), the PBX's 481, a phone's 200.
func TestParseGoldenMessages(t *testing.T) {
	for _, tc := range []struct {
		file string
		want message
	}{
		{"bye-from-phone-a.sip", message{request: true, method: "BYE", callID: "callA-c1@198.51.100.21",
			fromTag: "phoneA-tag-c1", toTag: "ast-tag-A-c1", cseq: 2, cseqMethod: "BYE", branch: "z9hG4bK-a-1"}},
		{"reinvite-compact.sip", message{request: true, method: "INVITE", callID: "callA-c1@198.51.100.21",
			fromTag: "phoneA-tag-c1", toTag: "ast-tag-A-c1", cseq: 3, cseqMethod: "INVITE", branch: "z9hG4bK-a-2"}},
		{"481-to-reinvite.sip", message{status: 481, callID: "callA-c1@198.51.100.21",
			fromTag: "phoneA-tag-c1", toTag: "ast-tag-A-c1", cseq: 3, cseqMethod: "INVITE", branch: "z9hG4bK-a-2"}},
		{"200-to-bye.sip", message{status: 200, callID: "ast-callB-c1", fromTag: "ast-tag-B-c1", toTag: "phoneB-tag-c1",
			cseq: CSeqBase, cseqMethod: "BYE", branch: "z9hG4bK00112233445566778899aabbccddeeff"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := parseMessage(readSIP(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("parsed\n %+v\nwant\n %+v", got, tc.want)
			}
			// Bare line feeds read the same.
			lf, err := parseMessage(bytes.ReplaceAll(readSIP(t, tc.file), []byte("\r\n"), []byte("\n")))
			if err != nil || lf != tc.want {
				t.Fatalf("with LF line ends: %+v, %v", lf, err)
			}
		})
	}
}

// A datagram cut after its headers (the first fragment of a large one)
// still gives its headers.
func TestParseFirstFragment(t *testing.T) {
	b := readSIP(t, "reinvite-compact.sip")
	cut := b[:bytes.Index(b, []byte("Content-Type"))+5]
	m, err := parseMessage(cut)
	if err != nil || m.method != "INVITE" || m.callID != "callA-c1@198.51.100.21" {
		t.Fatalf("cut message: %+v, %v", m, err)
	}
}

func TestParseRefuses(t *testing.T) {
	bye := string(readSIP(t, "bye-from-phone-a.sip"))
	for name, tc := range map[string]struct {
		msg  string
		want error
	}{
		"empty":                {"", errMalformed},
		"not SIP":              {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", errMalformed},
		"two Call-IDs":         {strings.Replace(bye, "CSeq:", "i: other\r\nCSeq:", 1), errMalformed},
		"two To":               {strings.Replace(bye, "CSeq:", "t: <sip:x>;tag=y\r\nCSeq:", 1), errMalformed},
		"no CSeq":              {strings.Replace(bye, "CSeq: 2 BYE\r\n", "", 1), errMalformed},
		"CSeq too big":         {strings.Replace(bye, "CSeq: 2 BYE", "CSeq: 4294967296 BYE", 1), errMalformed},
		"CSeq method differs":  {strings.Replace(bye, "CSeq: 2 BYE", "CSeq: 2 INVITE", 1), errMalformed},
		"status 99":            {"SIP/2.0 099 x\r\nCall-ID: a\r\nFrom: <sip:a>\r\nTo: <sip:b>\r\nCSeq: 1 BYE\r\n\r\n", errMalformed},
		"header without colon": {strings.Replace(bye, "Max-Forwards: 70", "Max-Forwards 70", 1), errMalformed},
		"continuation first":   {"BYE sip:x SIP/2.0\r\n more\r\n\r\n", errMalformed},
		"too many headers":     {strings.Replace(bye, "CSeq:", strings.Repeat("X-A: b\r\n", maxHeaders+1)+"CSeq:", 1), errTooLarge},
		"line too long":        {strings.Replace(bye, "CSeq:", "X-A: "+strings.Repeat("b", maxLine)+"\r\nCSeq:", 1), errTooLarge},
		"huge Call-ID":         {strings.Replace(bye, "Call-ID: callA-c1@198.51.100.21", "Call-ID: "+strings.Repeat("c", maxTokenLen+1), 1), errTooLarge},
		"datagram too large":   {bye + strings.Repeat("x", maxMessage), errTooLarge},
	} {
		if _, err := parseMessage([]byte(tc.msg)); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

// The BYE the keeper sends to phone B when phone A hangs up, byte for byte.
func TestBYEGolden(t *testing.T) {
	rec := keptRecord("c1")
	l, err := newLeg(rec.Legs[1], rec.Legs[1].CSeq)
	if err != nil {
		t.Fatal(err)
	}
	req := l.bye
	req.via, req.branch, req.reasonQ = floating, "z9hG4bK00112233445566778899aabbccddeeff", q850NormalClearing
	got := req.encode()
	path := filepath.Join("testdata", "bye-to-phone-b.golden.sip")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if want := readSIP(t, "bye-to-phone-b.golden.sip"); !bytes.Equal(got, want) {
		t.Fatalf("BYE changed:\n got: %q\nwant: %q", got, want)
	}
	// What the phone reads of it is the dialog it knows.
	m, err := parseMessage(got)
	if err != nil {
		t.Fatal(err)
	}
	want := message{request: true, method: "BYE", callID: "ast-callB-c1", fromTag: "ast-tag-B-c1", toTag: "phoneB-tag-c1",
		cseq: CSeqBase, cseqMethod: "BYE", branch: req.branch}
	if m != want {
		t.Fatalf("the BYE reads as %+v, want %+v", m, want)
	}
	if l.dest != phoneB {
		t.Fatalf("sent to %s, want phone B at %s", l.dest, phoneB)
	}
}

func TestNewBranchIsFresh(t *testing.T) {
	a, b := newBranch(), newBranch()
	if a == b || !strings.HasPrefix(a, "z9hG4bK") || len(a) != len("z9hG4bK")+32 {
		t.Fatalf("branches %q %q", a, b)
	}
}

// FuzzParseMessage: the parser never panics on what anyone can send to the
// PBX's port, and what it accepts is within its bounds (go test -fuzz
// FuzzParseMessage ./internal/keeper).
func FuzzParseMessage(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.sip"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("\r\n\r\n"))
	f.Add([]byte("SIP/2.0 200 OK\r\nv: x;branch=\r\ni: a\r\nf: ;tag\r\nt: <>\r\nCSeq: 1 BYE\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMessage(b)
		if err != nil {
			return
		}
		for _, s := range []string{m.callID, m.fromTag, m.toTag, m.branch, m.cseqMethod} {
			if len(s) > maxTokenLen {
				t.Fatalf("accepted a field of %d bytes", len(s))
			}
		}
		if m.callID == "" || (m.request && m.method != m.cseqMethod) || (!m.request && (m.status < 100 || m.status > 699)) {
			t.Fatalf("accepted %+v", m)
		}
	})
}
