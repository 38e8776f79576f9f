package events

import "fmt"

// A DNS executor with several primaries (one authoritative server per site,
// no zone transfer between them) updates each of them on its own. What each
// server serves after a command, or after a server that was out of reach is
// brought in line, is reported server by server: CommandResult.DNS and
// AddressCorrection.DNS.

// DNSServerOutcome is what became of one authoritative server.
type DNSServerOutcome string

const (
	// DNSUpdated: the server took the signed update (its own
	// compare-and-swap) and was seen serving the records at a newer serial.
	DNSUpdated DNSServerOutcome = "updated"
	// DNSAlreadyServed: it served the wanted records already.
	DNSAlreadyServed DNSServerOutcome = "already_served"
	// DNSUnreachable: it did not answer (its site is dark, say). It is
	// brought in line when it answers again.
	DNSUnreachable DNSServerOutcome = "unreachable"
	// DNSRefused: it answered but was not changed: records that match no
	// configured site (never overwritten), a compare-and-swap lost to
	// another writer, an update refused or unsigned, or no newer serial in
	// time. Error says which.
	DNSRefused DNSServerOutcome = "refused"
)

func (o DNSServerOutcome) valid() bool {
	switch o {
	case DNSUpdated, DNSAlreadyServed, DNSUnreachable, DNSRefused:
		return true
	}
	return false
}

// DNSServerState is one authoritative server as the executor last read it.
type DNSServerState struct {
	Server  string           `json:"server"` // host:port
	Outcome DNSServerOutcome `json:"outcome"`
	// Site is the configured site whose records the server serves; empty
	// when it serves records of no site, or could not be read.
	Site string `json:"site,omitempty"`
	// Records is what it serves for the managed types, e.g.
	// "[A 203.0.113.20]"; empty when it could not be read.
	Records string `json:"records,omitempty"`
	Serial  uint32 `json:"serial,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Validate bounds one server's state.
func (s DNSServerState) Validate() error {
	if s.Server == "" {
		return fmt.Errorf("%w: dns server", ErrMissingField)
	}
	if !s.Outcome.valid() {
		return fmt.Errorf("%w: dns outcome %q", ErrInvalidField, s.Outcome)
	}
	if (s.Outcome == DNSUnreachable || s.Outcome == DNSRefused) && s.Error == "" {
		return fmt.Errorf("%w: dns error (a server left unchanged must say why)", ErrMissingField)
	}
	if s.Site != "" {
		if err := ValidToken("dns site", s.Site); err != nil {
			return err
		}
	}
	return firstErr(
		textIn("dns server", s.Server, MaxShortLen),
		textIn("dns records", s.Records, MaxTextLen),
		textIn("dns error", s.Error, MaxTextLen),
	)
}

// maxDNSServers bounds the servers one event reports (the executor takes at
// most 16).
const maxDNSServers = 64

func validateDNSStates(states []DNSServerState) error {
	if err := listIn("dns", len(states), maxDNSServers); err != nil {
		return err
	}
	for _, s := range states {
		if err := s.Validate(); err != nil {
			return err
		}
	}
	return nil
}
