package dnsupdate

import (
	"context"
	"time"

	"github.com/miekg/dns"
)

// exchanger sends one message to one server over TCP and returns its
// reply. A reply whose TSIG fails verification comes back with the error.
type exchanger interface {
	exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error)
	server() string
}

// client is the DNS client of every exchange: TCP (an UPDATE's reply and a
// zone's records need not fit a datagram, and nobody on the path can spoof
// an answer into an established connection), the key for signed messages.
func (u *Updater) client() *dns.Client {
	return &dns.Client{Net: "tcp", Timeout: u.cfg.Timeout, TsigSecret: map[string]string{u.cfg.Key.Name: u.cfg.Key.Secret}}
}

// oneShot is a connection per exchange.
type oneShot struct {
	u    *Updater
	addr string
}

func (u *Updater) oneShot(server string) oneShot { return oneShot{u, server} }

func (o oneShot) server() string { return o.addr }

func (o oneShot) exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, o.u.cfg.Timeout)
	defer cancel()
	r, _, err := o.u.client().ExchangeContext(ctx, m, o.addr)
	return r, err
}

// session is one connection for a run of exchanges with one server (a
// move: read, update, verify), so that a server across a WAN costs one
// handshake, not one per question. A connection that fails is closed and
// the next exchange dials again.
type session struct {
	u    *Updater
	addr string
	dial time.Duration // bounds dialling; the exchanges take Timeout
	c    *dns.Client
	co   *dns.Conn
}

// session dials server within dial (Timeout when zero or longer).
func (u *Updater) session(server string, dial time.Duration) *session {
	if dial <= 0 || dial > u.cfg.Timeout {
		dial = u.cfg.Timeout
	}
	return &session{u: u, addr: server, dial: dial, c: u.client()}
}

func (s *session) server() string { return s.addr }

func (s *session) exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	if s.co == nil {
		dctx, cancel := context.WithTimeout(ctx, s.dial)
		co, err := s.c.DialContext(dctx, s.addr)
		cancel()
		if err != nil {
			return nil, err
		}
		s.co = co
	}
	ctx, cancel := context.WithTimeout(ctx, s.u.cfg.Timeout)
	defer cancel()
	r, _, err := s.c.ExchangeWithConnContext(ctx, m, s.co)
	if err != nil {
		// A reply may still be on its way: never read it as the next one's.
		s.close()
	}
	return r, err
}

func (s *session) close() {
	if s.co != nil {
		s.co.Close()
		s.co = nil
	}
}
