package doctor

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/fanpbx/fan/pkg/ami"
)

// pjsipTransport is one transport as `pjsip show transport ID` shows it.
type pjsipTransport struct {
	ID, Protocol, Bind               string
	ExtSignaling, ExtMedia, LocalNet string
}

// bindAddr is the transport's bind address and port (5060, or 5061 for
// TLS, when the bind names none).
func (t pjsipTransport) bindAddr() (netip.AddrPort, bool) {
	if ap, err := netip.ParseAddrPort(t.Bind); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	}
	a, err := netip.ParseAddr(strings.Trim(t.Bind, "[]"))
	if err != nil {
		return netip.AddrPort{}, false
	}
	port := uint16(5060)
	if t.Protocol == "tls" {
		port = 5061
	}
	return netip.AddrPortFrom(a.Unmap(), port), true
}

// readTransports asks `pjsip show transports` and then each transport's
// details (Action: Command, as docs/asterisk22.md records the output).
func readTransports(act func(string, ...ami.Field) (ami.Response, error)) ([]pjsipTransport, error) {
	cmd := func(c string) ([]string, error) {
		resp, err := act("Command", ami.F("Command", c))
		if err != nil {
			return nil, err
		}
		if !resp.Success() {
			return nil, fmt.Errorf("%s: %s %s", c, resp.Message(), strings.Join(resp.Outputs(), " "))
		}
		return resp.Outputs(), nil
	}
	lines, err := cmd("pjsip show transports")
	if err != nil {
		return nil, err
	}
	ts := parseTransportList(lines)
	for i := range ts {
		detail, err := cmd("pjsip show transport " + ts[i].ID)
		if err != nil {
			return nil, err
		}
		applyTransportDetail(&ts[i], detail)
	}
	return ts, nil
}

// parseTransportList reads the rows of `pjsip show transports`:
// "Transport:  <id> <type> <cos> <tos> <bind>".
func parseTransportList(lines []string) []pjsipTransport {
	var out []pjsipTransport
	for _, l := range lines {
		rest, ok := strings.CutPrefix(strings.TrimSpace(l), "Transport:")
		if !ok || strings.Contains(rest, "<TransportId") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 5 {
			continue
		}
		out = append(out, pjsipTransport{ID: f[0], Protocol: f[1], Bind: f[4]})
	}
	return out
}

// applyTransportDetail reads the " name : value" lines of `pjsip show
// transport ID`.
func applyTransportDetail(t *pjsipTransport, lines []string) {
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

// extIs says whether the transport writes fl in its Contact for every
// destination: external_signaling_address is fl and no local_net exempts
// any (with local_net set, destinations inside it get the address the
// message leaves from).
func (t pjsipTransport) extIs(fl netip.Addr) bool {
	a, err := netip.ParseAddr(t.ExtSignaling)
	return err == nil && a.Unmap() == fl && t.LocalNet == ""
}

// contactVerdict says whether the dialogs of phones that use the floating
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
func contactVerdict(ts []pjsipTransport, fl netip.AddrPort) (ok bool, culprits []string, why string) {
	var floating, sharing, others []pjsipTransport
	for _, t := range ts {
		ap, good := t.bindAddr()
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
	lacking := func(list []pjsipTransport) []string {
		var out []string
		for _, t := range list {
			if !t.extIs(fl.Addr()) && !slices.Contains(out, t.ID) {
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

// checkFloatingTransports: a transport answers on each floating address
// (bound to it, or to 0.0.0.0 with a warning), and dialogs opened there
// carry the floating address in their Contact.
func (r *run) checkFloatingTransports(pbx asteriskFacts, groups map[string]*groupInfo) {
	ip := r.files.ipmover
	if ip == nil || !ip.isIP() || !pbx.read {
		return
	}
	port := uint16(ip.sipPort())
	var fls []netip.Addr
	for _, p := range r.floating(groups) {
		// A range (no host bits) names no one address to look for.
		if p != p.Masked() || p.IsSingleIP() {
			if !slices.Contains(fls, p.Addr()) {
				fls = append(fls, p.Addr())
			}
		}
	}
	if len(fls) == 0 {
		r.out.addf(Skipped, "sip.floating", "", "", "no floating address is known here (ipmover.yaml prefixes are ranges and no arbiter group was read)")
		return
	}
	for _, fl := range fls {
		target := netip.AddrPortFrom(fl, port)
		subject := target.String()
		var bound, anyBound *pjsipTransport
		for i, t := range pbx.transports {
			ap, ok := t.bindAddr()
			if !ok || ap.Port() != port {
				continue
			}
			if ap.Addr() == fl && bound == nil {
				bound = &pbx.transports[i]
			}
			if ap.Addr().IsUnspecified() && anyBound == nil {
				anyBound = &pbx.transports[i]
			}
		}
		switch {
		case bound != nil:
			r.out.addf(OK, "sip.floating", subject, "", "%s is bound to it", bound.ID)
		case anyBound != nil:
			r.out.addf(Warning, "sip.floating", subject,
				fmt.Sprintf("bind a transport to %s (deploy/asterisk/pjsip.conf, transport-float) and restart Asterisk", target),
				"only %s, bound to 0.0.0.0:%d, answers there: Asterisk then answers each phone from, and writes in dialogs' Contact, the address the kernel picks towards it (the node's own, observed on Asterisk 22.10.1): a phone may drop an answer from an address it did not send to, and after a failover its in-dialog requests go to the dead node", anyBound.ID, port)
		case ip.answerMode() == "reload" && !r.hostHas(fl):
			r.out.addf(Skipped, "sip.floating", subject, "",
				"no transport is bound to it, as expected in answer mode reload while the address is elsewhere: the ipmover's Reload binds it at the claim")
			continue
		default:
			r.out.addf(Error, "sip.floating", subject,
				fmt.Sprintf("add a transport bound to %s (deploy/asterisk/pjsip.conf, transport-float) and restart Asterisk; in answer mode hot also net.ipv4.ip_nonlocal_bind = 1", target),
				"no PJSIP transport is bound to it (nor to 0.0.0.0:%d): after a claim nothing answers SIP on the floating address", port)
			continue
		}
		ok, culprits, why := contactVerdict(pbx.transports, target)
		if ok {
			r.out.addf(OK, "sip.contact", subject, "", "dialogs carry %s in their Contact: %s", fl, why)
			continue
		}
		r.out.addf(Warning, "sip.contact", subject,
			fmt.Sprintf("external_signaling_address = %s (and no local_net) on %s (deploy/asterisk/pjsip.conf; a transport that only serves trunks elsewhere may keep its own), then restart Asterisk: a reload does not rebuild a bound transport", fl, strings.Join(culprits, " and ")),
			"dialogs opened on the floating address carry the node's own address in their Contact (%s; observed on Asterisk 22.10.1): after a failover the phone sends its re-INVITEs and its BYE to the dead node, so no call survives", why)
	}
}

// hostHas says whether an address is on one of this host's interfaces.
func (r *run) hostHas(a netip.Addr) bool {
	for _, p := range hostAddrs() {
		if p.Addr() == a {
			return true
		}
	}
	return false
}
