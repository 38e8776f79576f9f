package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sampleDNSStates is a failover of a name with one primary per site while
// site A is dark: A's server did not answer, B's took the update.
func sampleDNSStates() []DNSServerState {
	return []DNSServerState{
		{Server: "192.0.2.53:53", Outcome: DNSUnreachable, Error: "read tcp 198.51.100.2:40312->192.0.2.53:53: i/o timeout"},
		{Server: "203.0.113.53:53", Outcome: DNSUpdated, Site: "site-b", Records: "[A 203.0.113.20]", Serial: 7},
	}
}

// TestDNSGolden pins the wire form of the per-server fields of a DNS
// executor's result and correction; -update rewrites the files.
func TestDNSGolden(t *testing.T) {
	for name, p := range map[string]Payload{
		"command.result.dns": CommandResult{CommandID: "0193a1b2-0000-7000-8000-000000000002", CommandType: TypeClaimIP, Node: "site-b",
			Group: "web", Outcome: OutcomeApplied, Steps: []Step{{Name: "received", At: goldenTime},
				{Name: "dns_verified:203.0.113.53:53", At: goldenTime.Add(4 * time.Millisecond), ElapsedMS: 4}},
			DNS: sampleDNSStates()},
		"address.correction.dns": AddressCorrection{Group: "web", Node: "site-b", Address: "203.0.113.20/32", Kind: CorrectionDNSRealigned,
			Reason: "192.0.2.53:53 served site-a at serial 5", At: goldenTime,
			DNS: []DNSServerState{{Server: "192.0.2.53:53", Outcome: DNSUpdated, Site: "site-b", Records: "[A 203.0.113.20]", Serial: 6}}},
	} {
		t.Run(name, func(t *testing.T) {
			e := goldenEnvelope(t, p)
			got, err := json.MarshalIndent(e, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", name+".golden.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run go test -update): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("wire form of %s changed:\n got: %s\nwant: %s", name, got, want)
			}
			_, dp, err := Decode(want)
			if err != nil {
				t.Fatalf("decode golden: %v", err)
			}
			reenc, _ := json.Marshal(dp)
			orig, _ := json.Marshal(p)
			if !bytes.Equal(reenc, orig) {
				t.Fatalf("payload round trip:\n got: %s\nwant: %s", reenc, orig)
			}
		})
	}
}

// A server's state is refused when it cannot be read as one: no server, an
// unknown outcome, a server left unchanged without the reason, a site that
// is no node name, text beyond the bounds, too many servers.
func TestDNSServerStateBounds(t *testing.T) {
	valid := CommandResult{CommandID: "c", CommandType: TypeClaimIP, Node: "site-b", Group: "web", Outcome: OutcomeApplied, DNS: sampleDNSStates()}
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid result refused: %v", err)
	}
	for name, change := range map[string]func(*DNSServerState){
		"no server":             func(s *DNSServerState) { s.Server = "" },
		"unknown outcome":       func(s *DNSServerState) { s.Outcome = "moved" },
		"unreachable, no error": func(s *DNSServerState) { s.Outcome, s.Error = DNSUnreachable, "" },
		"refused, no error":     func(s *DNSServerState) { s.Outcome, s.Error = DNSRefused, "" },
		"site not a token":      func(s *DNSServerState) { s.Site = "site a" },
		"records too long":      func(s *DNSServerState) { s.Records = strings.Repeat("x", MaxTextLen+1) },
	} {
		r := valid
		r.DNS = sampleDNSStates()
		change(&r.DNS[1])
		if err := r.Validate(); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) {
			t.Errorf("%s: got %v, want a refusal", name, err)
		}
		c := AddressCorrection{Group: "web", Node: "site-b", Address: "203.0.113.20/32", Kind: CorrectionDNSRealigned, At: goldenTime, DNS: r.DNS}
		if err := c.Validate(); err == nil {
			t.Errorf("%s: correction accepted", name)
		}
	}
	many := valid
	many.DNS = make([]DNSServerState, maxDNSServers+1)
	for i := range many.DNS {
		many.DNS[i] = sampleDNSStates()[1]
	}
	if err := many.Validate(); !errors.Is(err, ErrInvalidField) {
		t.Errorf("%d servers: got %v, want a refusal", len(many.DNS), err)
	}
}

// A DNS executor's correction names the site the name points at, not the
// executor's own node, as its results do: readers take the subject's site
// (bound by permissions) as its identity. An address correction without
// DNS servers still must come from its own node.
func TestDNSCorrectionVoice(t *testing.T) {
	src := Source{Service: "ipmover", Node: "witness"}
	dnsCorr := AddressCorrection{Group: "web", Node: "site-b", Address: "203.0.113.20/32", Kind: CorrectionDNSRealigned,
		At: goldenTime, DNS: sampleDNSStates()[1:]}
	env, err := New(src, "lab", dnsCorr)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifySubject(AddressCorrectionSubject("lab", "site-b"), env, &dnsCorr); err != nil {
		t.Fatalf("the dns executor's correction refused: %v", err)
	}
	ipCorr := AddressCorrection{Group: "pbx", Node: "n2", Address: "198.51.100.10/24", Kind: CorrectionReadded, At: goldenTime}
	env, err = New(Source{Service: "ipmover", Node: "n1"}, "lab", ipCorr)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifySubject(AddressCorrectionSubject("lab", "n2"), env, &ipCorr); !errors.Is(err, ErrSubjectMismatch) {
		t.Fatalf("n1 speaking for n2's address: %v, want refused", err)
	}
}
