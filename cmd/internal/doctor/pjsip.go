package doctor

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/fanpbx/fan/pkg/ami/pjsip"
)

// The transports are read and judged by pkg/ami/pjsip, which the
// replicator's call recorder shares so that fanctl status warns from the
// same verdicts as doctor.

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
		if a, ok := pjsip.Floating(p); ok && !slices.Contains(fls, a) {
			fls = append(fls, a)
		}
	}
	for _, t := range pbx.transports {
		if t.RewritesMedia() {
			r.out.addf(Warning, "sip.media-address", t.ID,
				fmt.Sprintf("remove external_media_address from %s (deploy/asterisk/pjsip.conf) unless every endpoint has direct_media = no, then restart Asterisk", t.ID),
				"external_media_address = %s: Asterisk writes it into every SDP it sends, the direct-media re-INVITEs included, so the phones of a direct-media call send their audio to this node, which relays nothing, and hear nothing (observed on Asterisk 22.10.1)", t.ExtMedia)
		}
	}
	if len(fls) == 0 {
		r.out.addf(Skipped, "sip.floating", "", "", "no floating address is known here (ipmover.yaml prefixes are ranges and no arbiter group was read)")
		return
	}
	for _, fl := range fls {
		target := netip.AddrPortFrom(fl, port)
		subject := target.String()
		var bound, anyBound *pjsip.Transport
		for i, t := range pbx.transports {
			ap, ok := t.BindAddr()
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
		ok, culprits, why := pjsip.ContactVerdict(pbx.transports, target)
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
