package dnsupdate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/miekg/dns"
)

// One primary per site. Two sites that each run an authoritative server for
// the zone, with no zone transfer between them, are two primaries: a site
// that goes dark takes its server with it, and a name that could only be
// updated through it could not move at all. Each server is then read,
// updated and verified on its own (MoveOn): the update to a server is a
// compare-and-swap on what that server was just read to serve, because a
// server that was dark missed the moves made meanwhile and serves what it
// served when it went dark. Records that match no configured site are
// never overwritten, on any server.

// Served is what one server serves for the managed types.
type Served struct {
	Values Values
	Serial uint32
	// TTLOK: every served record has the configured TTL.
	TTLOK bool
	// Site is the configured site whose records equal Values, or "".
	Site string
	// Known: the server was read (the zero Served says nothing).
	Known bool
}

// Read asks server directly (no recursion, authoritative answers only) what
// it serves. An error wrapping ErrBadAnswer or ErrNotAuthoritative means the
// server answered but could not be read (Reachable tells them apart).
func (u *Updater) Read(ctx context.Context, server string) (Served, error) {
	return u.readOn(ctx, u.oneShot(server))
}

func (u *Updater) readOn(ctx context.Context, ex exchanger) (Served, error) {
	v, serial, ttlOK, err := u.observe(ctx, ex)
	if err != nil {
		return Served{}, err
	}
	site, _ := u.SiteOf(v)
	return Served{Values: v, Serial: serial, TTLOK: ttlOK, Site: site, Known: true}, nil
}

// Reachable reports whether err, from Read or MoveOn, came from a server
// that answered (with an error or a non-authoritative answer): such a server
// is up but wrong, where any other error means it could not be reached.
func Reachable(err error) bool {
	return errors.Is(err, ErrBadAnswer) || errors.Is(err, ErrNotAuthoritative)
}

// MoveOutcome is what MoveOn did to one server.
type MoveOutcome int

const (
	// MoveUpdated: the update was accepted and the server was seen serving
	// the site's records at a newer serial.
	MoveUpdated MoveOutcome = iota + 1
	// MoveAlready: the server served the site's records already.
	MoveAlready
	// MoveUnreachable: the server did not answer; nothing is known to have
	// changed.
	MoveUnreachable
	// MoveRefused: the server answered and was left as it was, or not seen
	// changed in time (Err says which): records of no configured site, a
	// compare-and-swap lost to another writer, the update refused or
	// unsigned, or no newer serial within VerifyTimeout.
	MoveRefused
)

func (o MoveOutcome) String() string {
	switch o {
	case MoveUpdated:
		return "updated"
	case MoveAlready:
		return "already_served"
	case MoveUnreachable:
		return "unreachable"
	case MoveRefused:
		return "refused"
	}
	return fmt.Sprintf("MoveOutcome(%d)", int(o))
}

// ServerMove is what MoveOn found and did on one server.
type ServerMove struct {
	Server  string
	Outcome MoveOutcome
	// Before is what the server served when read first, or, when the
	// update on the previous site's records went through at once, those
	// records (Known false: the server was not read); zero when it could
	// not be read. After is what it served when MoveOn ended (Before for a
	// server left as it was).
	Before, After Served
	// Sent is when the update left (zero when none was sent); Accepted and
	// Verified count from it.
	Sent               time.Time
	Accepted, Verified time.Duration
	Err                error
}

// MoveOn brings one server to site to's records, over one connection. When
// from names a configured site (the name's previous site, as the arbiter
// knows it), it first sends one signed UPDATE whose prerequisite is exactly
// from's records: the usual move costs a handshake and a round trip. When
// that prerequisite fails (the server missed moves while out of reach, or
// someone else wrote), or from is empty, it reads what the server serves,
// and if that is another configured site's records (or to's with another
// TTL) sends the UPDATE with those as the prerequisite. Then it reads the
// server until it serves to's records with the configured TTL. It never
// writes over records that match no configured site.
func (u *Updater) MoveOn(ctx context.Context, server, from, to string) ServerMove {
	s := u.session(server, 0)
	defer s.close()
	return u.move(ctx, s, from, to)
}

// Align is MoveOn from whatever the server serves (read first), dialling
// within dial: a keeper's look at a server that may be dark, which must not
// outlast its period.
func (u *Updater) Align(ctx context.Context, server, to string, dial time.Duration) ServerMove {
	s := u.session(server, dial)
	defer s.close()
	return u.move(ctx, s, "", to)
}

func (u *Updater) move(ctx context.Context, s *session, from, to string) ServerMove {
	server := s.server()
	mv := ServerMove{Server: server}
	want, ok := u.SiteValues(to)
	if !ok {
		mv.Outcome, mv.Err = MoveRefused, fmt.Errorf("dnsupdate: move on %s: unknown site %s", server, to)
		return mv
	}
	log := u.log.With("zone", u.cfg.Zone, "name", u.cfg.Name, "server", server, "to_site", to)
	if expect, ok := u.SiteValues(from); ok && from != to && !expect.Equal(want) {
		mv.Before = Served{Values: expect, Site: from}
		mv.Sent = time.Now()
		rcode, err := u.send(ctx, s, u.updateMsg(expect, want))
		mv.Accepted = time.Since(mv.Sent)
		switch {
		case err == nil && rcode == dns.RcodeSuccess:
			return u.verifyMove(ctx, s, mv, want, log)
		case err == nil && (rcode == dns.RcodeNXRrset || rcode == dns.RcodeYXRrset):
			log.Debug("dns server does not serve the previous site; reading it", "from_site", from)
		default:
			return u.moveFailed(mv, rcode, err)
		}
	}
	before, err := u.readOn(ctx, s)
	if err != nil {
		mv.Outcome, mv.Err = MoveUnreachable, err
		if Reachable(err) {
			mv.Outcome = MoveRefused
		}
		return mv
	}
	mv.Before, mv.After = before, before
	switch {
	case before.Site == to && before.TTLOK:
		mv.Outcome = MoveAlready
		return mv
	case before.Site == "" && !before.Values.Equal(want):
		mv.Outcome = MoveRefused
		mv.Err = fmt.Errorf("dnsupdate: %s serves %s at serial %d, which is no configured site: not overwriting what someone else wrote",
			server, before.Values, before.Serial)
		return mv
	}
	mv.Sent = time.Now()
	rcode, err := u.send(ctx, s, u.updateMsg(before.Values, want))
	mv.Accepted = time.Since(mv.Sent)
	if err != nil || rcode != dns.RcodeSuccess {
		if err == nil && (rcode == dns.RcodeNXRrset || rcode == dns.RcodeYXRrset) {
			// Changed between the read and the update: another writer.
			se := &StaleError{Rcode: dns.RcodeToString[rcode]}
			now, rerr := u.readOn(ctx, s)
			se.Current, se.Serial, se.ReadErr = now.Values, now.Serial, rerr
			se.AlreadyApplied = rerr == nil && now.Site == to && now.TTLOK
			log.Warn("dns move prerequisite failed", "rcode", se.Rcode, "current", now.Values.String(), "serial", now.Serial,
				"already_applied", se.AlreadyApplied)
			if rerr == nil {
				mv.After = now
			}
			if se.AlreadyApplied {
				mv.Outcome = MoveAlready
				return mv
			}
			mv.Outcome, mv.Err = MoveRefused, fmt.Errorf("%s: %w", server, se)
			return mv
		}
		return u.moveFailed(mv, rcode, err)
	}
	return u.verifyMove(ctx, s, mv, want, log)
}

// moveFailed is the outcome of an update that was not accepted.
func (u *Updater) moveFailed(mv ServerMove, rcode int, err error) ServerMove {
	switch {
	case errors.Is(err, ErrUnsigned):
		mv.Outcome, mv.Err = MoveRefused, err
	case err != nil:
		// The update may have been lost on the way, or its reply: the
		// next read of the server tells.
		mv.Outcome, mv.Err = MoveUnreachable, err
	case rcode == dns.RcodeRefused:
		mv.Outcome, mv.Err = MoveRefused, fmt.Errorf("%s: %w (REFUSED)", mv.Server, ErrRefused)
	case rcode == dns.RcodeNotAuth:
		mv.Outcome, mv.Err = MoveRefused, fmt.Errorf("%s: %w (NOTAUTH)", mv.Server, ErrNotAuth)
	default:
		mv.Outcome, mv.Err = MoveRefused, fmt.Errorf("%s: %w (%s)", mv.Server, ErrRejected, dns.RcodeToString[rcode])
	}
	return mv
}

// verifyMove reads the server after an accepted update until it serves
// want: the primary applied the update before it answered, so one read
// usually does.
func (u *Updater) verifyMove(ctx context.Context, ex exchanger, mv ServerMove, want Values, log *slog.Logger) ServerMove {
	vctx, cancel := context.WithDeadline(ctx, mv.Sent.Add(u.cfg.VerifyTimeout))
	defer cancel()
	res := u.verifyOne(vctx, ex, want, 0, false, mv.Sent)
	mv.Verified = res.Elapsed
	if res.Serial != 0 {
		site, _ := u.SiteOf(res.Values)
		mv.After = Served{Values: res.Values, Serial: res.Serial, TTLOK: res.Verified, Site: site, Known: true}
	}
	if !res.Verified {
		mv.Outcome, mv.Err = MoveRefused, fmt.Errorf("%s accepted the update: %w: %w", mv.Server, ErrUnverified, res.Err)
		return mv
	}
	log.Info("dns server moved", "from_site", mv.Before.Site, "serial", res.Serial, "accepted", mv.Accepted, "verified", mv.Verified)
	mv.Outcome = MoveUpdated
	return mv
}

// Primaries lists the servers MoveOn is meant for (Config.Primaries).
func (u *Updater) Primaries() []string { return append([]string(nil), u.cfg.Primaries...) }

// SiteValues is the records of a configured site, as a swap writes them.
func (u *Updater) SiteValues(site string) (Values, bool) {
	v, ok := u.cfg.Sites[site]
	return v.only(u.cfg.Types), ok
}
