package amipeer

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The registrar: what res_pjsip_registrar does with a REGISTER, over the
// peer's AstDB, and the AMI events Asterisk 22 raises for it
// (docs/asterisk22.md, "Registrations as they happen"). A contact is stored
// under registrar/contact/<aor>;@<md5 of its URI> as the JSON the sorcery
// AstDB wizard writes, in its field order. ContactStatus events come from
// the contact statuses Asterisk keeps in memory: a contact that only
// reached the database (a DBPut, as fan's replicator writes on a standby)
// has none, raises nothing when it expires, and gets one (and a
// ContactStatus: NonQualified) the first time a REGISTER for its AOR is
// handled.

// RegistrarConfig is the part of pjsip.conf the registrar follows.
type RegistrarConfig struct {
	// SendContactStatusOnUpdate is [global]
	// send_contact_status_on_update_registration (Asterisk's default: no):
	// a refresh raises ContactStatus only when it is set.
	SendContactStatusOnUpdate bool
	// MaxContacts is every AOR's max_contacts; 0 means 1.
	MaxContacts int
	// RemoveExisting is every AOR's remove_existing: a new contact beyond
	// MaxContacts replaces the soonest to expire instead of being refused.
	RemoveExisting bool
	// ExpirationCheck is [global] contact_expiration_check_interval: how
	// often expired contacts are pruned; 0 means 30 s.
	ExpirationCheck time.Duration
	// MinExpiration, MaxExpiration and DefaultExpiration are the AOR's
	// minimum_expiration, maximum_expiration and default_expiration in
	// seconds; 0 means 60, 7200 and 3600.
	MinExpiration, MaxExpiration, DefaultExpiration int
}

// Contact is one registration as the registrar stores it.
type Contact struct {
	AOR, Endpoint, URI string
	CallID             string
	ViaAddr            string
	ViaPort            int
	UserAgent          string
	RegServer          string
	// Expiration is the absolute expiry, in whole seconds.
	Expiration time.Time
}

// ContactID is the contact's sorcery id, "<aor>;@<md5 of uri>", and the key
// below registrar/contact/ (res/res_pjsip/location.c).
func ContactID(aor, uri string) string {
	h := md5.Sum([]byte(uri))
	return aor + ";@" + hex.EncodeToString(h[:])
}

// contactKey is the contact's full AstDB key.
func contactKey(aor, uri string) string { return "/registrar/contact/" + ContactID(aor, uri) }

// Value is the JSON Asterisk 22 stores for the contact, byte for byte in
// its field order (qualify settings at the AOR's defaults).
func (c Contact) Value() string {
	var b strings.Builder
	b.WriteByte('{')
	for i, kv := range [][2]string{
		{"via_addr", c.ViaAddr}, {"qualify_timeout", "3.000000"}, {"qualify_2xx_only", "false"},
		{"call_id", c.CallID}, {"reg_server", c.RegServer}, {"prune_on_boot", "no"}, {"path", ""},
		{"endpoint", c.Endpoint}, {"via_port", strconv.Itoa(c.ViaPort)}, {"authenticate_qualify", "no"},
		{"uri", c.URI}, {"qualify_frequency", "0"}, {"user_agent", c.UserAgent},
		{"expiration_time", strconv.FormatInt(c.Expiration.Unix(), 10)}, {"outbound_proxy", ""},
	} {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(kv[0])
		v, _ := json.Marshal(kv[1])
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.String()
}

// parseContact reads a stored contact back; false for a value that is not
// a contact (anything may have been put there).
func parseContact(key, value string) (Contact, bool) {
	id, ok := strings.CutPrefix(key, "/registrar/contact/")
	if !ok {
		return Contact{}, false
	}
	aor, _, ok := strings.Cut(id, ";@")
	if !ok {
		return Contact{}, false
	}
	var m map[string]string
	if json.Unmarshal([]byte(value), &m) != nil || m["uri"] == "" {
		return Contact{}, false
	}
	exp, _ := strconv.ParseInt(m["expiration_time"], 10, 64)
	port, _ := strconv.Atoi(m["via_port"])
	return Contact{AOR: aor, Endpoint: m["endpoint"], URI: m["uri"], CallID: m["call_id"], ViaAddr: m["via_addr"],
		ViaPort: port, UserAgent: m["user_agent"], RegServer: m["reg_server"], Expiration: time.Unix(exp, 0)}, true
}

// Registration is one REGISTER's binding, as the SIP side parsed it.
type Registration struct {
	AOR       string // the To URI's user
	URI       string // the Contact URI
	CallID    string
	ViaAddr   string
	ViaPort   int
	UserAgent string
	// Expires is what the phone asked (the Contact's expires parameter or
	// the Expires header), -1 when it asked nothing.
	Expires int
}

// ErrNoRegistrar is returned by registrar calls before EnableRegistrar.
var ErrNoRegistrar = errors.New("amipeer: registrar not enabled")

// ErrTooManyContacts is a new contact beyond max_contacts without
// remove_existing (Asterisk answers 403).
var ErrTooManyContacts = errors.New("amipeer: too many contacts")

// Dialer sends an INVITE to each contact (what Originate PJSIP/<aor> makes
// Asterisk do) and returns once each answered or the context ended.
type Dialer func(ctx context.Context, contacts []Contact) error

type registrar struct {
	cfg RegistrarConfig
	// mu serializes registrations, prunes and restarts, as Asterisk's
	// serializers do, so the events they raise keep their order.
	mu sync.Mutex
	// statuses are the contacts Asterisk keeps a status for (in memory);
	// avail counts them per AOR, for the endpoint's PeerStatus.
	statuses map[string]bool
	avail    map[string]int
	dialer   Dialer
	events   chan []Field
	// life ends when the peer closes: calls Originate started end with it.
	life context.Context
	end  context.CancelFunc
}

// EnableRegistrar turns the registrar on with cfg: REGISTERs handed to
// Register are stored and raise events, and expired contacts are pruned
// every cfg.ExpirationCheck until the peer closes.
func (p *Peer) EnableRegistrar(cfg RegistrarConfig) {
	if cfg.MaxContacts <= 0 {
		cfg.MaxContacts = 1
	}
	if cfg.ExpirationCheck <= 0 {
		cfg.ExpirationCheck = 30 * time.Second
	}
	if cfg.MinExpiration <= 0 {
		cfg.MinExpiration = 60
	}
	if cfg.MaxExpiration <= 0 {
		cfg.MaxExpiration = 7200
	}
	if cfg.DefaultExpiration <= 0 {
		cfg.DefaultExpiration = 3600
	}
	r := &registrar{cfg: cfg, statuses: map[string]bool{}, avail: map[string]int{}, events: make(chan []Field, 1<<16)}
	r.life, r.end = context.WithCancel(context.Background())
	p.mu.Lock()
	if p.closed || p.reg != nil {
		p.mu.Unlock()
		r.end()
		return
	}
	p.reg = r
	p.wg.Add(2)
	p.mu.Unlock()
	go p.raise(r)
	go p.pruneLoop(r)
}

// SetDialer sets what Originate uses to reach a contact; without one,
// Originate fails as it does for an endpoint that cannot be reached.
func (p *Peer) SetDialer(d Dialer) {
	if r := p.registrar(); r != nil {
		r.mu.Lock()
		r.dialer = d
		r.mu.Unlock()
	}
}

func (p *Peer) registrar() *registrar {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reg
}

// raise writes the registrar's events in order, after the REGISTER that
// caused them was answered (Asterisk raises them from a task queue).
func (p *Peer) raise(r *registrar) {
	defer p.wg.Done()
	defer r.end()
	for {
		select {
		case fs := <-r.events:
			p.Emit(fs...)
		case <-p.done:
			return
		}
	}
}

func (p *Peer) pruneLoop(r *registrar) {
	defer p.wg.Done()
	t := time.NewTicker(r.cfg.ExpirationCheck)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			p.PruneExpired(time.Now())
		case <-p.done:
			return
		}
	}
}

// queue hands events to raise; it waits when a burst fills the queue.
func (p *Peer) queue(r *registrar, fs []Field) {
	select {
	case r.events <- fs:
	case <-p.done:
	}
}

func (p *Peer) systemName() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.SystemName
}

// dispatched starts an event the way manager_event writes it: Event,
// Privilege, and SystemName when asterisk.conf sets one.
func (p *Peer) dispatched(name, privilege string) []Field {
	fs := []Field{{"Event", name}, {"Privilege", privilege}}
	if sn := p.systemName(); sn != "" {
		fs = append(fs, Field{"SystemName", sn})
	}
	return fs
}

func (p *Peer) contactStatus(c Contact, status string) []Field {
	return append(p.dispatched("ContactStatus", "system,all"),
		Field{"URI", c.URI}, Field{"ContactStatus", status}, Field{"AOR", c.AOR},
		Field{"EndpointName", c.Endpoint}, Field{"RoundtripUsec", "0"})
}

// endpointState raises what Asterisk raises when an endpoint's first
// contact arrives or its last one goes.
func (p *Peer) endpointState(r *registrar, endpoint string, online bool) {
	peer, dev := "Unreachable", "UNAVAILABLE"
	if online {
		peer, dev = "Reachable", "NOT_INUSE"
	}
	p.queue(r, append(p.dispatched("PeerStatus", "system,all"),
		Field{"ChannelType", "PJSIP"}, Field{"Peer", "PJSIP/" + endpoint}, Field{"PeerStatus", peer}))
	p.queue(r, append(p.dispatched("DeviceStateChange", "call,all"),
		Field{"Device", "PJSIP/" + endpoint}, Field{"State", dev}))
}

// contactsLocked lists the AOR's contacts in the database (every AOR's
// when aor is empty), sorted by key; p.mu is held.
func (p *Peer) contactsLocked(aor string) []Contact {
	prefix := "/registrar/contact/"
	if aor != "" {
		prefix += aor + ";@"
	}
	var keys []string
	for k := range p.db {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []Contact
	for _, k := range keys {
		if c, ok := parseContact(k, p.db[k]); ok {
			out = append(out, c)
		}
	}
	return out
}

// Contacts lists the AOR's contacts as Asterisk finds them: in the
// database, whoever wrote them.
func (p *Peer) Contacts(aor string) []Contact {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.contactsLocked(aor)
}

// addStatus gives a contact a status (a NonQualified event), and its
// endpoint a Reachable PeerStatus if it is the first; r.mu is held.
func (p *Peer) addStatus(r *registrar, c Contact) {
	id := ContactID(c.AOR, c.URI)
	if r.statuses[id] {
		return
	}
	r.statuses[id] = true
	r.avail[c.AOR]++
	if r.avail[c.AOR] == 1 {
		p.endpointState(r, c.Endpoint, true)
	}
	p.queue(r, p.contactStatus(c, "NonQualified"))
}

// dropStatus removes a contact's status (a Removed event), after the
// endpoint's Unreachable if it was the last; r.mu is held. A contact
// without a status raises nothing.
func (p *Peer) dropStatus(r *registrar, c Contact) {
	id := ContactID(c.AOR, c.URI)
	if !r.statuses[id] {
		return
	}
	delete(r.statuses, id)
	r.avail[c.AOR]--
	if r.avail[c.AOR] <= 0 {
		delete(r.avail, c.AOR)
		p.endpointState(r, c.Endpoint, false)
	}
	p.queue(r, p.contactStatus(c, "Removed"))
}

// granted is the expiry Asterisk grants for what the phone asked.
func (r *registrar) granted(asked int) int {
	switch {
	case asked < 0:
		return r.cfg.DefaultExpiration
	case asked == 0:
		return 0
	case asked < r.cfg.MinExpiration:
		return r.cfg.MinExpiration
	case asked > r.cfg.MaxExpiration:
		return r.cfg.MaxExpiration
	}
	return asked
}

// Register handles one REGISTER binding as res_pjsip_registrar does and
// returns the AOR's contacts afterwards (for the 200 OK) and the expiry
// granted (0: the binding was removed). The events it raises follow
// shortly, in Asterisk's order: a status for every contact of the AOR that
// had none; for a new contact the endpoint's PeerStatus (its first
// contact), then ContactStatus NonQualified, then Removed for each contact
// remove_existing replaced; for a refresh NonQualified only with
// SendContactStatusOnUpdate; for Expires 0 the endpoint's PeerStatus (its
// last contact), then Removed.
func (p *Peer) Register(reg Registration) ([]Contact, int, error) {
	r := p.registrar()
	if r == nil {
		return nil, 0, ErrNoRegistrar
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	exp := r.granted(reg.Expires)
	now := time.Now()
	key := contactKey(reg.AOR, reg.URI)
	c := Contact{AOR: reg.AOR, Endpoint: reg.AOR, URI: reg.URI, CallID: reg.CallID, ViaAddr: reg.ViaAddr,
		ViaPort: reg.ViaPort, UserAgent: reg.UserAgent, RegServer: p.systemName(),
		Expiration: time.Unix(now.Unix()+int64(exp), 0)}

	p.mu.Lock()
	existing := p.contactsLocked(reg.AOR)
	p.mu.Unlock()
	for _, e := range existing {
		p.addStatus(r, e)
	}
	found := slices.ContainsFunc(existing, func(e Contact) bool { return e.URI == reg.URI })
	switch {
	case exp == 0:
		if found {
			p.mu.Lock()
			delete(p.db, key)
			p.mu.Unlock()
			p.dropStatus(r, c)
		}
	case found:
		p.mu.Lock()
		p.db[key] = c.Value()
		p.mu.Unlock()
		if r.cfg.SendContactStatusOnUpdate {
			p.queue(r, p.contactStatus(c, "NonQualified"))
		}
	default:
		if len(existing) >= r.cfg.MaxContacts && !r.cfg.RemoveExisting {
			return existing, 0, ErrTooManyContacts
		}
		p.mu.Lock()
		p.db[key] = c.Value()
		p.mu.Unlock()
		p.addStatus(r, c)
		// remove_existing: the soonest to expire go first.
		slices.SortStableFunc(existing, func(a, b Contact) int { return a.Expiration.Compare(b.Expiration) })
		for i := 0; len(existing)-i+1 > r.cfg.MaxContacts; i++ {
			old := existing[i]
			p.mu.Lock()
			delete(p.db, contactKey(old.AOR, old.URI))
			p.mu.Unlock()
			p.dropStatus(r, old)
		}
	}
	return p.Contacts(reg.AOR), exp, nil
}

// PruneExpired deletes every contact whose expiration_time has come, as
// Asterisk's expiration check does (it runs by itself every
// ExpirationCheck), raising Removed for those with a status; it returns
// how many it deleted.
func (p *Peer) PruneExpired(now time.Time) int {
	r := p.registrar()
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p.mu.Lock()
	var gone []Contact
	for _, c := range p.contactsLocked("") {
		if !c.Expiration.After(now) {
			delete(p.db, contactKey(c.AOR, c.URI))
			gone = append(gone, c)
		}
	}
	p.mu.Unlock()
	for _, c := range gone {
		p.dropStatus(r, c)
	}
	return len(gone)
}

// Restart is an Asterisk restart as the registrar sees it: every session
// drops, the contact statuses (kept in memory) are gone, and the database
// stays, or is emptied of the registrar family (a node rebuilt, or an
// astdb.sqlite3 lost).
func (p *Peer) Restart(keepContacts bool) {
	if r := p.registrar(); r != nil {
		r.mu.Lock()
		r.statuses, r.avail = map[string]bool{}, map[string]int{}
		r.mu.Unlock()
	}
	p.mu.Lock()
	if !keepContacts {
		for k := range p.db {
			if strings.HasPrefix(k, "/registrar/") {
				delete(p.db, k)
			}
		}
	}
	p.mu.Unlock()
	p.DropSessions()
}

// ForgetActions drops the record of actions received so far: a long
// benchmark keeps the peer's memory to its database.
func (p *Peer) ForgetActions() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.actions = nil
}

// originate answers Originate for Channel PJSIP/<endpoint> (the endpoint's
// AOR has its name, as the stand-in configures them). With Async the
// answer comes at once, as Asterisk's does, whether or not the call will
// reach anyone; without it the answer waits for the dialer.
func (p *Peer) originate(m *msgBuilder, a Action) {
	ch := a.Field("Channel")
	ep, ok := strings.CutPrefix(ch, "PJSIP/")
	r := p.registrar()
	var dial Dialer
	if r != nil {
		r.mu.Lock()
		dial = r.dialer
		r.mu.Unlock()
	}
	contacts := p.Contacts(ep)
	async := strings.EqualFold(a.Field("Async"), "true") || strings.EqualFold(a.Field("Async"), "yes")
	timeout := 30 * time.Second
	if ms, err := strconv.Atoi(a.Field("Timeout")); err == nil && ms > 0 {
		timeout = time.Duration(ms) * time.Millisecond
	}
	call := func(ctx context.Context) error {
		if !ok || dial == nil || len(contacts) == 0 {
			return errors.New("no contact")
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return dial(ctx, contacts)
	}
	// A call outlives its action but not the peer.
	life := context.Background()
	if r != nil {
		life = r.life
	}
	if async {
		p.mu.Lock()
		closed := p.closed
		if !closed {
			p.wg.Add(1)
		}
		p.mu.Unlock()
		if !closed {
			go func() {
				defer p.wg.Done()
				_ = call(life)
			}()
		}
		m.ack(a, "Originate successfully queued")
		return
	}
	ctx := life
	if err := call(ctx); err != nil {
		m.fail(a, "Originate failed")
		return
	}
	m.ack(a, "Originate successfully queued")
}
