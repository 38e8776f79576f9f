// Package kamailio is the one place fan's labs and tests write Kamailio
// configurations: the node that answers OPTIONS naming itself (the lab's
// stand-in for a PBX's SIP stack), a peer answering OPTIONS 200 on one port
// and 503 on another (for SIP checks), a UAS that logs every call it
// answers, and a dispatcher proxy with JSON-RPC. The lab (netlab) runs them in its
// namespaces; tests run them on loopback (kamailiotest).
package kamailio

import "fmt"

// Modules are the modules every configuration here loads.
const Modules = `loadmodule "kex.so"
loadmodule "corex.so"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "siputils.so"
loadmodule "textops.so"
loadmodule "xlog.so"
`

// NodeConfig is the minimal node: listen is its listen= lines; OPTIONS
// answered 200 with a header naming the node (so a client can tell who
// answered), REGISTER kept in memory, everything else 404.
func NodeConfig(listen, nodeName string) string {
	return fmt.Sprintf(`#!KAMAILIO
children=2
auto_aliases=no
%s
%sloadmodule "usrloc.so"
loadmodule "registrar.so"
modparam("usrloc","db_mode",0)
request_route {
  if (!mf_process_maxfwd_header("10")) { sl_send_reply("483","Too Many Hops"); exit; }
  if (is_method("OPTIONS")) { append_to_reply("Server-Node: %s\r\n"); sl_send_reply("200","OK"); exit; }
  if (is_method("REGISTER")) { if (!save("location")) sl_reply_error(); exit; }
  sl_send_reply("404","Not here"); exit;
}
`, listen, Modules, nodeName)
}

// OptionsConfig answers OPTIONS 200 on port ok (UDP and TCP) and 503,
// Asterisk's answer while shutting down, on port busy (UDP).
func OptionsConfig(ok, busy int) string {
	return fmt.Sprintf(`#!KAMAILIO
children=2
auto_aliases=no
listen=udp:127.0.0.1:%[1]d
listen=tcp:127.0.0.1:%[1]d
listen=udp:127.0.0.1:%[2]d
tcp_accept_no_cl=yes
%[3]srequest_route {
  if (!mf_process_maxfwd_header("10")) { sl_send_reply("483","Too Many Hops"); exit; }
  if ($Rp == %[2]d) { sl_send_reply("503","Shutting Down"); exit; }
  if (is_method("OPTIONS")) { append_to_reply("Server-Node: kam\r\n"); sl_send_reply("200","OK"); exit; }
  sl_send_reply("404","Not here"); exit;
}
`, ok, busy, Modules)
}

// UASConfig answers INVITE with 200 and a header naming the node, answers
// OPTIONS probes, and logs a marker line for each, which is what the tests
// count: "calls reaching A" is measured at A.
func UASConfig(name string, port int) string {
	return fmt.Sprintf(`#!KAMAILIO
children=1
auto_aliases=no
listen=udp:127.0.0.1:%[2]d
%[3]srequest_route {
	if (is_method("INVITE")) {
		xlog("L_ALERT", "FANTEST INVITE node=%[1]s\n");
		append_to_reply("X-Node: %[1]s\r\n");
		sl_send_reply("200", "OK");
		exit;
	}
	if (is_method("OPTIONS")) {
		xlog("L_ALERT", "FANTEST OPTIONS node=%[1]s\n");
		sl_send_reply("200", "OK");
		exit;
	}
	if (is_method("ACK")) { exit; }
	sl_send_reply("200", "OK");
}
`, name, port, Modules)
}

// ProxyConfig dispatches INVITEs round-robin (algorithm 4) over set 1, probes
// destinations every second (ds_probing_mode=1, so "i" would be overridden but
// "d" sticks), and serves JSON-RPC on the same port over TCP. ACK and BYE of
// SIPp's built-in uac come back to the proxy (no Record-Route, no Contact from
// the UAS) and are absorbed here.
func ProxyConfig(port int, listFile string) string {
	return fmt.Sprintf(`#!KAMAILIO
children=2
auto_aliases=no
listen=udp:127.0.0.1:%[1]d
listen=tcp:127.0.0.1:%[1]d
tcp_accept_no_cl=yes
%[3]sloadmodule "xhttp.so"
loadmodule "jsonrpcs.so"
loadmodule "dispatcher.so"
modparam("jsonrpcs", "transport", 1)
modparam("tm", "fr_timer", 1000)
modparam("dispatcher", "list_file", "%[2]s")
modparam("dispatcher", "ds_ping_interval", 1)
modparam("dispatcher", "ds_probing_mode", 1)
modparam("dispatcher", "ds_ping_reply_codes", "class=2")
modparam("dispatcher", "reload_delta", 2)
request_route {
	if (!mf_process_maxfwd_header("10")) { sl_send_reply("483", "Too Many Hops"); exit; }
	if (is_method("ACK")) { if (t_check_trans()) { t_relay(); } exit; }
	if (is_method("BYE")) { sl_send_reply("200", "OK"); exit; }
	if (is_method("INVITE")) {
		if (!ds_select_dst("1", "4")) { sl_send_reply("503", "No destination"); exit; }
		t_relay();
		exit;
	}
	sl_send_reply("404", "Not here");
}
event_route[xhttp:request] {
	if ($hu =~ "^/RPC") { jsonrpc_dispatch(); exit; }
	xhttp_reply("404", "Not Found", "text/plain", "");
}
`, port, listFile, Modules)
}
