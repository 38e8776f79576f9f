package doctor

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// portTarget is one port fan needs to reach from this host.
type portTarget struct {
	what  string // "NATS client port", "NATS route port", "SIP of peer pbx-b", "AMI"
	proto string // tcp, udp-sip, tcp-sip
	addr  string // host:port
}

// checkPorts: every port fan needs is reachable from this host: each NATS
// server's client port, the route port of every other server when this
// host runs one, the other PBX nodes' SIP (an OPTIONS, as the peer checks
// send) and AMI on loopback. A port that does not answer is named with its
// host.
func (r *run) checkPorts(ctx context.Context) {
	var targets []portTarget
	add := func(t portTarget) {
		if !slices.ContainsFunc(targets, func(o portTarget) bool { return o.addr == t.addr && o.proto == t.proto }) {
			targets = append(targets, t)
		}
	}
	for _, s := range r.files.services() {
		for _, u := range strings.Split(s.c.Bus.URL, ",") {
			if hp := serverHostPort(strings.TrimSpace(u)); hp != "" {
				add(portTarget{what: "NATS client port", proto: "tcp", addr: hp})
			}
		}
	}
	if ls, err := r.files.localServer(); err != nil {
		r.out.addf(Warning, "port.route", "nats.yaml", "", "%v", err)
	} else {
		for _, route := range ls.Routes {
			if r.isOwnRoute(ctx, route, ls) {
				continue
			}
			add(portTarget{what: "NATS route port", proto: "tcp", addr: route})
		}
	}
	if p := r.files.prober; p != nil {
		for _, c := range p.Checks {
			if c.Kind == "sip" && c.role() == "peer" {
				proto := "udp-sip"
				if c.Transport == "tcp" {
					proto = "tcp-sip"
				}
				add(portTarget{what: "SIP of peer " + c.TargetNode, proto: proto, addr: c.Address})
			}
		}
	}
	for _, u := range r.uses() {
		add(portTarget{what: "AMI", proto: "tcp", addr: u.cfg.Address})
	}
	results := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			switch t.proto {
			case "tcp":
				var d net.Dialer
				dctx, cancel := context.WithTimeout(ctx, r.o.Step)
				defer cancel()
				c, err := d.DialContext(dctx, "tcp", t.addr)
				if err == nil {
					_ = c.Close()
				}
				results[i] = err
			default:
				_, err := sipAsk(ctx, t.addr, strings.TrimSuffix(t.proto, "-sip"), r.o.Step)
				if err != nil {
					err = fmt.Errorf("SIP OPTIONS: %s", sipFailure(err))
				}
				results[i] = err
			}
		})
	}
	wg.Wait()
	for i, t := range targets {
		subject := t.what + " " + t.addr
		if err := results[i]; err != nil {
			host, port, _ := splitPort(t.addr)
			proto := "TCP"
			if t.proto == "udp-sip" {
				proto = "UDP"
			}
			r.out.addf(Error, "port."+portKind(t), subject,
				fmt.Sprintf("let %s %d through from this host to %s (the firewalls on both hosts and between them)", proto, port, host),
				"not reachable from this host: %v", err)
			continue
		}
		r.out.addf(OK, "port."+portKind(t), subject, "", "reachable")
	}
}

func portKind(t portTarget) string {
	switch {
	case strings.HasPrefix(t.what, "NATS client"):
		return "nats"
	case strings.HasPrefix(t.what, "NATS route"):
		return "route"
	case strings.HasPrefix(t.what, "SIP"):
		return "sip-peer"
	}
	return "ami"
}

// serverHostPort is a bus.url entry's host:port (4222 when it names none).
func serverHostPort(raw string) string {
	if raw == "" {
		return ""
	}
	if !strings.Contains(raw, "://") {
		raw = "nats://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "4222"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// isOwnRoute says whether a route names this host's own server: its route
// listen address, or an address of this host on the same port.
func (r *run) isOwnRoute(ctx context.Context, route string, ls localServer) bool {
	if route == ls.Own {
		return true
	}
	host, port, err := splitPort(route)
	if err != nil {
		return false
	}
	_, ownPort, err := splitPort(ls.Own)
	if err != nil {
		ownPort = 6222
	}
	if port != ownPort {
		return false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		// A name: resolve it and compare with this host's addresses.
		lctx, cancel := context.WithTimeout(ctx, r.o.Step)
		defer cancel()
		addrs, lerr := net.DefaultResolver.LookupHost(lctx, host)
		if lerr != nil {
			return false
		}
		for _, s := range addrs {
			if pa, perr := netip.ParseAddr(s); perr == nil && r.hostHas(pa) {
				return true
			}
		}
		return false
	}
	return r.hostHas(a.Unmap())
}
