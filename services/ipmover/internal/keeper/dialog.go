package keeper

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/pkg/events"
)

// CSeq numbers of the BYEs a keeper sends.
//
// The PBX's CSeq in a dialog is not exposed by Asterisk. pjproject, the SIP
// stack of Asterisk's chan_pjsip, starts a dialog's local CSeq at a random
// number below 2^15 (pjsip_dlg_create_uac and _uas; 708 to 32156 in
// sixteen dialogs of Asterisk 22, docs/asterisk22.md) and adds one per
// request it sends in the dialog (a few per call: the direct media
// re-INVITEs, connected-line UPDATEs).
// CSeqBase, 2^30, stays above that unless the PBX sent more than a billion
// requests in one call, and
// below 2^31, the bound RFC 3261 (8.1.1.5) sets and the one pjproject's
// signed 32-bit counter and many phones' keep to. A UAS accepts any CSeq
// above the last one it saw in the dialog, gaps included (RFC 3261 12.2.2).
//
// A keeper writes the CSeq it will use into the record it keeps (CallLeg's
// CSeq) as it adopts the call, so a node that adopts the call after it
// starts one above: it may have been used. Were that write not through when
// a BYE left, the next keeper would send its own BYE with the same number,
// which the phone either never saw (it is accepted) or saw in a BYE that
// ended the dialog already: a keeper sends nothing but BYEs.
const (
	CSeqBase = 1 << 30
	// maxCSeq is the highest CSeq a keeper sends (2^31 - 1).
	maxCSeq = 1<<31 - 1
)

// nextCSeq is the CSeq to use after recorded, the highest the dialog's PBX
// side may have used.
func nextCSeq(recorded uint32) (uint32, error) {
	switch {
	case recorded < CSeqBase:
		return CSeqBase, nil
	case recorded >= maxCSeq:
		return 0, fmt.Errorf("CSeq %d leaves none below 2^31", recorded)
	}
	return recorded + 1, nil
}

// leg is one kept dialog, ready to match and to end.
type leg struct {
	callID    string
	localTag  string // the PBX's tag: To in the phone's requests
	remoteTag string // the phone's tag: From in its requests
	bye       byeRequest
	// dest is where the keeper sends to the phone: the remote target's
	// address, or the address the phone's messages came from when the
	// target names a host (no name is resolved on the keeper's path).
	dest netip.AddrPort
	// sources are the addresses a request or response of this phone may
	// come from: the target's and the recorded remote address.
	sources []netip.Addr
}

var errUnsendable = errors.New("no request can be sent in this dialog")

// newLeg checks one recorded dialog and prepares its BYE. cseq is the CSeq
// the BYE will carry.
func newLeg(l events.CallLeg, cseq uint32) (*leg, error) {
	if l.Transport != "" && !strings.EqualFold(l.Transport, "udp") {
		return nil, fmt.Errorf("%w: transport %s", errUnsendable, l.Transport)
	}
	target := strings.TrimSpace(l.RemoteTarget)
	if i := strings.IndexByte(target, '<'); i >= 0 {
		j := strings.IndexByte(target[i:], '>')
		if j < 0 {
			return nil, fmt.Errorf("%w: remote target %q", errUnsendable, l.RemoteTarget)
		}
		target = target[i+1 : i+j]
	}
	if target == "" || strings.ContainsAny(target, " \t<>\"") {
		return nil, fmt.Errorf("%w: remote target %q", errUnsendable, l.RemoteTarget)
	}
	host, port, err := uriHostPort(target)
	if err != nil {
		return nil, err
	}
	out := &leg{callID: l.CallID, localTag: l.LocalTag, remoteTag: l.RemoteTag}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !unicast4(ip) {
			return nil, fmt.Errorf("%w: remote target's address %s is no unicast IPv4 address", errUnsendable, ip)
		}
		out.dest = netip.AddrPortFrom(ip.Unmap(), port)
		out.sources = append(out.sources, ip.Unmap())
	}
	if l.RemoteAddr != "" {
		ap, err := netip.ParseAddrPort(l.RemoteAddr)
		if err != nil || !unicast4(ap.Addr()) || ap.Port() == 0 {
			return nil, fmt.Errorf("%w: remote address %q", errUnsendable, l.RemoteAddr)
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if !out.dest.IsValid() {
			out.dest = ap
		}
		if out.sources == nil || out.sources[0] != ap.Addr() {
			out.sources = append(out.sources, ap.Addr())
		}
	}
	if !out.dest.IsValid() {
		return nil, fmt.Errorf("%w: remote target %q names a host and no remote address is recorded", errUnsendable, target)
	}
	out.bye = byeRequest{target: target, from: nameAddr(l.LocalURI, l.LocalTag), to: nameAddr(l.RemoteURI, l.RemoteTag),
		callID: l.CallID, cseq: cseq}
	return out, nil
}

// uriHostPort reads the host and port of a sip: URI. A sips: URI or a
// transport other than UDP is refused: such a dialog needs a connection the
// keeper does not have.
func uriHostPort(uri string) (string, uint16, error) {
	if len(uri) < 4 || !strings.EqualFold(uri[:4], "sip:") {
		return "", 0, fmt.Errorf("%w: %q is not a sip: URI", errUnsendable, uri)
	}
	rest := uri[4:]
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		rest = rest[:i]
	}
	hostport, params, _ := strings.Cut(rest, ";")
	if t := param(";"+params, "transport"); t != "" && !strings.EqualFold(t, "udp") {
		return "", 0, fmt.Errorf("%w: transport=%s", errUnsendable, t)
	}
	if i := strings.LastIndexByte(hostport, '@'); i >= 0 {
		hostport = hostport[i+1:]
	}
	host, port := hostport, uint16(5060)
	if strings.HasPrefix(hostport, "[") {
		end := strings.IndexByte(hostport, ']')
		if end < 0 {
			return "", 0, fmt.Errorf("%w: host %q", errUnsendable, hostport)
		}
		host = hostport[1:end]
		if p, ok := strings.CutPrefix(hostport[end+1:], ":"); ok {
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil || n == 0 {
				return "", 0, fmt.Errorf("%w: port %q", errUnsendable, p)
			}
			port = uint16(n)
		}
	} else if h, p, ok := strings.Cut(hostport, ":"); ok {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return "", 0, fmt.Errorf("%w: port %q", errUnsendable, p)
		}
		host, port = h, uint16(n)
	}
	if host == "" {
		return "", 0, fmt.Errorf("%w: no host in %q", errUnsendable, uri)
	}
	return host, port, nil
}

// unicast4 refuses what a record must never make the keeper send to: the
// node itself, a broadcast or multicast group, nothing at all.
func unicast4(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.Is4() && !ip.IsLoopback() && !ip.IsMulticast() && !ip.IsUnspecified() &&
		ip != netip.AddrFrom4([4]byte{255, 255, 255, 255}) && !ip.IsLinkLocalMulticast()
}

// from reports whether addr is one this leg's phone may send from.
func (l *leg) from(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, s := range l.sources {
		if s == addr {
			return true
		}
	}
	return false
}
