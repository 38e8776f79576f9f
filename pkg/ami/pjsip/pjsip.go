// Package pjsip reads the PJSIP settings of an Asterisk 22 over AMI that
// decide whether a call survives a failover, and judges them: the
// transports (`pjsip show transports`, then `pjsip show transport ID`,
// through the Command action) and the endpoints (PJSIPShowEndpoints, then
// PJSIPShowEndpoint). fanctl doctor judges them on the host; the
// replicator's call recorder reads them at each reconcile and reports
// them in its calls summary, so fanctl status and the status page can warn
// from afar. docs/asterisk22.md records what Asterisk answers.
package pjsip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
)

// Action runs one AMI action within its caller's deadline: an
// (*ami.Client).Action or (*ami.Session).Action with its context bound.
type Action func(name string, fields ...ami.Field) (ami.Response, error)

// ErrRefused is Asterisk answering an action with an error (the user may
// not run it, or it failed there), as opposed to not answering at all.
var ErrRefused = errors.New("refused")

// DefaultSIPPort is where SIP answers when nothing says otherwise.
const DefaultSIPPort = 5060

// Transport is one transport as `pjsip show transport ID` shows it.
type Transport struct {
	ID, Protocol, Bind               string
	ExtSignaling, ExtMedia, LocalNet string
}

// BindAddr is the transport's bind address and port (5060, or 5061 for
// TLS, when the bind names none).
func (t Transport) BindAddr() (netip.AddrPort, bool) {
	if ap, err := netip.ParseAddrPort(t.Bind); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	}
	a, err := netip.ParseAddr(strings.Trim(t.Bind, "[]"))
	if err != nil {
		return netip.AddrPort{}, false
	}
	port := uint16(DefaultSIPPort)
	if t.Protocol == "tls" {
		port = 5061
	}
	return netip.AddrPortFrom(a.Unmap(), port), true
}

// command runs a CLI command and returns its output lines.
func command(act Action, c string) ([]string, error) {
	resp, err := act("Command", ami.F("Command", c))
	if err != nil {
		return nil, err
	}
	if !resp.Success() {
		return nil, fmt.Errorf("%s: %w: %s %s", c, ErrRefused, resp.Message(), strings.Join(resp.Outputs(), " "))
	}
	return resp.Outputs(), nil
}

// ReadTransports asks `pjsip show transports` and then each transport's
// details (Action: Command, as docs/asterisk22.md records the output).
func ReadTransports(act Action) ([]Transport, error) {
	lines, err := command(act, "pjsip show transports")
	if err != nil {
		return nil, err
	}
	ts := ParseTransportList(lines)
	for i := range ts {
		detail, err := command(act, "pjsip show transport "+ts[i].ID)
		if err != nil {
			return nil, err
		}
		ApplyTransportDetail(&ts[i], detail)
	}
	return ts, nil
}

// ParseTransportList reads the rows of `pjsip show transports`:
// "Transport:  <id> <type> <cos> <tos> <bind>".
func ParseTransportList(lines []string) []Transport {
	var out []Transport
	for _, l := range lines {
		rest, ok := strings.CutPrefix(strings.TrimSpace(l), "Transport:")
		if !ok || strings.Contains(rest, "<TransportId") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 5 {
			continue
		}
		out = append(out, Transport{ID: f[0], Protocol: f[1], Bind: f[4]})
	}
	return out
}

// ApplyTransportDetail reads the " name : value" lines of `pjsip show
// transport ID`.
func ApplyTransportDetail(t *Transport, lines []string) {
	for _, l := range lines {
		name, value, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch strings.TrimSpace(name) {
		case "external_signaling_address":
			t.ExtSignaling = value
		case "external_media_address":
			t.ExtMedia = value
		case "local_net":
			t.LocalNet = value
		case "protocol":
			t.Protocol = value
		case "bind":
			t.Bind = value
		}
	}
}

// WritesContact says whether the transport writes fl in its Contact for
// every destination: external_signaling_address is fl and no local_net
// exempts any (with local_net set, destinations inside it get the address
// the message leaves from).
func (t Transport) WritesContact(fl netip.Addr) bool {
	a, err := netip.ParseAddr(t.ExtSignaling)
	return err == nil && a.Unmap() == fl && t.LocalNet == ""
}

// RewritesMedia says whether the transport is UDP and writes
// external_media_address in every SDP it sends (no local_net exempts a
// destination): Asterisk then puts that address in its direct-media
// re-INVITEs too, so the phones send their audio to the node, which relays
// nothing (observed on Asterisk 22.10.1).
func (t Transport) RewritesMedia() bool {
	return t.Protocol == "udp" && t.ExtMedia != "" && t.LocalNet == ""
}

// MediaRewriters lists the IDs of the transports that RewritesMedia.
func MediaRewriters(ts []Transport) []string {
	var out []string
	for _, t := range ts {
		if t.RewritesMedia() && !slices.Contains(out, t.ID) {
			out = append(out, t.ID)
		}
	}
	return out
}

// Floating is the one address a floating prefix names (198.51.100.10/24:
// 198.51.100.10); false for a range (no host bits), which names none.
func Floating(p netip.Prefix) (netip.Addr, bool) {
	if p != p.Masked() || p.IsSingleIP() {
		return p.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// FloatingPort is the SIP port on fl: that of a UDP transport bound to fl,
// else DefaultSIPPort.
func FloatingPort(ts []Transport, fl netip.Addr) uint16 {
	for _, t := range ts {
		if ap, ok := t.BindAddr(); ok && t.Protocol == "udp" && ap.Addr() == fl {
			return ap.Port()
		}
	}
	return DefaultSIPPort
}

// ContactVerdict says whether the dialogs of phones that use the floating
// address fl:port carry fl in their Contact, and if not, which transports
// make them carry the node's own address.
//
// What Asterisk 22.10.1 does (docs/asterisk22.md, "What fanctl doctor
// asks"), over UDP: it writes in the Contact the address of the transport a
// message leaves from. An answer to a request received on the floating
// address leaves from the transport bound to the address the kernel picks
// as source towards the phone (the node's own: the floating address is a
// second address of the same subnet) when one is bound to it on the same
// port; a request Asterisk starts (a call to a phone) may leave from any UDP
// transport, and one on the node's address writes that address whatever its
// port; one bound to 0.0.0.0 writes the source address the kernel picks.
// external_signaling_address replaces the address for destinations outside
// local_net (every destination while local_net is empty), on the transport
// the message leaves from. So every UDP transport not bound to fl must
// write fl, and so must those bound to fl when another shares their port
// (an endpoint tied to them keeps their settings after the switch).
func ContactVerdict(ts []Transport, fl netip.AddrPort) (ok bool, culprits []string, why string) {
	var floating, sharing, others []Transport
	for _, t := range ts {
		ap, good := t.BindAddr()
		if !good || t.Protocol != "udp" || ap.Addr().Is4() != fl.Addr().Is4() {
			continue
		}
		switch {
		case ap.Addr() == fl.Addr():
			floating = append(floating, t)
		default:
			others = append(others, t)
			if ap.Port() == fl.Port() {
				sharing = append(sharing, t)
			}
		}
	}
	lacking := func(list []Transport) []string {
		var out []string
		for _, t := range list {
			if !t.WritesContact(fl.Addr()) && !slices.Contains(out, t.ID) {
				out = append(out, t.ID)
			}
		}
		return out
	}
	if len(floating) == 0 && len(others) == 0 {
		return false, nil, "no UDP transport answers there"
	}
	culprits = lacking(others)
	if len(sharing) > 0 {
		culprits = append(lacking(floating), culprits...)
	}
	if len(culprits) == 0 {
		if len(others) == 0 {
			return true, nil, fmt.Sprintf("%s is bound to %s and no other UDP transport is configured", floating[0].ID, fl.Addr())
		}
		return true, nil, fmt.Sprintf("every UDP transport on another address writes external_signaling_address %s", fl.Addr())
	}
	var names []string
	for _, t := range others {
		if slices.Contains(culprits, t.ID) {
			names = append(names, t.ID+" ("+t.Bind+")")
		}
	}
	switch {
	case len(names) == 0:
		why = fmt.Sprintf("%s shares port %d with a transport on another address, and a dialog moved onto it keeps %s's settings", strings.Join(culprits, ", "), fl.Port(), culprits[0])
	default:
		why = fmt.Sprintf("%s, bound to another address, write%s its own address (the node's) in the Contact of what leaves from it", strings.Join(names, ", "), map[bool]string{true: "s", false: ""}[len(names) == 1])
	}
	return false, culprits, why
}

// Endpoints is what the endpoints' details say of calls that survive a
// failover.
type Endpoints struct {
	// Names are every endpoint PJSIPShowEndpoints listed; Read how many of
	// them were read in detail (within the budget).
	Names []string
	Read  int
	// Timers lists the endpoints that negotiate session timers (timers
	// other than no) with that setting: a call that survives a failover
	// ends at its first session refresh, which the new node answers 481.
	Timers []Endpoint
	// NoDirectMedia lists those with direct_media = no: their audio flows
	// through this Asterisk and stops when it dies.
	NoDirectMedia []string
}

// Endpoint is one endpoint's setting.
type Endpoint struct {
	Name, Value string
}

// ReadEndpoints lists the endpoints and reads each one's details, as many
// as max (0: no limit) within budget; a PBX with thousands of endpoints
// gets the first ones read (Read says how many). An Asterisk without
// endpoints answers "No endpoints found", which is no error. An error
// wrapping ErrRefused is Asterisk's refusal; any other, its silence.
func ReadEndpoints(ctx context.Context, act Action, budget time.Duration, max int) (Endpoints, error) {
	var out Endpoints
	resp, err := act("PJSIPShowEndpoints")
	if err != nil {
		return out, fmt.Errorf("PJSIPShowEndpoints: %w", err)
	}
	if !resp.Success() {
		if strings.HasPrefix(strings.TrimSpace(resp.Message()), "No endpoints found") {
			return out, nil
		}
		return out, fmt.Errorf("PJSIPShowEndpoints: %w: %s", ErrRefused, resp.Message())
	}
	for _, ev := range resp.Events() {
		if ev.Name() == "EndpointList" {
			out.Names = append(out.Names, ev.Field("ObjectName"))
		}
	}
	deadline := time.Now().Add(budget)
	for _, name := range out.Names {
		if (max > 0 && out.Read >= max) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		d, err := act("PJSIPShowEndpoint", ami.F("Endpoint", name))
		if err != nil || !d.Success() {
			continue
		}
		out.Read++
		for _, ev := range d.Events() {
			if ev.Name() != "EndpointDetail" {
				continue
			}
			if t := ev.Field("Timers"); t != "no" {
				out.Timers = append(out.Timers, Endpoint{Name: name, Value: t})
			}
			if ev.Field("DirectMedia") == "false" {
				out.NoDirectMedia = append(out.NoDirectMedia, name)
			}
		}
	}
	return out, nil
}
