// Package keeper keeps the SIP dialogs of calls a node adopted after taking
// a group over, so that a hang-up on either side reaches the other.
//
// Asterisk is a back-to-back user agent: a call between two phones is two
// dialogs, phone A with the PBX and the PBX with phone B. When the node that
// set the call up fails, a call whose media flows directly between the
// phones keeps its audio, but the new holder's Asterisk knows neither
// dialog: it answers the phones' in-dialog requests with 481
// (Call/Transaction Does Not Exist), which ends the sender's dialog (RFC
// 3261 12.2.1.2), and the other phone is never told. A Keeper watches SIP
// arriving at the floating address's SIP port on a packet capture (an
// AF_PACKET socket whose BPF program passes only UDP to that address and
// port, and from that port: the PBX's answers) and, when a phone sends a
// request in a kept dialog,
// ends the call on the other side with a BYE sent from the floating address
// and the PBX's port, exactly as the PBX would have sent it, retransmitted
// on RFC 3261's UDP timers until a final response is seen on the capture.
//
// A BYE from a phone ends the call: the other phone gets a BYE. Any other
// request (a re-INVITE to hold, UPDATE, REFER to transfer, INFO) cannot be
// carried out without the PBX, so it ends the call too: the other phone
// gets a BYE at once, and the sender gets one as soon as the PBX's 481 to
// its request has gone out. The 481 already ends the sender's dialog, but a
// phone only SHOULD end it (RFC 3261 12.2.1.2, 14.1), and one that keeps a
// call up after a failed hold or transfer leaves its user in a silent call;
// the BYE makes the end certain and shows it on the phone. It follows the
// 481 so that it never meets the phone's request still outstanding.
//
// A kept call lasts at most Config.KeepFor from its first adoption
// (CallRecord.KeptSince, carried from keeper to keeper): then the keeper
// ends it on both sides with BYEs, as a phone's request would. A kept call
// may be a ghost (it ended while no node kept it, and its record was
// adopted all the same), whose dialogs nobody will ever end, and even a
// live one has lost hold, transfer and session refresh with its PBX.
//
// The keeper never sends to an address a message names (Via, Contact,
// Record-Route): only to the phones' addresses in its records, and only in
// answer to a request that came from one of those phones' addresses or at
// the end of a kept call's lifetime.
package keeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Packet is one UDP datagram seen on the capture.
type Packet struct {
	Src, Dst netip.AddrPort
	Payload  []byte
}

// Source delivers the datagrams to and from one floating address's SIP
// port until ctx ends or it is closed (*Capture).
type Source interface {
	Read(ctx context.Context, deliver func(Packet)) error
	Close() error
}

// Sender sends one UDP datagram with any source address and port
// (*RawSender).
type Sender interface {
	SendUDP(src, dst netip.AddrPort, payload []byte) error
}

// Store writes and deletes this node's kept records in the calls bucket.
type Store interface {
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
}

// Config assembles a Keeper.
type Config struct {
	Cluster, Node string
	// Open opens the capture of one floating address's SIP port.
	Open   func(addr netip.AddrPort) (Source, error)
	Sender Sender
	Store  Store
	Logger *slog.Logger
	// T1 and T2 are RFC 3261's timers (500 ms and 4 s); a BYE is sent
	// again after T1, doubling up to T2, until a final response or 64*T1.
	T1, T2 time.Duration
	// Await481 bounds the wait for the PBX's 481 before the BYE to a phone
	// whose request ended its call (T1 when zero).
	Await481 time.Duration
	// KeepFor is a kept call's lifetime from its first adoption
	// (DefaultKeepFor when zero); past it the call is ended on both sides.
	KeepFor time.Duration
	// Now is the clock the lifetimes are measured with (time.Now when
	// nil); kept records carry wall-clock times.
	Now func() time.Time
}

// Defaults of RFC 3261 (17.1.2.2, table 4).
const (
	DefaultT1 = 500 * time.Millisecond
	DefaultT2 = 4 * time.Second
)

// A kept call's lifetime (Config.KeepFor; the ipmover's calls.keep_for).
//
// The default is the cap classic PBX call preservation puts on a call
// kept up without its call server: 2 hours covers all but the rarest
// business call, and a carried call cannot be held, transferred or
// refreshed any more anyway (any such request ends it). A ghost costs a
// record and a slot of events.MaxCallsPerNode until then, no more.
//
// The bound above stays well inside the calls bucket's age
// (bus.CallsMaxAge, a day): a kept record is written when the call is
// adopted and never rewritten, and a record the bucket forgot would make
// the next holder leave the call, and the node that set it up (still
// holding its channels after a planned move) hang its channels up while
// the call is alive. The bound below leaves a call the time to be heard
// of at all; nothing shorter is a lifetime.
const (
	DefaultKeepFor = 2 * time.Hour
	MinKeepFor     = time.Minute
	MaxKeepFor     = 12 * time.Hour
)

// Causes of a kept call's end (metric label and log value).
const (
	CauseBye     = "bye"     // a phone hung up
	CauseRequest = "request" // a phone sent another in-dialog request
	CauseExpired = "expired" // the call outlived Config.KeepFor
)

// Keeper keeps the dialogs of adopted calls, per group.
type Keeper struct {
	cfg Config
	log *slog.Logger
	m   *Metrics

	mu     sync.Mutex
	groups map[string]*keptGroup
	kept   int
	closed bool

	writes    chan write
	writerEnd chan struct{}
	stopWrite context.CancelFunc
	captures  sync.WaitGroup
}

// keptGroup is one floating address's kept calls.
type keptGroup struct {
	name    string
	addr    netip.AddrPort
	calls   map[string]*call        // by record id
	dialogs map[dialogKey]dialogRef // the phones' requests, by Call-ID and the PBX's tag
	txs     map[string]*transaction // the BYEs in flight, by Via branch
	// gen counts the captures opened; a packet delivered by an older one
	// (closing while a new one opens) is ignored.
	gen      int
	stop     context.CancelFunc
	warnedAt time.Time
}

type dialogKey struct{ callID, localTag string }

type dialogRef struct {
	c   *call
	leg int
}

type call struct {
	rec    events.CallRecord
	key    string
	legs   [2]*leg
	ending bool
	// await is the request that ended the call, whose sender gets a BYE
	// once the PBX's 481 to it has gone out.
	await *await
	txs   [2]*transaction
	// expire ends the call at the end of its lifetime.
	expire *time.Timer
}

type await struct {
	leg    int
	cseq   uint32
	method string
	timer  *time.Timer
}

// transaction is one BYE and its retransmissions (a non-INVITE client
// transaction, RFC 3261 17.1.2, over UDP).
type transaction struct {
	g           *keptGroup
	c           *call
	leg         int
	branch      string
	payload     []byte
	started     time.Time
	interval    time.Duration
	timer       *time.Timer
	provisional bool
	done        bool
}

type write struct {
	key   string
	value []byte // nil: delete
}

// New returns a Keeper; Open, Sender and Store are required.
func New(cfg Config) *Keeper {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.T1 <= 0 {
		cfg.T1 = DefaultT1
	}
	if cfg.T2 <= 0 {
		cfg.T2 = DefaultT2
	}
	if cfg.Await481 <= 0 {
		cfg.Await481 = cfg.T1
	}
	if cfg.KeepFor <= 0 {
		cfg.KeepFor = DefaultKeepFor
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &Keeper{cfg: cfg, log: cfg.Logger.With("component", "keeper"), m: NewMetrics(), groups: map[string]*keptGroup{},
		writes: make(chan write, 2*events.MaxCallsPerNode+64), writerEnd: make(chan struct{}), stopWrite: cancel}
	go k.writer(ctx)
	return k
}

// Metrics are the keeper's series.
func (k *Keeper) Metrics() *Metrics { return k.m }

// Kept is how many calls the keeper keeps now, over every group.
func (k *Keeper) Kept() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.kept
}

// ErrClosed refuses calls handed to a closed Keeper.
var ErrClosed = errors.New("keeper closed")

// Keep starts keeping recs, the records this node adopted for group (as
// PlanAdoption made them: each leg's CSeq is the one its BYE carries),
// whose phones reach the PBX at addr, the floating address's SIP port. It
// writes each under this node's kept key, and opens the capture of addr if
// none is open. It returns how many of recs it keeps: a call kept already
// counts (and is kept as it was), and none is kept beyond
// events.MaxCallsPerNode.
func (k *Keeper) Keep(group string, addr netip.AddrPort, recs []events.CallRecord) (int, error) {
	if !addr.Addr().Is4() || addr.Port() == 0 {
		return 0, fmt.Errorf("keep calls of %s: %s is no IPv4 address and port", group, addr)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return 0, ErrClosed
	}
	g := k.groups[group]
	if g == nil {
		g = &keptGroup{name: group, addr: addr, calls: map[string]*call{}, dialogs: map[dialogKey]dialogRef{}, txs: map[string]*transaction{}}
	}
	if g.addr != addr {
		return 0, fmt.Errorf("keep calls of %s on %s: kept on %s already", group, addr, g.addr)
	}
	type ready struct {
		c     *call
		value []byte
	}
	var (
		add     []ready
		already int
	)
	taken := map[dialogKey]bool{}
	for _, rec := range recs {
		if _, dup := g.calls[rec.ID]; dup {
			already++
			continue
		}
		if k.kept+len(add) >= events.MaxCallsPerNode {
			break
		}
		c, value, err := k.newCall(group, rec)
		if err == nil {
			for _, l := range c.legs {
				key := dialogKey{l.callID, l.localTag}
				if _, kept := g.dialogs[key]; kept || taken[key] {
					err = fmt.Errorf("dialog %s is another kept call's", l.callID)
				}
			}
		}
		if err != nil {
			k.log.Warn("kept record refused", "group", group, "call", rec.ID, "err", err)
			continue
		}
		for _, l := range c.legs {
			taken[dialogKey{l.callID, l.localTag}] = true
		}
		add = append(add, ready{c, value})
	}
	if len(add) == 0 {
		return already, nil
	}
	if g.stop == nil {
		if err := k.openCapture(g); err != nil {
			return 0, err
		}
	}
	k.groups[group] = g
	now := k.cfg.Now()
	for _, r := range add {
		c := r.c
		g.calls[c.rec.ID] = c
		for i, l := range c.legs {
			g.dialogs[dialogKey{l.callID, l.localTag}] = dialogRef{c, i}
		}
		k.enqueue(write{key: c.key, value: r.value})
		// Measured from the first adoption: a call moved from keeper to
		// keeper does not start its lifetime again, and one adopted past
		// it (taken up after a restart) ends at once.
		until := c.rec.KeptSince.Add(k.cfg.KeepFor)
		c.expire = time.AfterFunc(max(until.Sub(now), 0), func() { k.expired(g, c) })
		k.log.Info("keeping adopted call", "group", group, "call", c.rec.ID, "adopted_from", c.rec.AdoptedFrom,
			"sip_call_ids", []string{c.legs[0].callID, c.legs[1].callID}, "phones", []string{c.legs[0].dest.String(), c.legs[1].dest.String()},
			"until", until.UTC().Format(time.RFC3339))
	}
	k.kept += len(add)
	k.m.kept.Set(float64(k.kept))
	return already + len(add), nil
}

func (k *Keeper) newCall(group string, rec events.CallRecord) (*call, []byte, error) {
	if err := rec.Validate(); err != nil {
		return nil, nil, err
	}
	if err := rec.Complete(); err != nil {
		return nil, nil, err
	}
	if rec.Node != k.cfg.Node || rec.Cluster != k.cfg.Cluster || rec.Group != group || !rec.Kept || rec.Media != events.MediaDirect {
		return nil, nil, fmt.Errorf("record of %s/%s/%s is no direct call of %s kept by %s", rec.Cluster, rec.Group, rec.Node, group, k.cfg.Node)
	}
	c := &call{rec: rec, key: events.KeptKey(rec.Cluster, rec.Group, rec.Node, rec.ID)}
	for i := range c.legs {
		l, err := newLeg(rec.Legs[i], rec.Legs[i].CSeq)
		if err != nil {
			return nil, nil, fmt.Errorf("legs[%d]: %w", i, err)
		}
		if rec.Legs[i].CSeq < CSeqBase || rec.Legs[i].CSeq > maxCSeq {
			return nil, nil, fmt.Errorf("legs[%d]: CSeq %d outside %d..%d", i, rec.Legs[i].CSeq, CSeqBase, maxCSeq)
		}
		c.legs[i] = l
	}
	if c.legs[0].callID == c.legs[1].callID && c.legs[0].localTag == c.legs[1].localTag {
		return nil, nil, errors.New("both legs are one dialog")
	}
	value, err := json.Marshal(rec)
	if err != nil {
		return nil, nil, err
	}
	if len(value) > events.MaxCallRecord {
		return nil, nil, fmt.Errorf("record of %d bytes", len(value))
	}
	return c, value, nil
}

// openCapture starts reading g's address. Caller holds k.mu.
func (k *Keeper) openCapture(g *keptGroup) error {
	src, err := k.cfg.Open(g.addr)
	if err != nil {
		return fmt.Errorf("keep calls of %s: capture of %s: %w", g.name, g.addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.gen++
	gen := g.gen
	g.stop = cancel
	k.captures.Add(1)
	go func() {
		defer k.captures.Done()
		deliver := func(p Packet) { k.handle(g, gen, p) }
		for {
			err := src.Read(ctx, deliver)
			src.Close()
			if ctx.Err() != nil {
				return
			}
			// Opened again while the group's calls are kept: they are not
			// watched meanwhile.
			k.m.captureErrors.Inc()
			k.log.Error("capture of kept dialogs stopped; opening it again", "group", g.name, "addr", g.addr.String(), "err", err)
			for {
				select {
				case <-time.After(captureRetry):
				case <-ctx.Done():
					return
				}
				if src, err = k.cfg.Open(g.addr); err == nil {
					break
				}
				k.log.Warn("capture of kept dialogs not opened; retried", "group", g.name, "err", err)
			}
		}
	}()
	return nil
}

// captureRetry is the pause before a failed capture is opened again.
const captureRetry = time.Second

// Release stops keeping group's calls: the node no longer holds its
// address, so neither the phones' requests nor the answers to its BYEs
// reach it any more. The records stay for the next holder, except those
// of calls already ending (their BYEs went out; nobody has more to tell).
// It returns how many records it left.
func (k *Keeper) Release(group string) int {
	k.mu.Lock()
	g := k.groups[group]
	if g == nil {
		k.mu.Unlock()
		return 0
	}
	left := k.dropGroup(g)
	k.mu.Unlock()
	k.log.Info("stopped keeping calls: group released", "group", group, "records_left", left)
	return left
}

// dropGroup stops g's capture and timers, and returns how many records it
// leaves. Caller holds k.mu.
func (k *Keeper) dropGroup(g *keptGroup) (left int) {
	delete(k.groups, g.name)
	if g.stop != nil {
		g.stop()
		g.stop = nil
	}
	for _, c := range g.calls {
		for _, tx := range c.txs {
			if tx != nil && tx.timer != nil {
				tx.timer.Stop()
			}
		}
		if c.await != nil {
			c.await.timer.Stop()
		}
		c.expire.Stop()
		if c.ending {
			k.enqueue(write{key: c.key})
		} else {
			left++
		}
	}
	k.kept -= len(g.calls)
	k.m.kept.Set(float64(k.kept))
	return left
}

// Close stops keeping every group (leaving their records), and waits for
// the record writes already queued until ctx ends.
func (k *Keeper) Close(ctx context.Context) {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	for _, g := range k.groups {
		k.dropGroup(g)
	}
	k.closed = true
	close(k.writes)
	k.mu.Unlock()
	k.captures.Wait()
	select {
	case <-k.writerEnd:
	case <-ctx.Done():
		k.stopWrite()
		<-k.writerEnd
	}
}

// handle reads one datagram of g's capture.
func (k *Keeper) handle(g *keptGroup, gen int, p Packet) {
	inbound, fromSIPPort := p.Dst == g.addr, p.Src.Port() == g.addr.Port()
	if !inbound && !fromSIPPort || isKeepalive(p.Payload) {
		return
	}
	m, err := parseMessage(p.Payload)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.groups[g.name] != g || g.gen != gen {
		return
	}
	if err != nil {
		reason := RefusedMalformed
		if errors.Is(err, errTooLarge) {
			reason = RefusedTooLarge
		}
		k.m.refused.WithLabelValues(reason).Inc()
		return
	}
	switch {
	case inbound && m.request:
		k.onRequest(g, p, m)
	case inbound:
		k.onResponse(g, p, m)
	case !m.request:
		k.onPBXResponse(g, p, m)
	}
	// Other requests from the SIP port are the PBX's own or this keeper's
	// BYEs: nothing to do.
}

// Reasons a message on the capture was refused (metric label).
const (
	RefusedMalformed = "malformed"
	RefusedTooLarge  = "too_large"
	// RefusedSource: a message in a kept dialog (or answering a kept BYE)
	// from an address that is not its phone's, or with the wrong tags.
	RefusedSource = "source"
)

func (k *Keeper) onRequest(g *keptGroup, p Packet, m message) {
	if m.method == "ACK" || m.method == "CANCEL" {
		// An ACK of the PBX's 481 to a re-INVITE, a CANCEL of a request
		// the PBX has answered: no request of their own.
		return
	}
	ref, ok := g.dialogs[dialogKey{m.callID, m.toTag}]
	if !ok {
		return // not a kept dialog: most of what the PBX receives
	}
	c, l := ref.c, ref.c.legs[ref.leg]
	if m.fromTag != l.remoteTag || !l.from(p.Src.Addr()) {
		k.m.refused.WithLabelValues(RefusedSource).Inc()
		k.warn(g, "request in a kept dialog refused: not from its phone", "call", c.rec.ID, "leg", ref.leg,
			"method", m.method, "src", p.Src.String(), "sip_call_id", m.callID)
		return
	}
	if c.ending {
		return // a retransmission, or the other phone ending too
	}
	cause := CauseRequest
	if m.method == "BYE" {
		cause = CauseBye
	}
	c.ending = true
	c.expire.Stop()
	k.m.ended.WithLabelValues(strconv.Itoa(ref.leg), cause).Inc()
	k.log.Info("kept call ended by a phone", "group", g.name, "call", c.rec.ID, "leg", ref.leg, "method", m.method,
		"cause", cause, "src", p.Src.String(), "sip_call_id", m.callID)
	k.startBye(g, c, 1-ref.leg)
	if cause == CauseRequest {
		a := &await{leg: ref.leg, cseq: m.cseq, method: m.method}
		a.timer = time.AfterFunc(k.cfg.Await481, func() { k.awaitExpired(g, c, a) })
		c.await = a
	}
}

// expired ends a kept call at the end of its lifetime: a BYE in each leg,
// as the PBX would send when it hangs a call up. A live call's phones are
// told, a ghost's answer 481; either way the record goes once both are
// answered (or given up).
func (k *Keeper) expired(g *keptGroup, c *call) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.groups[g.name] != g || g.calls[c.rec.ID] != c || c.ending {
		return
	}
	c.ending = true
	k.m.expired.Inc()
	k.log.Info("kept call ended: its lifetime is over", "group", g.name, "call", c.rec.ID, "cause", CauseExpired,
		"kept_since", c.rec.KeptSince.UTC().Format(time.RFC3339), "keep_for", k.cfg.KeepFor.String())
	k.startBye(g, c, 0)
	k.startBye(g, c, 1)
}

// onPBXResponse sees the PBX's answers leaving its SIP port: its 481 to a
// request that ended a kept call (the To tag the request carried kept, as
// Asterisk does) lets that phone's BYE go.
func (k *Keeper) onPBXResponse(g *keptGroup, p Packet, m message) {
	ref, ok := g.dialogs[dialogKey{m.callID, m.toTag}]
	if !ok {
		return
	}
	a := ref.c.await
	if a == nil || a.leg != ref.leg || m.status < 200 || m.cseq != a.cseq || m.cseqMethod != a.method ||
		!ref.c.legs[ref.leg].from(p.Dst.Addr()) {
		return
	}
	a.timer.Stop()
	ref.c.await = nil
	k.startBye(g, ref.c, ref.leg)
}

func (k *Keeper) awaitExpired(g *keptGroup, c *call, a *await) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.groups[g.name] != g || c.await != a {
		return
	}
	c.await = nil
	k.m.unseen481.Inc()
	k.log.Warn("no answer of the PBX seen to a request that ended a kept call; ending its sender's dialog anyway",
		"group", g.name, "call", c.rec.ID, "leg", a.leg, "method", a.method)
	k.startBye(g, c, a.leg)
}

// onResponse matches a phone's answer to a BYE the keeper sent.
func (k *Keeper) onResponse(g *keptGroup, p Packet, m message) {
	tx, ok := g.txs[m.branch]
	if !ok || tx.done {
		return
	}
	l := tx.c.legs[tx.leg]
	if m.callID != l.callID || m.cseqMethod != "BYE" || m.cseq != l.bye.cseq || !l.from(p.Src.Addr()) {
		k.m.refused.WithLabelValues(RefusedSource).Inc()
		k.warn(g, "answer to a kept BYE refused: not from its phone", "call", tx.c.rec.ID, "leg", tx.leg,
			"status", m.status, "src", p.Src.String())
		return
	}
	if m.status < 200 {
		tx.provisional = true
		return
	}
	k.m.answered.WithLabelValues(strconv.Itoa(m.status/100) + "xx").Inc()
	k.log.Info("BYE answered", "group", g.name, "call", tx.c.rec.ID, "leg", tx.leg, "status", m.status,
		"after", time.Since(tx.started).Round(time.Millisecond))
	k.finish(tx)
}

// startBye sends a BYE in leg i of c. Caller holds k.mu.
func (k *Keeper) startBye(g *keptGroup, c *call, i int) {
	l := c.legs[i]
	req := l.bye
	req.via, req.branch, req.reasonQ = g.addr, newBranch(), q850NormalClearing
	tx := &transaction{g: g, c: c, leg: i, branch: req.branch, payload: req.encode(), started: time.Now(), interval: k.cfg.T1}
	g.txs[tx.branch] = tx
	c.txs[i] = tx
	k.m.byes.Inc()
	k.send(tx)
	k.log.Info("BYE sent in a kept dialog", "group", g.name, "call", c.rec.ID, "leg", i, "to", l.dest.String(),
		"sip_call_id", l.callID, "cseq", req.cseq, "branch", tx.branch)
	tx.timer = time.AfterFunc(tx.interval, func() { k.retransmit(tx) })
}

// q850NormalClearing is the cause the BYE's Reason header gives (RFC 3326).
const q850NormalClearing = 16

func (k *Keeper) send(tx *transaction) {
	l := tx.c.legs[tx.leg]
	if err := k.cfg.Sender.SendUDP(tx.g.addr, l.dest, tx.payload); err != nil {
		k.m.sendErrors.Inc()
		k.log.Warn("BYE not sent; retried on the retransmission timer", "group", tx.g.name, "call", tx.c.rec.ID,
			"leg", tx.leg, "to", l.dest.String(), "err", err)
	}
}

// retransmit is timer E of a non-INVITE client transaction over UDP: the
// request again after T1, doubling up to T2 (at T2 once a provisional
// answer came), until timer F, 64*T1 after the first.
func (k *Keeper) retransmit(tx *transaction) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if tx.done || k.groups[tx.g.name] != tx.g {
		return
	}
	left := 64*k.cfg.T1 - time.Since(tx.started)
	if left <= 0 {
		k.m.unanswered.Inc()
		k.log.Warn("BYE unanswered: gave up", "group", tx.g.name, "call", tx.c.rec.ID, "leg", tx.leg,
			"to", tx.c.legs[tx.leg].dest.String(), "after", time.Since(tx.started).Round(time.Millisecond))
		k.finish(tx)
		return
	}
	k.m.retransmissions.Inc()
	k.send(tx)
	tx.interval = min(2*tx.interval, k.cfg.T2)
	if tx.provisional {
		tx.interval = k.cfg.T2
	}
	tx.timer.Reset(min(tx.interval, left))
}

// finish ends a BYE transaction, and the call with its last one. Caller
// holds k.mu.
func (k *Keeper) finish(tx *transaction) {
	tx.done = true
	tx.timer.Stop()
	g, c := tx.g, tx.c
	delete(g.txs, tx.branch)
	if c.await != nil {
		return
	}
	for _, t := range c.txs {
		if t != nil && !t.done {
			return
		}
	}
	for _, l := range c.legs {
		delete(g.dialogs, dialogKey{l.callID, l.localTag})
	}
	c.expire.Stop()
	delete(g.calls, c.rec.ID)
	k.kept--
	k.m.kept.Set(float64(k.kept))
	k.enqueue(write{key: c.key})
	k.log.Info("kept call over; record deleted", "group", g.name, "call", c.rec.ID)
	if len(g.calls) == 0 && g.stop != nil {
		// Nothing left to watch: the capture costs a filter run per packet
		// on the interface.
		g.stop()
		g.stop = nil
	}
}

// warn logs a refusal at most once a second per group: a flood of forged
// messages must not flood the log.
func (k *Keeper) warn(g *keptGroup, msg string, args ...any) {
	if now := time.Now(); now.Sub(g.warnedAt) >= time.Second {
		g.warnedAt = now
		k.log.Warn(msg, append([]any{"group", g.name}, args...)...)
	}
}

// enqueue hands a record write to the writer. Caller holds k.mu.
func (k *Keeper) enqueue(w write) {
	if k.closed {
		return
	}
	select {
	case k.writes <- w:
	default:
		op := opOf(w)
		k.m.recordErrors.WithLabelValues(op).Inc()
		k.log.Error("kept record not written: queue full", "key", w.key, "op", op)
	}
}

func opOf(w write) string {
	if w.value == nil {
		return "delete"
	}
	return "put"
}

// Writer retries of one record write.
const (
	writeAttempts = 5
	writeTimeout  = 2 * time.Second
	writeBackoff  = 250 * time.Millisecond
)

// writer writes the kept records in the order they were queued (a call's
// put before its delete), each tried a few times: the bus may be electing a
// leader.
func (k *Keeper) writer(ctx context.Context) {
	defer close(k.writerEnd)
	for w := range k.writes {
		backoff := writeBackoff
		for attempt := 1; ; attempt++ {
			wctx, cancel := context.WithTimeout(ctx, writeTimeout)
			var err error
			if w.value == nil {
				err = k.cfg.Store.Delete(wctx, w.key)
			} else {
				err = k.cfg.Store.Put(wctx, w.key, w.value)
			}
			cancel()
			if err == nil {
				break
			}
			if attempt == writeAttempts || ctx.Err() != nil {
				k.m.recordErrors.WithLabelValues(opOf(w)).Inc()
				k.log.Error("kept record not written", "key", w.key, "op", opOf(w), "attempts", attempt, "err", err)
				break
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			backoff *= 2
		}
	}
}

// newBranch is a fresh Via branch: RFC 3261's magic cookie and 128 random
// bits, so no answer to another transaction can match it.
func newBranch() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "z9hG4bK" + hex.EncodeToString(b[:])
}
