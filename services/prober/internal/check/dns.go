package check

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS asks one server one question over UDP (a DNS site watches its DNS
// servers): healthy when the answer is NOERROR and holds at least one record
// of the asked type. Asking the SOA of a zone the server is authoritative for
// proves the zone is loaded, not just that named is running.
type DNS struct {
	server    string
	name      dnsmessage.Name
	qtype     dnsmessage.Type
	recursion bool
}

// DNSTypes are the query types a dns check may ask.
var DNSTypes = map[string]dnsmessage.Type{
	"A": dnsmessage.TypeA, "AAAA": dnsmessage.TypeAAAA, "SOA": dnsmessage.TypeSOA, "NS": dnsmessage.TypeNS,
	"SRV": dnsmessage.TypeSRV, "MX": dnsmessage.TypeMX, "TXT": dnsmessage.TypeTXT, "CNAME": dnsmessage.TypeCNAME,
	"PTR": dnsmessage.TypePTR, "NAPTR": dnsmessage.Type(35),
}

// NewDNS makes the check; name is fully qualified or gets a final dot.
func NewDNS(server, name, qtype string, recursion bool) (*DNS, error) {
	t, ok := DNSTypes[qtype]
	if !ok {
		return nil, fmt.Errorf("dns check: unknown query type %q", qtype)
	}
	if name == "" || name[len(name)-1] != '.' {
		name += "."
	}
	n, err := dnsmessage.NewName(name)
	if err != nil {
		return nil, fmt.Errorf("dns check: name %q: %w", name, err)
	}
	return &DNS{server: server, name: n, qtype: t, recursion: recursion}, nil
}

func (d *DNS) Kind() string   { return "dns" }
func (d *DNS) Target() string { return d.server + " " + d.name.String() + " " + d.qtype.String() }

func (d *DNS) Run(ctx context.Context) Result {
	start := time.Now()
	n, err := d.ask(ctx)
	r := finish(start, err)
	if err == nil {
		r.Figures = map[string]float64{"dns_answers": float64(n)}
	}
	return r
}

func (d *DNS) ask(ctx context.Context) (int, error) {
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	q := dnsmessage.Question{Name: d.name, Type: d.qtype, Class: dnsmessage.ClassINET}
	msg := dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: d.recursion}, Questions: []dnsmessage.Question{q}}
	b, err := msg.Pack()
	if err != nil {
		return 0, fmt.Errorf("dns: pack query: %w", err)
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "udp", d.server)
	if err != nil {
		return 0, fmt.Errorf("dns %s: %w", d.server, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write(b); err != nil {
		return 0, fmt.Errorf("dns %s: send: %w", d.server, err)
	}
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("dns %s: no answer: %w", d.server, ctx.Err())
			}
			return 0, fmt.Errorf("dns %s: %w", d.server, err)
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil || h.ID != id || !h.Response {
			continue // a stray or a late answer to someone else: keep waiting
		}
		qs, err := p.AllQuestions()
		if err != nil || len(qs) != 1 || qs[0] != q {
			continue
		}
		if h.RCode != dnsmessage.RCodeSuccess {
			return 0, fmt.Errorf("dns %s: %s %s: %s: %w", d.server, d.name, d.qtype, h.RCode, ErrUnhealthy)
		}
		answers, err := p.AllAnswers()
		if err != nil {
			return 0, fmt.Errorf("dns %s: answer: %w: %w", d.server, ErrProtocol, err)
		}
		found := 0
		for _, a := range answers {
			if a.Header.Type == d.qtype {
				found++
			}
		}
		if found == 0 {
			return 0, fmt.Errorf("dns %s: no %s record for %s: %w", d.server, d.qtype, d.name, ErrUnhealthy)
		}
		return found, nil
	}
}

func (d *DNS) Close() error { return nil }
