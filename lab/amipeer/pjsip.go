package amipeer

import (
	"fmt"
	"strings"
)

// Transport is one PJSIP transport as pjsip.conf declares it; the peer
// reports it, it binds nothing (the lab's SIP is Kamailio's).
type Transport struct {
	ID       string
	Protocol string // udp (default), tcp, tls, ws, wss
	Bind     string // host:port, 0.0.0.0:5060 for every address
	// ExternalSignalingAddress and ExternalMediaAddress are what Asterisk
	// writes in Contact/Via and in SDP instead of the address it sends
	// from, for destinations outside LocalNet (every one while LocalNet is
	// empty).
	ExternalSignalingAddress string
	ExternalMediaAddress     string
	LocalNet                 string
}

// Endpoint is one PJSIP endpoint (with an AOR of the same name when Aors is
// empty).
type Endpoint struct {
	Name      string
	Context   string // default "default"
	Aors      string // default Name
	Transport string // a Transport's ID, or empty
	Allow     string // as PJSIPShowEndpoint shows it; default "(ulaw)"
	// Timers is the endpoint's timers setting as Asterisk shows it: no,
	// yes (Asterisk's default, also when empty), required or always.
	Timers string
	// NoDirectMedia is direct_media = no (Asterisk's default is yes).
	NoDirectMedia bool
}

func (t Transport) protocol() string {
	if t.Protocol == "" {
		return "udp"
	}
	return t.Protocol
}

func (e Endpoint) aors() string {
	if e.Aors == "" {
		return e.Name
	}
	return e.Aors
}

func (e Endpoint) timers() string {
	if e.Timers == "" {
		return "yes"
	}
	return e.Timers
}

// endpointDetail is the EndpointDetail event of PJSIPShowEndpoint, field by
// field in Asterisk 22.10.1's order, with its defaults (an endpoint with only
// context, aors and allow = ulaw set); detail fills the endpoint's own.
var endpointDetail = [][2]string{
	{"ObjectType", "endpoint"}, {"ObjectName", ""}, {"RpidImmediate", "false"}, {"Webrtc", "no"},
	{"Ignore183WithoutSdp", "false"}, {"SendAoc", "false"}, {"DeviceStateBusyAt", "0"}, {"T38UdptlMaxdatagram", "0"},
	{"CodecPrefsIncomingAnswer", "prefer:pending, operation:intersect, keep:all, transcode:allow"},
	{"SecurityNegotiation", "no"}, {"DtlsRekey", "0"}, {"RtpPortEnd", "0"}, {"NamedPickupGroup", ""},
	{"DirectMediaMethod", "invite"}, {"SendRpid", "false"}, {"PickupGroup", ""}, {"SdpSession", "Asterisk"},
	{"DtlsVerify", "No"}, {"MessageContext", ""}, {"Tenantid", ""}, {"Mailboxes", ""}, {"RecordOnFeature", "automixmon"},
	{"DtlsPrivateKey", ""}, {"DtlsFingerprint", "SHA-256"}, {"OverlapContext", ""}, {"OutgoingCallOfferPref", "remote_merge"},
	{"RtpPortStart", "0"}, {"FromDomain", ""}, {"TimersSessExpires", "1800"}, {"NamedCallGroup", ""}, {"DtlsCipher", ""},
	{"MediaEncryptionOptimistic", "false"}, {"SuppressQ850ReasonHeaders", "false"}, {"Aors", ""},
	{"IdentifyBy", "username,ip"}, {"CalleridPrivacy", "allowed_not_screened"}, {"MwiSubscribeReplacesUnsolicited", "no"},
	{"CosAudio", "0"}, {"FollowEarlyMediaFork", "true"}, {"Context", ""}, {"RtpSymmetric", "false"}, {"Transport", ""},
	{"MohSuggest", "default"}, {"T38Udptl", "false"}, {"FaxDetect", "false"}, {"T38BindUdptlToMediaAddress", "false"},
	{"TosVideo", "0"}, {"SrtpTag32", "false"}, {"ReferBlindProgress", "true"}, {"MaxAudioStreams", "1"}, {"Bundle", "false"},
	{"UseAvpf", "false"}, {"CallGroup", ""}, {"SendConnectedLine", "yes"}, {"FaxDetectTimeout", "0"}, {"SdpOwner", "-"},
	{"ForceRport", "true"}, {"CalleridTag", ""}, {"RtpTimeoutHold", "0"}, {"SuppressMohOnSendonly", "false"},
	{"UsePtime", "false"}, {"MediaAddress", ""}, {"VoicemailExtension", ""}, {"RtpTimeout", "0"}, {"StirShaken", "no"},
	{"SetVar", ""}, {"ContactAcl", ""}, {"PreferredCodecOnly", "false"}, {"GeolocOutgoingCallProfile", ""},
	{"ForceAvp", "false"}, {"RecordOffFeature", "automixmon"}, {"FromUser", ""}, {"SendDiversion", "true"},
	{"SendHistoryInfo", "false"}, {"T38UdptlIpv6", "false"}, {"ToneZone", ""}, {"Language", ""}, {"AllowSubscribe", "true"},
	{"RtpIpv6", "false"}, {"Callerid", "<unknown>"}, {"MohPassthrough", "false"}, {"CosVideo", "0"},
	{"DtlsAutoGenerateCert", "No"}, {"AsymmetricRtpCodec", "false"}, {"GeolocIncomingCallProfile", ""},
	{"IceSupport", "false"}, {"AggregateMwi", "true"}, {"OneTouchRecording", "false"}, {"MwiFromUser", ""},
	{"RedirectMethod", "user"}, {"Accountcode", ""},
	{"CodecPrefsOutgoingAnswer", "prefer:pending, operation:intersect, keep:all, transcode:allow"}, {"Allow", ""},
	{"RewriteContact", "false"}, {"UserEqPhone", "false"}, {"RtpEngine", "asterisk"}, {"FollowRedirectMethods", ""},
	{"SubscribeContext", ""}, {"NotifyEarlyInuseRinging", "false"}, {"IncomingMwiMailbox", ""},
	{"IncomingCallOfferPref", "local"}, {"AllowUnauthenticatedOptions", "false"}, {"Auth", ""},
	{"DirectMediaGlareMitigation", "none"}, {"TrustIdInbound", "false"}, {"StirShakenProfile", ""},
	{"BindRtpToMediaAddress", "false"}, {"DisableDirectMediaOnNat", "false"}, {"MediaEncryption", "no"},
	{"MediaUseReceivedTransport", "false"}, {"AllowOverlap", "true"}, {"DtmfMode", "rfc4733"}, {"OutboundAuth", ""},
	{"TosAudio", "0"}, {"DtlsCertFile", ""}, {"DtlsCaPath", ""}, {"DtlsSetup", "active"}, {"ConnectedLineMethod", "invite"},
	{"G726NonStandard", "false"}, {"100rel", "yes"}, {"Timers", ""}, {"DirectMedia", ""}, {"Acl", ""},
	{"TimersMinSe", "90"}, {"TrustIdOutbound", "false"}, {"SubMinExpiry", "0"}, {"RtcpMux", "false"},
	{"MaxVideoStreams", "1"}, {"AcceptMultipleSdpAnswers", "false"},
	{"CodecPrefsIncomingOffer", "prefer:pending, operation:intersect, keep:all, transcode:allow"},
	{"CodecPrefsOutgoingOffer", "prefer:pending, operation:union, keep:all, transcode:allow"},
	{"TrustConnectedLine", "yes"}, {"SendPai", "false"}, {"RtpKeepalive", "0"}, {"T38UdptlEc", "none"},
	{"T38UdptlNat", "false"}, {"AllowTransfer", "true"}, {"DtlsCaFile", ""}, {"OutboundProxy", ""},
	{"InbandProgress", "false"}, {"DeviceState", "Unavailable"}, {"ActiveChannels", "0"},
}

// detail is the endpoint's EndpointDetail fields.
func (e Endpoint) detail() [][2]string {
	ctx, allow := e.Context, e.Allow
	if ctx == "" {
		ctx = "default"
	}
	if allow == "" {
		allow = "(ulaw)"
	}
	own := map[string]string{"ObjectName": e.Name, "Aors": e.aors(), "Context": ctx, "Transport": e.Transport,
		"Allow": allow, "Timers": e.timers(), "DirectMedia": fmt.Sprint(!e.NoDirectMedia)}
	out := make([][2]string, len(endpointDetail))
	for i, f := range endpointDetail {
		out[i] = f
		if v, ok := own[f[0]]; ok {
			out[i][1] = v
		}
	}
	return out
}

// aorDetail is an AOR's AorDetail event (no contacts) in Asterisk's order.
func aorDetail(aor, endpoint string) [][2]string {
	return [][2]string{{"ObjectType", "aor"}, {"ObjectName", aor}, {"MinimumExpiration", "60"},
		{"DefaultExpiration", "3600"}, {"QualifyTimeout", "3.000000"}, {"Qualify2xxOnly", "false"}, {"Mailboxes", ""},
		{"SupportPath", "false"}, {"RemoveUnavailable", "false"}, {"VoicemailExtension", ""}, {"MaxContacts", "1"},
		{"AuthenticateQualify", "false"}, {"Contacts", ""}, {"MaximumExpiration", "7200"}, {"QualifyFrequency", "0"},
		{"RemoveExisting", "false"}, {"OutboundProxy", ""}, {"TotalContacts", "0"}, {"ContactsRegistered", "0"},
		{"EndpointName", endpoint}}
}

// transportDetail is a transport's TransportDetail event in Asterisk's order.
func (t Transport) transportDetail(endpoint string) [][2]string {
	return [][2]string{{"ObjectType", "transport"}, {"ObjectName", t.ID}, {"WebsocketWriteTimeout", "100"}, {"Cos", "0"},
		{"TcpKeepaliveEnable", "false"}, {"Protocol", t.protocol()}, {"SymmetricTransport", "false"}, {"Domain", ""},
		{"VerifyServer", "No"}, {"LocalNet", t.LocalNet}, {"Bind", t.Bind}, {"AllowWildcardCerts", "No"},
		{"TcpKeepaliveIntervalTime", "1"}, {"AsyncOperations", "1"}, {"ExternalMediaAddress", t.ExternalMediaAddress},
		{"Method", "unspecified"}, {"ExternalSignalingAddress", t.ExternalSignalingAddress}, {"RequireClientCert", "No"},
		{"TcpKeepaliveIdleTime", "30"}, {"Tos", "0"}, {"CaListPath", ""}, {"Cipher", ""}, {"CertFile", ""},
		{"ExternalSignalingPort", "0"}, {"Password", ""}, {"AllowReload", "false"}, {"VerifyClient", "No"},
		{"TcpKeepaliveProbeCount", "5"}, {"PrivKeyFile", ""}, {"CaListFile", ""}, {"EndpointName", endpoint}}
}

// transportParams are `pjsip show transport ID`'s parameters (sorted by
// name, as Asterisk lists them).
func (t Transport) transportParams() [][2]string {
	return [][2]string{{"allow_reload", "false"}, {"allow_wildcard_certs", "No"}, {"async_operations", "1"},
		{"bind", t.Bind}, {"ca_list_file", ""}, {"ca_list_path", ""}, {"cert_file", ""}, {"cipher", ""}, {"cos", "0"},
		{"domain", ""}, {"external_media_address", t.ExternalMediaAddress},
		{"external_signaling_address", t.ExternalSignalingAddress}, {"external_signaling_port", "0"},
		{"local_net", t.LocalNet}, {"method", "unspecified"}, {"password", ""}, {"priv_key_file", ""},
		{"protocol", t.protocol()}, {"require_client_cert", "No"}, {"symmetric_transport", "false"},
		{"tcp_keepalive_enable", "false"}, {"tcp_keepalive_idle_time", "30"}, {"tcp_keepalive_interval_time", "1"},
		{"tcp_keepalive_probe_count", "5"}, {"tos", "0"}, {"verify_client", "No"}, {"verify_server", "No"},
		{"websocket_write_timeout", "100"}}
}

func (p *Peer) pjsipObjects() ([]Transport, []Endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Transport(nil), p.cfg.Transports...), append([]Endpoint(nil), p.cfg.Endpoints...)
}

// SetPJSIP replaces the transports and endpoints the peer reports, as a
// pjsip.conf edit and a reload would.
func (p *Peer) SetPJSIP(transports []Transport, endpoints []Endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.Transports = append([]Transport(nil), transports...)
	p.cfg.Endpoints = append([]Endpoint(nil), endpoints...)
}

// SetSystemName changes what CoreSettings reports, as an asterisk.conf edit
// and a restart would.
func (p *Peer) SetSystemName(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.SystemName = name
}

// event writes one list event: Event, the ActionID, then the fields.
func (m *msgBuilder) event(name string, a Action, fields [][2]string) {
	m.field("Event", name)
	m.actionID(a)
	for _, f := range fields {
		m.field(f[0], f[1])
	}
	m.end()
}

// pjsipShow answers PJSIPShowEndpoints and PJSIPShowEndpoint. Asterisk
// ends both error messages with a newline of its own, before the CR LF.
func (p *Peer) pjsipShow(m *msgBuilder, name string, a Action) {
	transports, endpoints := p.pjsipObjects()
	if name == "pjsipshowendpoints" {
		if len(endpoints) == 0 {
			m.fail(a, "No endpoints found\n")
			return
		}
		m.response("Success", a)
		m.field("EventList", "start")
		m.field("Message", "A listing of Endpoints follows, presented as EndpointList events")
		m.end()
		for _, e := range endpoints {
			m.event("EndpointList", a, [][2]string{{"ObjectType", "endpoint"}, {"ObjectName", e.Name},
				{"Transport", e.Transport}, {"Aor", e.aors()}, {"Auths", ""}, {"OutboundAuths", ""}, {"Contacts", ""},
				{"DeviceState", "Unavailable"}, {"ActiveChannels", "0"}})
		}
		m.listComplete(a, "EndpointListComplete", len(endpoints))
		return
	}
	want := a.Field("Endpoint")
	var e *Endpoint
	for i := range endpoints {
		if endpoints[i].Name == want {
			e = &endpoints[i]
		}
	}
	if e == nil {
		m.fail(a, "Unable to retrieve endpoint "+want+"\n")
		return
	}
	m.response("Success", a)
	m.field("EventList", "start")
	m.field("Message", "Following are Events for each object associated with the Endpoint")
	m.end()
	m.event("EndpointDetail", a, e.detail())
	items := 1
	for _, t := range transports {
		if e.Transport != "" && t.ID == e.Transport {
			m.event("TransportDetail", a, t.transportDetail(e.Name))
			items++
		}
	}
	for _, aor := range strings.Split(e.aors(), ",") {
		if aor = strings.TrimSpace(aor); aor != "" {
			m.event("AorDetail", a, aorDetail(aor, e.Name))
			items++
		}
	}
	m.listComplete(a, "EndpointDetailComplete", items)
}

// The head of Asterisk 22's PJSIP object listings, as it prints them.
const (
	transportHeader = "Transport:  <TransportId........>  <Type>  <cos>  <tos>  <BindAddress....................>"
	listingRule     = "=========================================================================================="
)

// pjsipCLI answers `pjsip show transports`, `pjsip show transport ID` and
// `pjsip show settings` as Asterisk 22's CLI prints them through Action:
// Command; false means the words are another command.
func (p *Peer) pjsipCLI(m *msgBuilder, a Action, words []string) bool {
	if len(words) < 3 || words[0] != "pjsip" || words[1] != "show" {
		return false
	}
	if words[2] == "settings" && len(words) == 3 {
		p.pjsipSettings(m, a)
		return true
	}
	transports, _ := p.pjsipObjects()
	var shown []Transport
	switch {
	case words[2] == "transports" && len(words) == 3:
		shown = transports
	case words[2] == "transport" && len(words) == 4:
		for _, t := range transports {
			if t.ID == words[3] {
				shown = append(shown, t)
			}
		}
		if len(shown) == 0 {
			m.response("Success", a)
			m.field("Message", "Command output follows")
			m.field("Output", "Unable to find object "+words[3]+".")
			m.field("Output", "")
			m.end()
			return true
		}
	default:
		return false
	}
	m.response("Success", a)
	m.field("Message", "Command output follows")
	if len(shown) == 0 {
		m.field("Output", "No objects found.")
		m.field("Output", "")
		m.end()
		return true
	}
	m.field("Output", "")
	m.field("Output", transportHeader)
	m.field("Output", listingRule)
	m.field("Output", "")
	for _, t := range shown {
		m.field("Output", fmt.Sprintf("Transport:  %-21s  %6s  %5d  %5d  %s", t.ID, t.protocol(), 0, 0, t.Bind))
	}
	m.field("Output", "")
	if words[2] == "transports" {
		m.field("Output", fmt.Sprintf("Objects found: %d", len(shown)))
		m.field("Output", "")
	} else {
		m.field("Output", " ParameterName               : ParameterValue")
		m.field("Output", " "+strings.Repeat("=", 48))
		for _, kv := range shown[0].transportParams() {
			m.field("Output", fmt.Sprintf(" %-27s : %s", kv[0], kv[1]))
		}
		m.field("Output", "")
	}
	m.end()
	return true
}

// pjsipSettings answers `pjsip show settings` with Asterisk 22.10.1's
// defaults and the registrar's [global] settings (EnableRegistrar; without
// it, Asterisk's defaults).
func (p *Peer) pjsipSettings(m *msgBuilder, a Action) {
	send, check := "no", "30"
	if r := p.registrar(); r != nil {
		if r.cfg.SendContactStatusOnUpdate {
			send = "yes"
		}
		check = fmt.Sprint(int(r.cfg.ExpirationCheck.Seconds()))
	}
	global := [][2]string{
		{"all_codecs_on_empty_reinvite", "false"}, {"allow_sending_180_after_183", "false"},
		{"contact_expiration_check_interval", check}, {"debug", "no"}, {"default_auth_algorithms_uac", "MD5"},
		{"default_auth_algorithms_uas", "MD5"}, {"default_from_user", "asterisk"},
		{"default_outbound_endpoint", "default_outbound_endpoint"}, {"default_realm", "asterisk"},
		{"default_voicemail_extension", ""}, {"disable_multi_domain", "false"},
		{"endpoint_identifier_order", "ip,username,anonymous"}, {"ignore_uri_user_options", "false"},
		{"keep_alive_interval", "90"}, {"max_forwards", "70"}, {"max_initial_qualify_time", "0"},
		{"mwi_disable_initial_unsolicited", "false"}, {"mwi_tps_queue_high", "500"}, {"mwi_tps_queue_low", "-1"},
		{"norefersub", "yes"}, {"regcontext", ""}, {"send_contact_status_on_update_registration", send},
		{"taskprocessor_overload_trigger", "global"}, {"unidentified_request_count", "5"},
		{"unidentified_request_period", "5"}, {"unidentified_request_prune_interval", "30"},
		{"use_callerid_contact", "no"}, {"user_agent", "Asterisk PBX 22.10.1"},
	}
	system := [][2]string{
		{"accept_multiple_sdp_answers", "false"}, {"compact_headers", "false"}, {"disable_rport", "false"},
		{"disable_tcp_switch", "true"}, {"follow_early_media_fork", "true"}, {"taskpool_auto_increment", "1"},
		{"taskpool_idle_timeout", "60"}, {"taskpool_initial_size", "4"}, {"taskpool_max_size", "50"},
		{"taskpool_minimum_size", "4"}, {"threadpool_auto_increment", "1"}, {"threadpool_idle_timeout", "60"},
		{"threadpool_initial_size", "4"}, {"threadpool_max_size", "50"}, {"timer_b", "32000"}, {"timer_t1", "500"},
	}
	m.response("Success", a)
	m.field("Message", "Command output follows")
	block := func(title string, width, rule int, params [][2]string) {
		m.field("Output", "")
		m.field("Output", title)
		m.field("Output", "")
		m.field("Output", fmt.Sprintf(" %-*s : ParameterValue", width, "ParameterName"))
		m.field("Output", " "+strings.Repeat("=", rule))
		for _, kv := range params {
			m.field("Output", fmt.Sprintf(" %-*s : %s", width, kv[0], kv[1]))
		}
	}
	block("Global Settings:", 42, 70, global)
	block("System Settings:", 27, 44, system)
	m.end()
}
