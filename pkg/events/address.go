package events

import (
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Address events: what a node's executor saw and did about a floating
// address outside the command path. A conflict is the one-holder invariant
// under threat; a correction is the executor repairing the interface on its
// own (level-triggered reconcile, bus-loss policy).
const (
	TypeAddressConflict   Type = "address.conflict"
	TypeAddressCorrection Type = "address.correction"
)

func init() {
	register(TypeAddressConflict, func() Decoded { return &AddressConflict{} })
	register(TypeAddressCorrection, func() Decoded { return &AddressCorrection{} })
}

// ConflictAction is what an executor did about another MAC using its address.
type ConflictAction string

const (
	// ConflictKept: the executor confirmed its claim is current, kept the
	// address and announced it again so neighbours come back to it.
	ConflictKept ConflictAction = "kept"
	// ConflictYielded: it could not confirm its claim (or the arbiter names
	// another holder) and removed the group's addresses.
	ConflictYielded ConflictAction = "yielded"
	// ConflictRefused: an ARP probe before a claim was answered by another
	// MAC and the previous holder was not known to be fenced, so the claim
	// was refused without touching the interface.
	ConflictRefused ConflictAction = "refused"
)

func (a ConflictAction) valid() bool {
	return a == ConflictKept || a == ConflictYielded || a == ConflictRefused
}

// AddressConflict reports another MAC answering for one of a group's
// addresses on this node's LAN.
type AddressConflict struct {
	Group   string `json:"group"`
	Node    string `json:"node"`
	Address string `json:"address"` // the IP, without prefix length
	// OwnMAC is this node's interface; OtherMAC the one seen using Address.
	OwnMAC   string         `json:"own_mac"`
	OtherMAC string         `json:"other_mac"`
	Action   ConflictAction `json:"action"`
	Reason   string         `json:"reason"`
	// Epoch is the epoch of the claim this node applied for the group (0
	// when it held no claim); HolderEpoch and Holder are what the arbiter's
	// state said when the executor checked, if it could read it.
	Epoch       uint64    `json:"epoch,omitempty"`
	Holder      string    `json:"holder,omitempty"`
	HolderEpoch uint64    `json:"holder_epoch,omitempty"`
	DetectedAt  time.Time `json:"detected_at"`
}

func (AddressConflict) EventType() Type    { return TypeAddressConflict }
func (AddressConflict) SchemaVersion() int { return 1 }
func (c AddressConflict) subject(e Envelope) string {
	return AddressConflictSubject(e.Cluster, c.Node)
}

func (c AddressConflict) Validate() error {
	if err := ValidToken("group", c.Group); err != nil {
		return err
	}
	if err := ValidToken("node", c.Node); err != nil {
		return err
	}
	if _, err := netip.ParseAddr(c.Address); err != nil {
		return fmt.Errorf("%w: address %q: %v", ErrInvalidField, c.Address, err)
	}
	if _, err := net.ParseMAC(c.OtherMAC); err != nil {
		return fmt.Errorf("%w: other_mac %q: %v", ErrInvalidField, c.OtherMAC, err)
	}
	if !c.Action.valid() {
		return fmt.Errorf("%w: action %q", ErrInvalidField, c.Action)
	}
	if c.Reason == "" {
		return fmt.Errorf("%w: reason", ErrMissingField)
	}
	if c.DetectedAt.IsZero() {
		return fmt.Errorf("%w: detected_at", ErrMissingField)
	}
	return textIn("reason", c.Reason, MaxTextLen)
}

// CorrectionKind says what an executor changed on its own.
type CorrectionKind string

const (
	CorrectionReadded  CorrectionKind = "readded"  // held address vanished; put back and announced
	CorrectionRemoved  CorrectionKind = "removed"  // address present without the right to it; taken off
	CorrectionReleased CorrectionKind = "released" // released by the bus-loss policy
	CorrectionFailed   CorrectionKind = "failed"   // a correction was attempted and failed
	// CorrectionDNSRealigned: a DNS server that served another site's
	// records than the last claim's (it was out of reach when the name
	// moved) was brought in line; DNS says what it serves now.
	CorrectionDNSRealigned CorrectionKind = "dns_realigned"
)

func (k CorrectionKind) valid() bool {
	switch k {
	case CorrectionReadded, CorrectionRemoved, CorrectionReleased, CorrectionFailed, CorrectionDNSRealigned:
		return true
	}
	return false
}

// AddressCorrection reports a change the executor made without a command.
type AddressCorrection struct {
	Group   string         `json:"group"`
	Node    string         `json:"node"`
	Address string         `json:"address"` // prefix, as in the group's addresses
	Kind    CorrectionKind `json:"kind"`
	Reason  string         `json:"reason,omitempty"`
	Error   string         `json:"error,omitempty"`
	At      time.Time      `json:"at"`
	// DNS is, for a correction of a DNS executor (dns_realigned, or failed
	// on a DNS server), the server and what it serves (dns.go).
	DNS []DNSServerState `json:"dns,omitempty"`
}

func (AddressCorrection) EventType() Type    { return TypeAddressCorrection }
func (AddressCorrection) SchemaVersion() int { return 1 }
func (c AddressCorrection) subject(e Envelope) string {
	return AddressCorrectionSubject(e.Cluster, c.Node)
}

func (c AddressCorrection) Validate() error {
	if err := ValidToken("group", c.Group); err != nil {
		return err
	}
	if err := ValidToken("node", c.Node); err != nil {
		return err
	}
	if _, err := netip.ParsePrefix(c.Address); err != nil {
		return fmt.Errorf("%w: address %q: %v", ErrInvalidField, c.Address, err)
	}
	if !c.Kind.valid() {
		return fmt.Errorf("%w: kind %q", ErrInvalidField, c.Kind)
	}
	if c.Kind == CorrectionFailed && c.Error == "" {
		return fmt.Errorf("%w: error (a failed correction must say why)", ErrMissingField)
	}
	if c.At.IsZero() {
		return fmt.Errorf("%w: at", ErrMissingField)
	}
	return firstErr(textIn("error", c.Error, MaxTextLen), validateDNSStates(c.DNS))
}

// AddressConflictSubject carries one node's executor's conflict reports.
func AddressConflictSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".addr." + node + ".conflict"
}

// AddressCorrectionSubject carries one node's executor's own corrections.
func AddressCorrectionSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".addr." + node + ".correction"
}

// AllAddressConflicts matches every node's conflict reports in a cluster.
func AllAddressConflicts(cluster string) string {
	return EventRoot + "." + cluster + ".addr.*.conflict"
}

// AllAddressEvents matches every node's address events in a cluster.
func AllAddressEvents(cluster string) string { return EventRoot + "." + cluster + ".addr.>" }
