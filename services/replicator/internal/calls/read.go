package calls

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
)

// Actioner runs one AMI action; *ami.Session is one.
type Actioner interface {
	Action(ctx context.Context, name string, fields ...ami.Field) (ami.Response, error)
}

// EventSource is what follows Asterisk's events: *ami.Session with
// Config.Events.
type EventSource interface {
	Events() <-chan ami.Event
	Gaps() <-chan struct{}
	DroppedEvents() uint64
}

// errGone: Asterisk has no such channel any more (Getvar's "No such
// channel"): the call ended while it was read.
var errGone = errors.New("no such channel")

// getvar reads one variable or function of a channel. Asterisk 22 answers
// an unknown CHANNEL() field with success and an empty value, and a
// channel that is gone with "No such channel".
func getvar(ctx context.Context, a Actioner, channel, variable string) (string, error) {
	r, err := a.Action(ctx, "Getvar", ami.F("Channel", channel), ami.F("Variable", variable))
	if err != nil {
		return "", fmt.Errorf("read %s of %s: %w", variable, channel, err)
	}
	if !r.Success() {
		if strings.EqualFold(r.Message(), "No such channel") {
			return "", fmt.Errorf("read %s of %s: %w", variable, channel, errGone)
		}
		return "", fmt.Errorf("read %s of %s: %s", variable, channel, r.Message())
	}
	return r.Field("Value"), nil
}

// snapshot lists the channels Asterisk has up (CoreShowChannels), each
// with the bridge it is in.
func snapshot(ctx context.Context, a Actioner) ([]snapChannel, error) {
	r, err := a.Action(ctx, "CoreShowChannels")
	if err != nil {
		return nil, fmt.Errorf("CoreShowChannels: %w", err)
	}
	if !r.Success() {
		return nil, fmt.Errorf("CoreShowChannels: %s", r.Message())
	}
	if _, ok := r.Complete(); !ok {
		return nil, errors.New("CoreShowChannels: list not complete")
	}
	var out []snapChannel
	for _, ev := range r.Events() {
		if ev.Name() != "CoreShowChannel" || ev.Field("Uniqueid") == "" {
			continue
		}
		out = append(out, snapChannel{uniqueid: ev.Field("Uniqueid"), name: ev.Field("Channel"),
			linkedid: ev.Field("Linkedid"), bridge: ev.Field("BridgeId")})
	}
	return out, nil
}

// The dialog of a PJSIP channel, from the PBX's side, as Asterisk 22's
// CHANNEL(pjsip,...) answers it (docs/asterisk22.md). remote_addr is
// known on the leg Asterisk answered (the phone's source of its INVITE),
// empty on the leg it called.
const (
	pjsipCallID    = "CHANNEL(pjsip,call-id)"
	pjsipLocalTag  = "CHANNEL(pjsip,local_tag)"
	pjsipRemoteTag = "CHANNEL(pjsip,remote_tag)"
	pjsipLocalURI  = "CHANNEL(pjsip,local_uri)"
	pjsipRemoteURI = "CHANNEL(pjsip,remote_uri)"
	pjsipTarget    = "CHANNEL(pjsip,target_uri)"
	pjsipRemote    = "CHANNEL(pjsip,remote_addr)"
	// rtpDirect is where the leg's media goes when it flows directly
	// between the phones (the native RTP bridge's remote mode): the other
	// phone's address; "(null)" or empty while Asterisk relays it.
	rtpDirect = "CHANNEL(rtp,direct)"
)

// legDialog is one leg as read.
type legDialog struct {
	leg    events.CallLeg
	direct bool
	// incomplete says why the dialog is not known in full ("" when it is).
	incomplete string
}

// readParallel bounds the Getvars one call has in flight.
const readParallel = 8

// readLegs reads both legs' dialogs and media. errGone (wrapped) means a
// channel ended meanwhile; another error that Asterisk did not answer. A
// leg that is not a PJSIP channel is read as incomplete, not as an error.
func readLegs(ctx context.Context, a Actioner, names [2]string) ([2]legDialog, error) {
	var out [2]legDialog
	type job struct {
		leg int
		v   string
		dst *string
	}
	var jobs []job
	direct := [2]string{}
	for i, name := range names {
		l := &out[i].leg
		l.Channel = name
		if !strings.HasPrefix(name, "PJSIP/") {
			out[i].incomplete = fmt.Sprintf("legs[%d] %s is not a PJSIP channel", i, name)
			continue
		}
		l.Endpoint = endpointOf(name)
		for _, f := range []struct {
			v   string
			dst *string
		}{{pjsipCallID, &l.CallID}, {pjsipLocalTag, &l.LocalTag}, {pjsipRemoteTag, &l.RemoteTag}, {pjsipLocalURI, &l.LocalURI},
			{pjsipRemoteURI, &l.RemoteURI}, {pjsipTarget, &l.RemoteTarget}, {pjsipRemote, &l.RemoteAddr}, {rtpDirect, &direct[i]}} {
			jobs = append(jobs, job{leg: i, v: f.v, dst: f.dst})
		}
	}
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, readParallel)
	for _, j := range jobs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			v, err := getvar(ctx, a, names[j.leg], j.v)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil || errors.Is(err, errGone) {
					first = err
				}
				return
			}
			*j.dst = v
		}()
	}
	wg.Wait()
	if first != nil {
		return out, first
	}
	for i := range out {
		if out[i].incomplete != "" {
			continue
		}
		out[i].direct = isDirect(direct[i])
		out[i].incomplete = settle(&out[i].leg, i)
	}
	return out, nil
}

// readMedia reads whether both legs' media flow directly.
func readMedia(ctx context.Context, a Actioner, names [2]string) (bool, error) {
	for _, n := range names {
		if !strings.HasPrefix(n, "PJSIP/") {
			return false, nil
		}
		v, err := getvar(ctx, a, n, rtpDirect)
		if err != nil {
			return false, err
		}
		if !isDirect(v) {
			return false, nil
		}
	}
	return true, nil
}

// isDirect reads CHANNEL(rtp,direct): the remote media address while the
// media flows directly, "(null)" (observed) or empty while it does not.
func isDirect(v string) bool { return v != "" && v != "(null)" }

// endpointOf is the endpoint of a PJSIP channel's name
// (PJSIP/<endpoint>-<sequence>).
func endpointOf(name string) string {
	e := strings.TrimPrefix(name, "PJSIP/")
	if i := strings.LastIndexByte(e, '-'); i > 0 {
		e = e[:i]
	}
	return e
}

// settle fills the leg's transport and clears what a record may not hold,
// saying why the leg is then incomplete.
func settle(l *events.CallLeg, i int) string {
	why := ""
	for _, f := range []*string{&l.Endpoint, &l.CallID, &l.LocalTag, &l.RemoteTag, &l.LocalURI, &l.RemoteURI, &l.RemoteTarget, &l.RemoteAddr} {
		if len(*f) > events.MaxSIPField || strings.ContainsAny(*f, "\r\n\x00") {
			*f = ""
			why = fmt.Sprintf("legs[%d] %s: a dialog value over %d bytes", i, l.Channel, events.MaxSIPField)
		}
	}
	if l.CallID == "" || l.LocalTag == "" || l.RemoteTag == "" || l.RemoteTarget == "" {
		if why == "" {
			why = fmt.Sprintf("legs[%d] %s: Asterisk did not tell its dialog", i, l.Channel)
		}
		return why
	}
	switch t := transportOf(l.RemoteTarget); t {
	case "udp":
		l.Transport = "udp"
	default:
		if why == "" {
			why = fmt.Sprintf("legs[%d] %s: its dialog's transport is %s: only UDP is carried", i, l.Channel, t)
		}
	}
	return why
}

// transportOf is the transport a request to uri goes over: its transport
// parameter, TLS for a sips: URI, and UDP for a sip: URI without one (RFC
// 3263 for a numeric address; what PJSIP does for a phone's contact).
func transportOf(uri string) string {
	u := strings.TrimSpace(uri)
	u = strings.TrimPrefix(u, "<")
	if i := strings.IndexByte(u, '>'); i >= 0 {
		u = u[:i]
	}
	lower := strings.ToLower(u)
	for _, p := range strings.Split(lower, ";")[1:] {
		if v, ok := strings.CutPrefix(p, "transport="); ok {
			return v
		}
	}
	if strings.HasPrefix(lower, "sips:") {
		return "tls"
	}
	return "udp"
}
