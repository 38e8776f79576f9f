package dnsupdate

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// Record types a swap can manage. Config.Types lists a subset of them.
const (
	TypeA    = "A"
	TypeAAAA = "AAAA"
	TypeSRV  = "SRV"
)

// SRV is one SRV target (RFC 2782). Target is a host name; it is compared
// case-insensitively and fully qualified.
type SRV struct {
	Priority uint16 `yaml:"priority"`
	Weight   uint16 `yaml:"weight"`
	Port     uint16 `yaml:"port"`
	Target   string `yaml:"target"`
}

// Values is the content of the managed RRsets at one site (or as served). An
// empty list for a managed type means "this RRset does not exist".
type Values struct {
	A    []netip.Addr `yaml:"a"`
	AAAA []netip.Addr `yaml:"aaaa"`
	SRV  []SRV        `yaml:"srv"`
}

// normalized returns a copy in canonical order and form, so that two sets
// that differ only in order or name case compare equal.
func (v Values) normalized() Values {
	out := Values{
		A:    make([]netip.Addr, 0, len(v.A)),
		AAAA: make([]netip.Addr, 0, len(v.AAAA)),
		SRV:  make([]SRV, 0, len(v.SRV)),
	}
	for _, a := range v.A {
		out.A = append(out.A, a.Unmap())
	}
	for _, a := range v.AAAA {
		out.AAAA = append(out.AAAA, a.Unmap())
	}
	for _, s := range v.SRV {
		s.Target = canonicalName(s.Target)
		out.SRV = append(out.SRV, s)
	}
	slices.SortFunc(out.A, netip.Addr.Compare)
	out.A = slices.Compact(out.A)
	slices.SortFunc(out.AAAA, netip.Addr.Compare)
	out.AAAA = slices.Compact(out.AAAA)
	slices.SortFunc(out.SRV, func(a, b SRV) int {
		return cmp.Or(cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.Weight, b.Weight),
			cmp.Compare(a.Port, b.Port), strings.Compare(a.Target, b.Target))
	})
	out.SRV = slices.Compact(out.SRV)
	return out
}

// Equal reports whether v and o hold the same RRsets, ignoring order, name
// case and duplicates (a DNS RRset is a set).
func (v Values) Equal(o Values) bool {
	a, b := v.normalized(), o.normalized()
	return slices.Equal(a.A, b.A) && slices.Equal(a.AAAA, b.AAAA) && slices.Equal(a.SRV, b.SRV)
}

// only keeps the types in types; the others are not managed, so they must
// not take part in comparisons.
func (v Values) only(types []string) Values {
	var out Values
	for _, t := range types {
		switch t {
		case TypeA:
			out.A = v.A
		case TypeAAAA:
			out.AAAA = v.AAAA
		case TypeSRV:
			out.SRV = v.SRV
		}
	}
	return out
}

// String is compact and stable, for logs and error messages.
func (v Values) String() string {
	n := v.normalized()
	var parts []string
	for _, a := range n.A {
		parts = append(parts, "A "+a.String())
	}
	for _, a := range n.AAAA {
		parts = append(parts, "AAAA "+a.String())
	}
	for _, s := range n.SRV {
		parts = append(parts, fmt.Sprintf("SRV %d %d %d %s", s.Priority, s.Weight, s.Port, s.Target))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func canonicalName(s string) string { return strings.ToLower(dns.Fqdn(s)) }

// rrs builds fresh RRs of one type with the given TTL. They are new on every
// call on purpose: the miekg/dns update helpers change the RRs passed to them
// (class, TTL), so sharing one between a prerequisite and an insert would
// insert it with TTL 0.
func (v Values) rrs(typ, owner string, ttl uint32) []dns.RR {
	var out []dns.RR
	switch typ {
	case TypeA:
		for _, a := range v.A {
			out = append(out, &dns.A{Hdr: hdr(owner, dns.TypeA, ttl), A: net.IP(a.AsSlice())})
		}
	case TypeAAAA:
		for _, a := range v.AAAA {
			out = append(out, &dns.AAAA{Hdr: hdr(owner, dns.TypeAAAA, ttl), AAAA: net.IP(a.AsSlice())})
		}
	case TypeSRV:
		for _, s := range v.SRV {
			out = append(out, &dns.SRV{Hdr: hdr(owner, dns.TypeSRV, ttl),
				Priority: s.Priority, Weight: s.Weight, Port: s.Port, Target: canonicalName(s.Target)})
		}
	}
	return out
}

func hdr(name string, rrtype uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: ttl}
}

// typeCode maps a managed type to its DNS code.
func typeCode(t string) uint16 {
	switch t {
	case TypeA:
		return dns.TypeA
	case TypeAAAA:
		return dns.TypeAAAA
	case TypeSRV:
		return dns.TypeSRV
	}
	return 0
}

// add appends the answer RRs of the queried type to v and reports whether
// every one of them carries ttl.
func (v *Values) add(answer []dns.RR, owner string, qtype uint16, ttl uint32) (ttlOK bool) {
	ttlOK = true
	for _, rr := range answer {
		h := rr.Header()
		if h.Rrtype != qtype || !strings.EqualFold(h.Name, owner) {
			continue
		}
		if h.Ttl != ttl {
			ttlOK = false
		}
		switch r := rr.(type) {
		case *dns.A:
			if a, ok := netip.AddrFromSlice(r.A); ok {
				v.A = append(v.A, a.Unmap())
			}
		case *dns.AAAA:
			if a, ok := netip.AddrFromSlice(r.AAAA); ok {
				v.AAAA = append(v.AAAA, a)
			}
		case *dns.SRV:
			v.SRV = append(v.SRV, SRV{Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: canonicalName(r.Target)})
		}
	}
	return ttlOK
}

// serialAfter reports a > b in RFC 1982 serial number arithmetic, so that a
// zone whose serial wrapped past 2^32 still counts as newer.
func serialAfter(a, b uint32) bool {
	return a != b && int32(a-b) > 0
}
