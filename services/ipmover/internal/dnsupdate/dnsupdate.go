// Package dnsupdate moves a service by DNS: it replaces the address records
// (A, AAAA, optionally SRV targets) of one name with a single RFC 2136 UPDATE
// signed with TSIG, sent to the zone's primary, and then checks that every
// authoritative server serves the new records.
//
// It never edits zone files and never restarts a name server: named applies an
// UPDATE atomically, bumps the serial, journals it and notifies secondaries,
// whereas a hand edit fights the journal and a restart drops service.
//
// Every swap is a compare-and-swap. The UPDATE carries a prerequisite that the
// old records are exactly still there, so two arbiters (or one acting on stale
// state) cannot overwrite each other; when the prerequisite fails the caller
// gets ErrStale together with what the primary serves now, and decides again.
// Delete and insert travel in one message so that no resolver ever sees, and
// negatively caches, an empty answer in between.
//
// Failback is the same swap in the other direction (Spec.Reverse).
package dnsupdate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Outcomes callers branch on. StaleError, returned with ErrStale, carries the
// records found instead.
var (
	// ErrStale: the prerequisite failed (NXRRSET/YXRRSET); someone else changed
	// the records. Nothing was written.
	ErrStale = errors.New("dnsupdate: records are not what the swap expected")
	// ErrRefused: the server's update-policy does not allow this key to change
	// these records (REFUSED). Nothing was written.
	ErrRefused = errors.New("dnsupdate: update refused by the server")
	// ErrNotAuth: the server did not accept the key (bad key name, secret or
	// time: BADKEY/BADSIG/BADTIME) or is not authoritative for the zone
	// (NOTAUTH). Nothing was written.
	ErrNotAuth = errors.New("dnsupdate: server not authoritative or key not accepted")
	// ErrUnsigned: the reply was not signed with the update key, so its claim
	// that the update happened cannot be trusted.
	ErrUnsigned = errors.New("dnsupdate: reply not signed with the update key")
	// ErrRejected: any other error rcode from the primary.
	ErrRejected = errors.New("dnsupdate: update rejected")
	// ErrUnverified: the primary accepted the update, but not every
	// authoritative server served the new records within VerifyTimeout. The
	// change is in the zone; Result says which servers lag.
	ErrUnverified = errors.New("dnsupdate: update not served by every authoritative server in time")
	// ErrNotAuthoritative: a verification answer lacked the AA bit, so it may
	// come from a cache and proves nothing.
	ErrNotAuthoritative = errors.New("dnsupdate: answer is not authoritative")
	// ErrBadAnswer: a server answered a query with an error rcode
	// (SERVFAIL while the zone does not load, REFUSED for a zone it does
	// not serve): it is up, but tells nothing about the name.
	ErrBadAnswer = errors.New("dnsupdate: server answered with an error")
)

// StaleError is returned (wrapping ErrStale) when the prerequisite failed.
type StaleError struct {
	Rcode string // NXRRSET or YXRRSET
	// Current is what the primary serves now for the managed types, re-read
	// after the failure; ReadErr is set if that re-read failed.
	Current Values
	Serial  uint32
	ReadErr error
	// AlreadyApplied: Current is already the swap's target, e.g. the same
	// command was applied before. Callers may treat this as success.
	AlreadyApplied bool
}

func (e *StaleError) Error() string {
	if e.ReadErr != nil {
		return fmt.Sprintf("%v (%s); re-reading the primary failed: %v", ErrStale, e.Rcode, e.ReadErr)
	}
	return fmt.Sprintf("%v (%s): primary serves %s at serial %d", ErrStale, e.Rcode, e.Current, e.Serial)
}

func (e *StaleError) Unwrap() error { return ErrStale }

// Key is a TSIG key. Name is lower-cased and made fully qualified by New,
// because miekg/dns looks secrets up by the exact wire name.
type Key struct {
	Name      string `yaml:"name"`
	Algorithm string `yaml:"algorithm"` // default hmac-sha256
	Secret    string `yaml:"secret"`    // base64, as tsig-keygen prints it
}

// Config describes one movable name.
type Config struct {
	Zone string `yaml:"zone"` // e.g. voip.test.
	Name string `yaml:"name"` // owner of the A/AAAA records, e.g. sip.voip.test.
	// SRVName owns the SRV records, e.g. _sip._udp.voip.test.; needed only
	// when Types has SRV.
	SRVName string `yaml:"srv_name"`
	// Types are the RRsets a swap replaces: any of A, AAAA, SRV. A type a
	// site leaves empty means "no such RRset" at that site.
	Types []string `yaml:"types"`
	// Sites maps a site name to its records, e.g. a: 192.0.2.10, b: 203.0.113.20.
	Sites map[string]Values `yaml:"sites"`
	TTL   time.Duration     `yaml:"ttl"` // TTL of inserted records, whole seconds; default 30s

	Primary string `yaml:"primary"` // host:port the UPDATE goes to (the SOA MNAME)
	// Servers are the authoritative servers (host:port) to verify on;
	// default: only Primary.
	Servers []string `yaml:"servers"`
	// Primaries, instead of Primary and Servers, are several primaries of
	// the zone that do not transfer it to each other (one per site): each
	// is updated on its own, with its own compare-and-swap (MoveOn), and
	// verified on itself.
	Primaries []string `yaml:"primaries"`
	Key       Key      `yaml:"key"`

	Timeout        time.Duration `yaml:"timeout"`         // per DNS exchange; default 3s
	VerifyTimeout  time.Duration `yaml:"verify_timeout"`  // update to verified on every server; default 10s
	VerifyInterval time.Duration `yaml:"verify_interval"` // between verification polls; default 100ms
	// Fudge is the clock skew TSIG tolerates; default 300s.
	Fudge time.Duration `yaml:"fudge"`
}

func (c *Config) setDefaults() {
	if c.TTL == 0 {
		c.TTL = 30 * time.Second
	}
	if len(c.Servers) == 0 && c.Primary != "" {
		c.Servers = []string{c.Primary}
	}
	if c.Key.Algorithm == "" {
		c.Key.Algorithm = dns.HmacSHA256
	}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Second
	}
	if c.VerifyTimeout == 0 {
		c.VerifyTimeout = 10 * time.Second
	}
	if c.VerifyInterval == 0 {
		c.VerifyInterval = 100 * time.Millisecond
	}
	if c.Fudge == 0 {
		c.Fudge = 300 * time.Second
	}
	c.Zone = canonicalName(c.Zone)
	c.Name = canonicalName(c.Name)
	if c.SRVName != "" {
		c.SRVName = canonicalName(c.SRVName)
	}
	c.Key.Name = canonicalName(c.Key.Name)
	c.Key.Algorithm = canonicalName(c.Key.Algorithm)
	for i, t := range c.Types {
		c.Types[i] = strings.ToUpper(t)
	}
}

func (c *Config) validate() error {
	var errs []error
	switch {
	case c.Primary == "" && len(c.Primaries) == 0:
		errs = append(errs, errors.New("dnsupdate: primary (or primaries, one per site) is required"))
	case c.Primary != "" && len(c.Primaries) > 0:
		errs = append(errs, errors.New("dnsupdate: primary and primaries exclude each other: one primary (with servers to verify on), or one primary per site"))
	case len(c.Primaries) > 0 && len(c.Servers) > 0:
		errs = append(errs, errors.New("dnsupdate: servers is for one primary's secondaries; with primaries, each primary is verified on itself"))
	}
	for i, p := range c.Primaries {
		if slices.Contains(c.Primaries[:i], p) {
			errs = append(errs, fmt.Errorf("dnsupdate: primaries: %s is listed twice", p))
		}
	}
	if c.Key.Name == "." || c.Key.Secret == "" {
		errs = append(errs, errors.New("dnsupdate: key name and secret are required"))
	}
	if !dns.IsSubDomain(c.Zone, c.Name) || c.Zone == "." {
		errs = append(errs, fmt.Errorf("dnsupdate: name %s is not inside zone %s", c.Name, c.Zone))
	}
	if len(c.Types) == 0 {
		errs = append(errs, errors.New("dnsupdate: types: at least one of A, AAAA, SRV is required"))
	}
	for _, t := range c.Types {
		switch t {
		case TypeA, TypeAAAA:
		case TypeSRV:
			if c.SRVName == "" || !dns.IsSubDomain(c.Zone, c.SRVName) {
				errs = append(errs, fmt.Errorf("dnsupdate: types has SRV: srv_name %q must be inside zone %s", c.SRVName, c.Zone))
			}
		default:
			errs = append(errs, fmt.Errorf("dnsupdate: types: unsupported type %q", t))
		}
	}
	if len(c.Sites) < 2 {
		errs = append(errs, errors.New("dnsupdate: sites: at least two are required"))
	}
	for name, v := range c.Sites {
		for _, a := range v.A {
			if !a.Unmap().Is4() {
				errs = append(errs, fmt.Errorf("dnsupdate: site %s: A value %s is not IPv4", name, a))
			}
		}
		for _, a := range v.AAAA {
			if !a.Is6() || a.Is4In6() {
				errs = append(errs, fmt.Errorf("dnsupdate: site %s: AAAA value %s is not IPv6", name, a))
			}
		}
	}
	if c.TTL%time.Second != 0 || c.TTL < 0 || c.TTL > 1<<31*time.Second {
		errs = append(errs, fmt.Errorf("dnsupdate: ttl %s must be whole seconds", c.TTL))
	}
	return errors.Join(errs...)
}

// Spec says which way to move: from one configured site to another.
type Spec struct {
	From string
	To   string
}

// Reverse is the failback of s.
func (s Spec) Reverse() Spec { return Spec{From: s.To, To: s.From} }

// ServerResult is what one authoritative server served when verification
// ended for it.
type ServerResult struct {
	Server   string
	Verified bool
	Serial   uint32
	Values   Values
	// Elapsed is from sending the UPDATE to this server's first answer with
	// the new records and a newer serial (or to giving up).
	Elapsed time.Duration
	Err     error // last query error, if the server never verified
}

// Result describes a swap that the primary accepted.
type Result struct {
	SerialBefore uint32
	// Sent is when the UPDATE left; UpdateRTT and every ServerResult's
	// Elapsed count from it.
	Sent      time.Time
	UpdateRTT time.Duration
	Servers   []ServerResult
}

// Updater performs swaps for one Config. It is safe for concurrent use; the
// prerequisite, not a lock, is what keeps concurrent writers apart.
type Updater struct {
	cfg Config
	log *slog.Logger
}

// New validates cfg and returns an Updater.
func New(cfg Config, log *slog.Logger) (*Updater, error) {
	cfg.Types = append([]string(nil), cfg.Types...)
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return &Updater{cfg: cfg, log: log}, nil
}

// Swap replaces the managed records from spec.From's values to spec.To's in
// one UPDATE whose prerequisite is that spec.From's values are exactly still
// there, then verifies on every configured authoritative server.
//
// Errors: *StaleError (ErrStale), ErrRefused, ErrNotAuth, ErrUnsigned,
// ErrRejected: nothing changed, as far as a signed reply can tell.
// ErrUnverified: the change was made; Result tells which servers lag.
func (u *Updater) Swap(ctx context.Context, spec Spec) (Result, error) {
	from, okF := u.cfg.Sites[spec.From]
	to, okT := u.cfg.Sites[spec.To]
	if !okF || !okT {
		return Result{}, fmt.Errorf("dnsupdate: swap %s->%s: unknown site", spec.From, spec.To)
	}
	from, to = from.only(u.cfg.Types), to.only(u.cfg.Types)
	if from.Equal(to) {
		// named would accept it without bumping the serial, and verification
		// could never see a newer serial.
		return Result{}, fmt.Errorf("dnsupdate: swap %s->%s: sites have the same records %s", spec.From, spec.To, to)
	}
	log := u.log.With("zone", u.cfg.Zone, "name", u.cfg.Name, "from_site", spec.From, "to_site", spec.To)

	primary := u.oneShot(u.cfg.Primary)
	before, err := u.serial(ctx, primary)
	if err != nil {
		return Result{}, fmt.Errorf("swap %s->%s: reading serial before: %w", spec.From, spec.To, err)
	}
	res := Result{SerialBefore: before}

	sent := time.Now()
	res.Sent = sent
	rcode, err := u.send(ctx, primary, u.updateMsg(from, to))
	res.UpdateRTT = time.Since(sent)
	if err != nil {
		return res, fmt.Errorf("swap %s->%s: %w", spec.From, spec.To, err)
	}
	switch rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNXRrset, dns.RcodeYXRrset:
		se := &StaleError{Rcode: dns.RcodeToString[rcode]}
		se.Current, se.Serial, se.ReadErr = u.read(ctx, primary)
		se.AlreadyApplied = se.ReadErr == nil && se.Current.Equal(to)
		log.Warn("dns swap prerequisite failed", "rcode", se.Rcode, "current", se.Current.String(),
			"serial", se.Serial, "already_applied", se.AlreadyApplied)
		return res, fmt.Errorf("swap %s->%s: %w", spec.From, spec.To, se)
	case dns.RcodeRefused:
		return res, fmt.Errorf("swap %s->%s: primary %s: %w (REFUSED)", spec.From, spec.To, u.cfg.Primary, ErrRefused)
	case dns.RcodeNotAuth:
		return res, fmt.Errorf("swap %s->%s: primary %s: %w (NOTAUTH)", spec.From, spec.To, u.cfg.Primary, ErrNotAuth)
	default:
		return res, fmt.Errorf("swap %s->%s: primary %s: %w (%s)", spec.From, spec.To, u.cfg.Primary,
			ErrRejected, dns.RcodeToString[rcode])
	}
	log.Info("dns update accepted", "serial_before", before, "rtt", res.UpdateRTT, "values", to.String())

	res.Servers = u.verify(ctx, to, before, sent)
	var lag []string
	for _, s := range res.Servers {
		log.Info("dns update verification", "server", s.Server, "verified", s.Verified, "serial", s.Serial,
			"served", s.Values.String(), "elapsed", s.Elapsed, "error", s.Err)
		if !s.Verified {
			lag = append(lag, s.Server)
		}
	}
	if len(lag) > 0 {
		return res, fmt.Errorf("swap %s->%s: %w: %s", spec.From, spec.To, ErrUnverified, strings.Join(lag, ", "))
	}
	return res, nil
}

// Current reads the managed records and the SOA serial from the primary.
func (u *Updater) Current(ctx context.Context) (Values, uint32, error) {
	v, serial, err := u.read(ctx, u.oneShot(u.cfg.Primary))
	if err != nil {
		return Values{}, 0, fmt.Errorf("reading %s from %s: %w", u.cfg.Name, u.cfg.Primary, err)
	}
	return v, serial, nil
}

// SiteOf names the configured site whose records equal v, if any; useful to
// learn where the service points after ErrStale or at start-up.
func (u *Updater) SiteOf(v Values) (string, bool) {
	for name, s := range u.cfg.Sites {
		if s.only(u.cfg.Types).Equal(v.only(u.cfg.Types)) {
			return name, true
		}
	}
	return "", false
}

func (u *Updater) updateMsg(from, to Values) *dns.Msg {
	m := new(dns.Msg)
	m.SetUpdate(u.cfg.Zone)
	ttl := uint32(u.cfg.TTL / time.Second)
	for _, t := range u.cfg.Types {
		owner := u.owner(t)
		if old := from.rrs(t, owner, 0); len(old) > 0 {
			m.Used(old) // the whole RRset must equal these, value for value
		} else {
			m.RRsetNotUsed([]dns.RR{&dns.ANY{Hdr: hdr(owner, typeCode(t), 0)}})
		}
		m.RemoveRRset([]dns.RR{&dns.ANY{Hdr: hdr(owner, typeCode(t), 0)}})
		if rrs := to.rrs(t, owner, ttl); len(rrs) > 0 {
			m.Insert(rrs)
		}
	}
	// Last: anything changed after SetTsig breaks the MAC.
	m.SetTsig(u.cfg.Key.Name, u.cfg.Key.Algorithm, uint16(u.cfg.Fudge/time.Second), time.Now().Unix())
	return m
}

func (u *Updater) owner(t string) string {
	if t == TypeSRV {
		return u.cfg.SRVName
	}
	return u.cfg.Name
}

// send delivers a signed UPDATE to server (a primary) and returns its rcode,
// after making sure the reply is signed with our key. The one exception is
// NOTAUTH: named answers a bad key or signature unsigned, since it cannot
// sign with a key it does not share.
func (u *Updater) send(ctx context.Context, ex exchanger, m *dns.Msg) (int, error) {
	server := ex.server()
	r, err := ex.exchange(ctx, m)
	if r == nil {
		return 0, fmt.Errorf("sending update to %s: %w", server, err)
	}
	if r.Rcode == dns.RcodeNotAuth {
		return r.Rcode, nil
	}
	if err != nil {
		// The client verifies a TSIG that is present; a bad one lands here.
		return 0, fmt.Errorf("reply from %s (%s) failed TSIG verification: %w: %w",
			server, dns.RcodeToString[r.Rcode], ErrUnsigned, err)
	}
	if r.IsTsig() == nil {
		return 0, fmt.Errorf("reply from %s (%s): %w", server, dns.RcodeToString[r.Rcode], ErrUnsigned)
	}
	return r.Rcode, nil
}

// query asks server directly, without recursion, and insists on an
// authoritative answer: a cached one proves nothing about the zone.
func (u *Updater) query(ctx context.Context, ex exchanger, name string, qtype uint16) (*dns.Msg, error) {
	server := ex.server()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.RecursionDesired = false
	r, err := ex.exchange(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("query %s %s at %s: %w", name, dns.TypeToString[qtype], server, err)
	}
	if r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError {
		return nil, fmt.Errorf("query %s %s at %s: %w: rcode %s", name, dns.TypeToString[qtype], server, ErrBadAnswer, dns.RcodeToString[r.Rcode])
	}
	if !r.Authoritative {
		return nil, fmt.Errorf("query %s %s at %s: %w", name, dns.TypeToString[qtype], server, ErrNotAuthoritative)
	}
	return r, nil
}

func (u *Updater) serial(ctx context.Context, ex exchanger) (uint32, error) {
	r, err := u.query(ctx, ex, u.cfg.Zone, dns.TypeSOA)
	if err != nil {
		return 0, err
	}
	for _, rr := range r.Answer {
		if soa, ok := rr.(*dns.SOA); ok && strings.EqualFold(soa.Hdr.Name, u.cfg.Zone) {
			return soa.Serial, nil
		}
	}
	return 0, fmt.Errorf("%w: no SOA for %s at %s", ErrBadAnswer, u.cfg.Zone, ex.server())
}

// read returns the managed RRsets and the serial as server serves them.
func (u *Updater) read(ctx context.Context, ex exchanger) (Values, uint32, error) {
	v, serial, _, err := u.observe(ctx, ex)
	return v, serial, err
}

// observe is read plus whether every served RR has the configured TTL. The
// serial is read first, so it is never newer than the records read after it.
func (u *Updater) observe(ctx context.Context, ex exchanger) (Values, uint32, bool, error) {
	serial, err := u.serial(ctx, ex)
	if err != nil {
		return Values{}, 0, false, err
	}
	var v Values
	ttlOK := true
	ttl := uint32(u.cfg.TTL / time.Second)
	for _, t := range u.cfg.Types {
		owner := u.owner(t)
		r, err := u.query(ctx, ex, owner, typeCode(t))
		if err != nil {
			return Values{}, 0, false, err
		}
		if !v.add(r.Answer, owner, typeCode(t), ttl) {
			ttlOK = false
		}
	}
	return v, serial, ttlOK, nil
}

// verify polls every server concurrently until it serves want exactly, with
// the configured TTL, at a serial newer than before, or VerifyTimeout passes.
func (u *Updater) verify(ctx context.Context, want Values, before uint32, sent time.Time) []ServerResult {
	ctx, cancel := context.WithDeadline(ctx, sent.Add(u.cfg.VerifyTimeout))
	defer cancel()
	out := make([]ServerResult, len(u.cfg.Servers))
	var wg sync.WaitGroup
	for i, server := range u.cfg.Servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = u.verifyOne(ctx, u.oneShot(server), want, before, true, sent)
		}()
	}
	wg.Wait()
	return out
}

// verifyOne polls one server; newer asks for a serial after before (a
// secondary shows the change only with the transfer that brings it).
func (u *Updater) verifyOne(ctx context.Context, ex exchanger, want Values, before uint32, newer bool, sent time.Time) ServerResult {
	res := ServerResult{Server: ex.server()}
	tick := time.NewTicker(u.cfg.VerifyInterval)
	defer tick.Stop()
	for {
		v, serial, ttlOK, err := u.observe(ctx, ex)
		res.Elapsed, res.Err = time.Since(sent), err
		if err == nil {
			res.Values, res.Serial = v, serial
			if (!newer || serialAfter(serial, before)) && ttlOK && v.Equal(want) {
				res.Verified = true
				return res
			}
		}
		select {
		case <-ctx.Done():
			if res.Err == nil {
				res.Err = fmt.Errorf("serves %s at serial %d (ttl ok %t), want %s at serial > %d: %w",
					res.Values, res.Serial, ttlOK, want, before, ctx.Err())
			}
			return res
		case <-tick.C:
		}
	}
}
