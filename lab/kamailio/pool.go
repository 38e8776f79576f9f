package kamailio

import "fmt"

// The pool lab's configurations (stack.StartPool): PBX nodes behind a
// dispatcher, the shape of docs/recipes/kamailio-pool.md.

// PoolNodeConfig stands in for one PBX node of a pool on listenIP:5060:
// it answers INVITE 200 naming the node (X-Node) and logs a marker line
// per INVITE with the time it arrived and its Call-ID, which is what the
// lab counts ("calls reaching n1" is measured at n1); OPTIONS (the
// dispatcher's and the observer's probes) are answered 200 without a line.
func PoolNodeConfig(name, listenIP string) string {
	return fmt.Sprintf(`#!KAMAILIO
children=2
auto_aliases=no
listen=udp:%[2]s:5060
%[3]srequest_route {
	if (!mf_process_maxfwd_header("10")) { sl_send_reply("483", "Too Many Hops"); exit; }
	if (is_method("INVITE")) {
		xlog("L_ALERT", "FANTEST INVITE node=%[1]s t=$TV(Sn) cid=$ci\n");
		append_to_reply("X-Node: %[1]s\r\n");
		sl_send_reply("200", "OK");
		exit;
	}
	if (is_method("ACK")) { exit; }
	sl_send_reply("200", "OK");
}
`, name, listenIP, Modules)
}

// PoolProxyConfig is the pool's dispatcher on listenIP:5060 (UDP): every
// INVITE goes to a destination of set 1 chosen by relative weight
// (algorithm 11: a destination gets its rweight over the sum of the
// rweights of the destinations that may be used, recomputed when one is
// disabled or probed down), which is what fan's weights are written for
// (dispatcher.list rweight=N). Destinations are probed with OPTIONS every
// second (ds_probing_mode=1: fan's "d" sticks, "i" would not). JSON-RPC on
// 127.0.0.1:rpcPort only, for the dispatcher executor on the same host.
// ACK and BYE of SIPp's built-in uac come back here (no Contact from the
// node) and are absorbed.
func PoolProxyConfig(listenIP string, rpcPort int, listFile string) string {
	return fmt.Sprintf(`#!KAMAILIO
children=4
auto_aliases=no
listen=udp:%[1]s:5060
listen=tcp:127.0.0.1:%[2]d
tcp_accept_no_cl=yes
%[4]sloadmodule "xhttp.so"
loadmodule "jsonrpcs.so"
loadmodule "dispatcher.so"
modparam("jsonrpcs", "transport", 1)
modparam("tm", "fr_timer", 2000)
modparam("dispatcher", "list_file", "%[3]s")
modparam("dispatcher", "ds_ping_interval", 1)
modparam("dispatcher", "ds_probing_mode", 1)
modparam("dispatcher", "ds_ping_reply_codes", "class=2")
modparam("dispatcher", "reload_delta", 1)
request_route {
	if (!mf_process_maxfwd_header("10")) { sl_send_reply("483", "Too Many Hops"); exit; }
	if (is_method("ACK")) { if (t_check_trans()) { t_relay(); } exit; }
	if (is_method("BYE")) { sl_send_reply("200", "OK"); exit; }
	if (is_method("INVITE")) {
		if (!ds_select_dst("1", "11")) { sl_send_reply("503", "No destination"); exit; }
		t_relay();
		exit;
	}
	sl_send_reply("404", "Not here");
}
event_route[xhttp:request] {
	if ($Rp != %[2]d) { xhttp_reply("403", "Forbidden", "text/plain", ""); exit; }
	if ($hu =~ "^/RPC") { jsonrpc_dispatch(); exit; }
	xhttp_reply("404", "Not Found", "text/plain", "");
}
`, listenIP, rpcPort, listFile, Modules)
}
