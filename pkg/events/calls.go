package events

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Calls in progress, kept on the bus so that the node taking a group over
// after an unplanned failover can carry the ones that can survive it.
//
// Asterisk is a back-to-back user agent: a call between two phones is two
// SIP dialogs, both owned by the PBX. When the PBX dies, a call whose media
// flows directly between the phones keeps its audio, but its signalling is
// orphaned: a hang-up on one side reaches nobody. The holder's replicator
// records, while a call is up, the identity of both dialogs (CallRecord,
// under CallKey); the node that takes the group over adopts the records of
// the calls it can carry, and keeps their dialogs (under KeptKey) until
// either side hangs up, which it then tells the other side.
//
// The records live in the KV bucket CallsBucket, created by the admin with
// the other streams (fanctl provision). A record carries no secret: dialog
// identifiers and the phones' addresses, which every SIP message of the
// call shows in the clear.

// CallsBucket is the KV bucket of call records.
const CallsBucket = "fan_calls"

// CallKey is the key of a call that node's Asterisk has up: written by that
// node's replicator while the call lasts, deleted when it ends.
func CallKey(cluster, group, node, id string) string {
	return "calls." + cluster + "." + group + "." + node + "." + id
}

// KeptKey is the key of a call node keeps after adopting it: written by that
// node's ipmover, deleted when the call ends.
func KeptKey(cluster, group, node, id string) string {
	return "kept." + cluster + "." + group + "." + node + "." + id
}

// GroupCallKeys and GroupKeptKeys match every record of a group, whatever
// node wrote it (what a new holder reads to adopt).
func GroupCallKeys(cluster, group string) string { return "calls." + cluster + "." + group + ".*.*" }
func GroupKeptKeys(cluster, group string) string { return "kept." + cluster + "." + group + ".*.*" }

// NodeCallKeys and NodeKeptKeys match the records one node may write.
func NodeCallKeys(cluster, node string) string { return "calls." + cluster + ".*." + node + ".*" }
func NodeKeptKeys(cluster, node string) string { return "kept." + cluster + ".*." + node + ".*" }

// ClusterCallKeys and ClusterKeptKeys match every record of a cluster (what
// the arbiter and the people read, and an ipmover may).
func ClusterCallKeys(cluster string) string { return "calls." + cluster + ".>" }
func ClusterKeptKeys(cluster string) string { return "kept." + cluster + ".>" }

// The first token of a record's key: who wrote it.
const (
	CallKeyCalls = "calls" // the replicator of the node whose PBX has the call
	CallKeyKept  = "kept"  // the ipmover of the node keeping an adopted call
)

// CallKeyParts are the tokens of a record's key.
type CallKeyParts struct {
	Kind, Cluster, Group, Node, ID string
}

// ParseCallKey splits a record's key (CallKey or KeptKey) into its tokens,
// each a valid subject token.
func ParseCallKey(key string) (CallKeyParts, error) {
	t := strings.Split(key, ".")
	if len(t) != 5 || (t[0] != CallKeyCalls && t[0] != CallKeyKept) {
		return CallKeyParts{}, fmt.Errorf("%w: call record key %.120q", ErrInvalidField, key)
	}
	p := CallKeyParts{Kind: t[0], Cluster: t[1], Group: t[2], Node: t[3], ID: t[4]}
	for _, f := range []struct{ name, v string }{{"cluster", p.Cluster}, {"group", p.Group}, {"node", p.Node}, {"id", p.ID}} {
		if err := ValidToken(f.name, f.v); err != nil {
			return CallKeyParts{}, fmt.Errorf("call record key: %w", err)
		}
	}
	return p, nil
}

// VerifyCallKey checks a record read from the bucket against its key. The
// bus lets a node's replicator write only its own node's calls keys and
// its ipmover only its own kept keys, so the key is the writer's identity;
// a record that names another cluster, group, node or id than its key, or
// says kept under a calls key (or the reverse), is refused (wrapping
// ErrSubjectMismatch), as an event on a subject that is not its own is.
func VerifyCallKey(key string, r CallRecord) error {
	p, err := ParseCallKey(key)
	if err != nil {
		return err
	}
	if p.Cluster != r.Cluster || p.Group != r.Group || p.Node != r.Node || p.ID != r.ID || (p.Kind == CallKeyKept) != r.Kept {
		return fmt.Errorf("%w: call record of %s/%s/%s/%s (kept %v) under key %s", ErrSubjectMismatch, r.Cluster, r.Group, r.Node, r.ID, r.Kept, key)
	}
	return nil
}

// CallIDForBridge is the id of a call's record: the unique id of the
// bridge that joins its two channels on the PBX that set it up. Asterisk
// names a bridge with a UUID (36 hexadecimal digits and dashes, observed on
// Asterisk 22), which is a subject token already and is used as it is. A
// bridge named otherwise (an ARI application may choose any id, dots and
// spaces included) gets "b-" and the first 32 hexadecimal digits of the
// SHA-256 of its id: the same bridge always has the same key, and no name
// reaches past its token.
func CallIDForBridge(bridge string) string {
	if ValidToken("id", bridge) == nil {
		return bridge
	}
	h := sha256.Sum256([]byte(bridge))
	return "b-" + hex.EncodeToString(h[:16])
}

// CallMedia says where a call's audio flows.
type CallMedia string

const (
	// MediaDirect: between the phones, past the PBX (Asterisk's
	// direct_media, the native RTP bridge's remote mode). It survives the
	// PBX.
	MediaDirect CallMedia = "direct"
	// MediaAnchored: through the PBX (relayed RTP, recording, music on
	// hold, a trunk). It ends with the PBX.
	MediaAnchored CallMedia = "anchored"
)

// CallLeg is one of a call's two SIP dialogs, from the PBX's side: Local
// is the PBX (what it puts in From or To of its own requests), Remote the
// phone.
type CallLeg struct {
	// Channel and Endpoint are Asterisk's names (PJSIP/6001-00000002, 6001).
	Channel  string `json:"channel"`
	Endpoint string `json:"endpoint,omitempty"`
	CallID   string `json:"call_id"`
	// LocalTag and RemoteTag are the dialog's tags; LocalURI and
	// RemoteURI the From/To URIs of a request the PBX sends in it.
	LocalTag  string `json:"local_tag"`
	RemoteTag string `json:"remote_tag"`
	LocalURI  string `json:"local_uri"`
	RemoteURI string `json:"remote_uri"`
	// RemoteTarget is the dialog's remote target (the phone's Contact),
	// the Request-URI of the PBX's in-dialog requests.
	RemoteTarget string `json:"remote_target"`
	// RemoteAddr is where the phone's messages come from (ip:port).
	RemoteAddr string `json:"remote_addr,omitempty"`
	// Transport is the dialog's transport: udp (the only one carried).
	Transport string `json:"transport,omitempty"`
	// CSeq, when set, is the highest CSeq a request the PBX side sent in
	// this dialog may have had; the next one must be above it. A keeper
	// that sends writes what it used here. Asterisk does not expose its
	// own: PJSIP starts a dialog's local CSeq at a random number below
	// 32,768 and adds one per request (docs/asterisk22.md), so a recorder
	// leaves it unset.
	CSeq uint32 `json:"cseq,omitempty"`
}

// CallRecord is one bridged call between two phones.
type CallRecord struct {
	Cluster string `json:"cluster"`
	Group   string `json:"group"`
	// Node is the node that wrote the record: where the call was set up
	// (under CallKey) or the node keeping it (under KeptKey).
	Node string `json:"node"`
	// ID is the bridge's unique id on the node that set the call up,
	// kept when the call is adopted.
	ID    string    `json:"id"`
	Legs  []CallLeg `json:"legs"`
	Media CallMedia `json:"media"`
	// AnsweredAt is when the call was bridged; DirectSince when its media
	// went direct (zero while anchored).
	AnsweredAt  time.Time `json:"answered_at"`
	DirectSince time.Time `json:"direct_since,omitzero"`
	// Kept: adopted by Node after a failover, at KeptSince, from the record
	// of AdoptedFrom.
	Kept        bool      `json:"kept,omitempty"`
	KeptSince   time.Time `json:"kept_since,omitzero"`
	AdoptedFrom string    `json:"adopted_from,omitempty"`
	UpdatedAt   time.Time `json:"updated_at"`
	// Incomplete says why the record cannot carry the call whatever its
	// media (a leg that is not a PJSIP channel, a dialog Asterisk did not
	// answer for, a transport other than UDP); empty when both legs'
	// dialogs were read. A recorder writes such records too, so that the
	// calls up are known and a new holder says why it left them.
	Incomplete string `json:"incomplete,omitempty"`
}

// Bounds of the call records.
const (
	// MaxCallsPerNode bounds what a node records and keeps; a call beyond
	// it is not recorded (and not carried), and the recorder says so.
	MaxCallsPerNode = 4096
	// MaxCallRecord bounds one record's JSON.
	MaxCallRecord = 8 << 10
	// MaxSIPField bounds a URI, a tag or a Call-ID in a record.
	MaxSIPField = 512
)

// Validate checks a record before it is written or adopted: a record
// comes from another node's identity, and a keeper sends SIP requests
// built from it. A record may be incomplete (Complete says whether a
// keeper has all it needs); it may never hold a value that could write a
// SIP header of its own, or exceed the bounds.
func (r CallRecord) Validate() error {
	for _, f := range []struct{ name, v string }{{"cluster", r.Cluster}, {"group", r.Group}, {"node", r.Node}, {"id", r.ID}} {
		if err := ValidToken(f.name, f.v); err != nil {
			return err
		}
	}
	if r.Media != MediaDirect && r.Media != MediaAnchored {
		return fmt.Errorf("%w: media %q", ErrInvalidField, r.Media)
	}
	if len(r.Legs) != 2 {
		return fmt.Errorf("%w: legs: a call fan carries has two, got %d", ErrInvalidField, len(r.Legs))
	}
	for i, l := range r.Legs {
		if l.Channel == "" {
			return fmt.Errorf("%w: legs[%d].channel", ErrMissingField, i)
		}
		for _, f := range l.fields() {
			if len(f.v) > MaxSIPField {
				return fmt.Errorf("%w: legs[%d].%s: %d bytes", ErrTooLarge, i, f.name, len(f.v))
			}
			// A value goes into a SIP header line: a line break would let a
			// record write headers of its own.
			if strings.ContainsAny(f.v, "\r\n\x00") {
				return fmt.Errorf("%w: legs[%d].%s holds a control character", ErrInvalidField, i, f.name)
			}
		}
		if l.Transport != "" && l.Transport != "udp" {
			return fmt.Errorf("%w: legs[%d].transport %q: only udp dialogs are carried", ErrInvalidField, i, l.Transport)
		}
	}
	if r.Kept && r.KeptSince.IsZero() {
		return fmt.Errorf("%w: kept_since", ErrMissingField)
	}
	if r.AdoptedFrom != "" {
		if err := ValidToken("adopted_from", r.AdoptedFrom); err != nil {
			return err
		}
	}
	return textIn("incomplete", r.Incomplete, MaxSIPField)
}

func (l CallLeg) fields() []struct{ name, v string } {
	return []struct{ name, v string }{{"channel", l.Channel}, {"endpoint", l.Endpoint}, {"call_id", l.CallID},
		{"local_tag", l.LocalTag}, {"remote_tag", l.RemoteTag}, {"local_uri", l.LocalURI}, {"remote_uri", l.RemoteURI},
		{"remote_target", l.RemoteTarget}, {"remote_addr", l.RemoteAddr}, {"transport", l.Transport}}
}

// Complete says whether both legs' dialogs are known in full: what a keeper
// needs to send a request in either (Call-ID, both tags, both URIs, the
// remote target, and UDP as the transport). The error names what is
// missing.
func (r CallRecord) Complete() error {
	if r.Incomplete != "" {
		return fmt.Errorf("%w: %s", ErrMissingField, r.Incomplete)
	}
	if len(r.Legs) != 2 {
		return fmt.Errorf("%w: legs: %d of 2", ErrMissingField, len(r.Legs))
	}
	for i, l := range r.Legs {
		for _, f := range []struct{ name, v string }{{"call_id", l.CallID}, {"local_tag", l.LocalTag}, {"remote_tag", l.RemoteTag},
			{"local_uri", l.LocalURI}, {"remote_uri", l.RemoteURI}, {"remote_target", l.RemoteTarget}} {
			if f.v == "" {
				return fmt.Errorf("%w: legs[%d].%s", ErrMissingField, i, f.name)
			}
		}
		if l.Transport != "udp" {
			return fmt.Errorf("%w: legs[%d].transport is %q, not udp", ErrMissingField, i, l.Transport)
		}
	}
	return nil
}

// Carriable says whether a node taking the group over can keep the call:
// its media flows between the phones, past the PBX, and both dialogs are
// known in full.
func (r CallRecord) Carriable() bool { return r.Media == MediaDirect && r.Complete() == nil }

// Encode renders a record for the bucket, refusing one that does not
// validate or is over MaxCallRecord.
func (r CallRecord) Encode() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("call record %s: %w", r.ID, err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("call record %s: %w", r.ID, err)
	}
	if len(b) > MaxCallRecord {
		return nil, fmt.Errorf("call record %s: %w: %d bytes, at most %d", r.ID, ErrTooLarge, len(b), MaxCallRecord)
	}
	return b, nil
}

// DecodeCallRecord parses and validates a record read from the bucket;
// VerifyCallKey then checks it against its key.
func DecodeCallRecord(data []byte) (CallRecord, error) {
	var r CallRecord
	if len(data) > MaxCallRecord {
		return r, fmt.Errorf("call record: %w: %d bytes", ErrTooLarge, len(data))
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("call record: %w: %v", ErrInvalidField, err)
	}
	if err := r.Validate(); err != nil {
		return r, fmt.Errorf("call record: %w", err)
	}
	return r, nil
}

// TypeCallsSummary is the wire name of CallsSummary.
const TypeCallsSummary Type = "calls.summary"

func init() {
	register(TypeCallsSummary, func() Decoded { return &CallsSummary{} })
	// Restated every few seconds, as a heartbeat is: live state.
	liveTypes[TypeCallsSummary] = true
}

// CallsSummary is what one node's replicator knows of the calls its
// Asterisk has up, restated every IntervalMS and soon after a change, as
// live state. All of its counts come from one view at one moment (the
// channels as Asterisk's events and reconciles report them, and the
// records this node has stored), so they agree with one another: a
// planned move away from the node need wait only for its Channels -
// CarriedChannels, the channels of calls a node taking the group over
// cannot keep. A node publishes it only while that view is current (its
// AMI connection answers and was reconciled since its last gap); a reader
// counts it stale after a few IntervalMS without one.
type CallsSummary struct {
	Node  string `json:"node"`
	Group string `json:"group"`
	// Holder: the node held the group (in Epoch) as its replicator last
	// read the group status; only a holder records calls it has not
	// recorded yet.
	Holder     bool   `json:"holder"`
	Epoch      uint64 `json:"epoch,omitempty"`
	IntervalMS int64  `json:"interval_ms"`
	// Channels are every channel Asterisk has up, bridged or not, as
	// `core show channels` lists them.
	Channels int `json:"channels"`
	// CarriedChannels are the channels of the Carriable calls (two each).
	CarriedChannels int `json:"carried_channels"`
	// Calls are the bridges joining exactly two channels; each is one of
	// Carriable (direct media, a complete record stored on the bus),
	// Anchored (media through Asterisk), Incomplete (a dialog not known in
	// full: a leg that is not PJSIP or not UDP, a read Asterisk refused)
	// or Unrecorded (no record on the bus yet: being read or written,
	// refused over MaxCallsPerNode, or the node does not hold the group).
	Calls      int       `json:"calls"`
	Carriable  int       `json:"carriable"`
	Anchored   int       `json:"anchored"`
	Incomplete int       `json:"incomplete"`
	Unrecorded int       `json:"unrecorded"`
	At         time.Time `json:"at"`

	// What this node's Asterisk is configured with that keeps a call from
	// surviving a failover, as the recorder read it at its last reconcile
	// (fanctl status and the status page warn from it; fanctl doctor checks
	// the same on the host). All optional: a summary without them says
	// nothing of the settings.
	//
	// TimersEndpoints counts the endpoints that negotiate session timers
	// (timers other than no): a carried call ends at its first session
	// refresh, which the new holder's Asterisk answers 481. TimersSample
	// names up to MaxCallsSample of them. Nil when the endpoints were not
	// read (the AMI user may not run PJSIPShowEndpoints).
	TimersEndpoints *int     `json:"timers_endpoints,omitempty"`
	TimersSample    []string `json:"timers_sample,omitempty"`
	// TransportsRead says the PJSIP transports were read; then
	// ContactNodeAddress names the UDP transports that make dialogs on the
	// floating address carry a node's own address in their Contact (after
	// a failover the phones send their in-dialog requests, their BYE
	// included, to the dead node), and MediaAddressRewritten the UDP
	// transports that set external_media_address for every destination
	// (direct-media calls get no audio: Asterisk writes that address in
	// its direct-media re-INVITEs).
	TransportsRead        bool     `json:"transports_read,omitempty"`
	ContactNodeAddress    []string `json:"contact_node_address,omitempty"`
	MediaAddressRewritten []string `json:"media_address_rewritten,omitempty"`
}

// MaxCallsSample bounds the endpoint names a summary lists.
const MaxCallsSample = 8

func (CallsSummary) EventType() Type    { return TypeCallsSummary }
func (CallsSummary) SchemaVersion() int { return 1 }
func (s CallsSummary) subject(e Envelope) string {
	return CallsSummarySubject(e.Cluster, s.Node)
}

// Only the node's own replicator speaks for its Asterisk's calls.
func (s CallsSummary) voiceOf(Envelope) string { return s.Node }

func (s CallsSummary) Validate() error {
	if err := ValidToken("node", s.Node); err != nil {
		return err
	}
	if err := ValidToken("group", s.Group); err != nil {
		return err
	}
	if s.At.IsZero() {
		return fmt.Errorf("%w: at", ErrMissingField)
	}
	if err := ValidHeartbeatInterval(s.IntervalMS); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"channels", s.Channels}, {"carried_channels", s.CarriedChannels}, {"calls", s.Calls}, {"carriable", s.Carriable},
		{"anchored", s.Anchored}, {"incomplete", s.Incomplete}, {"unrecorded", s.Unrecorded}} {
		if err := intIn(f.name, f.v, 0, MaxCount); err != nil {
			return err
		}
	}
	if s.Carriable+s.Anchored+s.Incomplete+s.Unrecorded != s.Calls {
		return fmt.Errorf("%w: carriable %d + anchored %d + incomplete %d + unrecorded %d is not calls %d",
			ErrInvalidField, s.Carriable, s.Anchored, s.Incomplete, s.Unrecorded, s.Calls)
	}
	if 2*s.Calls > s.Channels {
		return fmt.Errorf("%w: %d calls need %d channels, %d up", ErrInvalidField, s.Calls, 2*s.Calls, s.Channels)
	}
	if s.CarriedChannels != 2*s.Carriable {
		return fmt.Errorf("%w: carried_channels %d: two per carriable call (%d)", ErrInvalidField, s.CarriedChannels, s.Carriable)
	}
	return s.validateSettings()
}

func (s CallsSummary) validateSettings() error {
	if s.TimersEndpoints != nil {
		if err := intIn("timers_endpoints", *s.TimersEndpoints, 0, MaxCount); err != nil {
			return err
		}
	}
	if s.TimersEndpoints == nil && len(s.TimersSample) > 0 {
		return fmt.Errorf("%w: timers_sample without timers_endpoints", ErrInvalidField)
	}
	if !s.TransportsRead && (len(s.ContactNodeAddress) > 0 || len(s.MediaAddressRewritten) > 0) {
		return fmt.Errorf("%w: transports named without transports_read", ErrInvalidField)
	}
	for _, l := range []struct {
		name string
		v    []string
		max  int
	}{{"timers_sample", s.TimersSample, MaxCallsSample}, {"contact_node_address", s.ContactNodeAddress, MaxListLen},
		{"media_address_rewritten", s.MediaAddressRewritten, MaxListLen}} {
		if err := listIn(l.name, len(l.v), l.max); err != nil {
			return err
		}
		for _, v := range l.v {
			// Names only: Asterisk's object ids, printed as they are.
			if v == "" || strings.ContainsAny(v, "\r\n\x00") {
				return fmt.Errorf("%w: %s holds an empty name or a control character", ErrInvalidField, l.name)
			}
			if err := textIn(l.name, v, MaxShortLen); err != nil {
				return err
			}
		}
	}
	return nil
}

// HolderCalls is what a holder's calls summary (CallsSummary) said of its
// calls when the arbiter moved its group away, or while a planned move
// waits: a decision or a planned move carries it so that the trail says
// how many calls a move carries across and how many it ends. Summary is
// the summary's event id (a decision also lists it in caused_by).
type HolderCalls struct {
	Node    string    `json:"node"`
	Summary string    `json:"summary"`
	At      time.Time `json:"at"`
	// The summary's counts: Channels up, CarriedChannels the channels of
	// the Carriable calls, Calls the bridged calls, each Carriable,
	// Anchored, Incomplete or Unrecorded.
	Channels        int `json:"channels"`
	CarriedChannels int `json:"carried_channels"`
	Calls           int `json:"calls"`
	Carriable       int `json:"carriable"`
	Anchored        int `json:"anchored"`
	Incomplete      int `json:"incomplete"`
	Unrecorded      int `json:"unrecorded"`
}

// HolderCallsOf takes the counts of summary s, stored as event id.
func HolderCallsOf(id string, s CallsSummary) HolderCalls {
	return HolderCalls{Node: s.Node, Summary: id, At: s.At, Channels: s.Channels, CarriedChannels: s.CarriedChannels,
		Calls: s.Calls, Carriable: s.Carriable, Anchored: s.Anchored, Incomplete: s.Incomplete, Unrecorded: s.Unrecorded}
}

// Uncarried is the channels a move away from the holder ends: every
// channel but those of the calls a new holder can carry.
func (h HolderCalls) Uncarried() int { return h.Channels - h.CarriedChannels }

// Validate holds the counts to what a summary may say.
func (h HolderCalls) Validate() error {
	if err := ValidToken("calls.node", h.Node); err != nil {
		return err
	}
	if h.Summary == "" {
		return fmt.Errorf("%w: calls.summary", ErrMissingField)
	}
	if err := textIn("calls.summary", h.Summary, MaxShortLen); err != nil {
		return err
	}
	// The same counts, held together as the summary's are.
	s := CallsSummary{Node: h.Node, Group: "g", IntervalMS: MinHeartbeatInterval.Milliseconds(), At: h.At, Channels: h.Channels,
		CarriedChannels: h.CarriedChannels, Calls: h.Calls, Carriable: h.Carriable, Anchored: h.Anchored,
		Incomplete: h.Incomplete, Unrecorded: h.Unrecorded}
	if err := s.Validate(); err != nil {
		return fmt.Errorf("calls: %w", err)
	}
	return nil
}

// CallsSummarySubject carries one node's calls summaries: live state, kept
// in the live stream.
func CallsSummarySubject(cluster, node string) string {
	return LiveStateRoot + "." + cluster + ".calls." + node + ".summary"
}

// AllCallsSummaries matches every node's calls summaries in a cluster.
func AllCallsSummaries(cluster string) string {
	return LiveStateRoot + "." + cluster + ".calls.*.summary"
}
