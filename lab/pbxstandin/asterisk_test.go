package pbxstandin

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestStandInMatchesAsterisk22 makes the same call through a real
// Asterisk 22 and through the stand-in, in a namespace lab, with
// deploy/asterisk's transports and the fan-phone template, and compares
// what the phones and an AMI user saw: the events, every Getvar the
// recorder reads, the headers and their order in each message the PBX
// sent, the CSeqs, the answers to requests in dialogs that are over or
// never were. FAN_ASTERISK names the install (/opt/asterisk-22).
func TestStandInMatchesAsterisk22(t *testing.T) {
	root := os.Getenv("FAN_ASTERISK")
	if root == "" {
		t.Skip("set FAN_ASTERISK=/opt/asterisk-22 to compare the stand-in with a real Asterisk 22")
	}
	prereq.Root(t)
	prereq.Need(t, "iproute2", "ip")
	n1, ph := twoHosts(t)
	n1.run(t, "sysctl", "-qw", "net.ipv4.ip_nonlocal_bind=1")
	for _, a := range []string{"198.51.100.11/24", "198.51.100.10/24"} {
		n1.run(t, "ip", "addr", "add", a, "dev", "eth0")
	}
	for _, a := range []string{"198.51.100.50/24", "198.51.100.51/24"} {
		ph.run(t, "ip", "addr", "add", a, "dev", "eth0")
	}
	in := func(fn func()) { ph.do(t, fn) }
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct_media=%v", direct), func(t *testing.T) {
			compareWithAsterisk(t, root, n1, in, direct)
		})
	}
}

// compareWithAsterisk runs the call through Asterisk, then through the
// stand-in, on the same configuration, and compares what was seen.
func compareWithAsterisk(t *testing.T, root string, n1 testNS, in func(func()), direct bool) {
	etc := writeAsteriskConf(t, t.TempDir(), root, direct)

	var fromAsterisk, fromStandIn map[string]string
	t.Run("asterisk", func(t *testing.T) {
		cmd := exec.Command("ip", "netns", "exec", n1.name, filepath.Join(root, "sbin", "asterisk"), "-C", filepath.Join(etc, "asterisk.conf"), "-f")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		logPath := filepath.Join(filepath.Dir(etc), "asterisk.out")
		logFile, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			logFile.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logPath)
				t.Logf("Asterisk's output:\n%s", b)
			}
		}()
		waitAMI(t, in, "198.51.100.11:5038")
		fromAsterisk = callScenario(t, in, direct)
	})
	t.Run("stand-in", func(t *testing.T) {
		// As the lab runs it: a process in the node's namespace, on the
		// same configuration directory (its RTP sockets, opened as calls
		// come, must be in that namespace too).
		cmd := exec.Command("ip", "netns", "exec", n1.name, standInBinary(t), "-node", "n1", "-etc", etc, "-registrar",
			"-control", filepath.Join(filepath.Dir(etc), "control.sock"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("the stand-in's log:\n%s", stderr.String())
			}
		}()
		waitAMI(t, in, "198.51.100.11:5038")
		fromStandIn = callScenario(t, in, direct)
	})
	if fromAsterisk == nil || fromStandIn == nil {
		t.FailNow()
	}
	keys := map[string]bool{}
	for k := range fromAsterisk {
		keys[k] = true
	}
	for k := range fromStandIn {
		keys[k] = true
	}
	sorted := slices.Sorted(func(yield func(string) bool) {
		for k := range keys {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range sorted {
		if a, s := fromAsterisk[k], fromStandIn[k]; a != s {
			t.Errorf("%s:\n  Asterisk: %s\n  stand-in: %s", k, a, s)
		}
	}
	t.Logf("%d observations compared", len(sorted))
}

func writeAsteriskConf(t *testing.T, dir, root string, direct bool) string {
	t.Helper()
	etc := filepath.Join(dir, "etc")
	for _, d := range []string{"etc", "lib", "run", "log", "spool", "agi"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pj := `[global]
type = global
send_contact_status_on_update_registration = yes
[transport-node]
type = transport
protocol = udp
bind = 198.51.100.11:5060
external_signaling_address = 198.51.100.10
external_media_address = 198.51.100.10
[transport-float]
type = transport
protocol = udp
bind = 198.51.100.10:5060
external_signaling_address = 198.51.100.10
external_media_address = 198.51.100.10
[fan-phone](!)
type = endpoint
context = from-phones
disallow = all
allow = ulaw,alaw
direct_media = %s
timers = no
rtp_timeout = 60
[fan-phone-auth](!)
type = auth
auth_type = userpass
[fan-phone-aor](!)
type = aor
max_contacts = 1
remove_existing = yes
`
	pj = fmt.Sprintf(pj, map[bool]string{true: "yes", false: "no"}[direct])
	for _, u := range []string{"6001", "6002", "6003"} {
		pj += fmt.Sprintf("[%s](fan-phone)\nauth = %s\naors = %s\n[%s](fan-phone-auth)\nusername = %s\npassword = change-me\n[%s](fan-phone-aor)\n", u, u, u, u, u, u)
	}
	files := map[string]string{
		"asterisk.conf": fmt.Sprintf("[directories]\nastetcdir => %[1]s/etc\nastmoddir => %[2]s/lib/asterisk/modules\nastvarlibdir => %[1]s/lib\n"+
			"astdbdir => %[1]s/lib\nastkeydir => %[1]s/lib\nastdatadir => %[2]s/var/lib/asterisk\nastagidir => %[1]s/agi\n"+
			"astspooldir => %[1]s/spool\nastrundir => %[1]s/run\nastlogdir => %[1]s/log\nastsbindir => %[2]s/sbin\n[options]\nsystemname = pbx\n", dir, root),
		"modules.conf": "[modules]\nautoload=yes\nnoload => chan_iax2.so\nnoload => chan_dahdi.so\nnoload => chan_unistim.so\nnoload => chan_skinny.so\n" +
			"noload => chan_mgcp.so\nnoload => res_ari.so\nnoload => res_hep.so\nnoload => res_hep_pjsip.so\nnoload => res_hep_rtcp.so\n" +
			"noload => res_phoneprov.so\nnoload => res_pjsip_phoneprov_provider.so\nnoload => res_http_websocket.so\n" +
			"noload => res_pjsip_transport_websocket.so\nnoload => res_prometheus.so\n",
		"logger.conf":     "[general]\n[logfiles]\nmessages => notice,warning,error\n",
		"extensions.conf": "[from-phones]\nexten => _60XX,1,Dial(PJSIP/${EXTEN})\n",
		"manager.conf": "[general]\nenabled = yes\nbindaddr = 198.51.100.11\nport = 5038\n\n[rec]\nsecret = change-me\n" +
			"read = system,call,reporting\nwrite = system,command,reporting\n",
		"pjsip.conf": pj,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return etc
}

// waitAMI waits until a PBX's AMI takes a login.
func waitAMI(t *testing.T, in func(func()), addr string) {
	t.Helper()
	start := time.Now()
	waittest.Until(t, 30*time.Second, "AMI login at "+addr, func() bool {
		var c net.Conn
		var err error
		in(func() { c, err = net.DialTimeout("tcp", addr, time.Second) })
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		fmt.Fprintf(c, "Action: Login\r\nUsername: rec\r\nSecret: change-me\r\nEvents: off\r\n\r\n")
		buf := make([]byte, 512)
		n, _ := c.Read(buf)
		for !strings.Contains(string(buf[:n]), "Authentication accepted") {
			m, err := c.Read(buf[n:])
			if err != nil {
				break
			}
			n += m
		}
		return strings.Contains(string(buf[:n]), "Authentication accepted")
	})
	// Asterisk answers AMI before its SIP stack: wait for an answer to
	// OPTIONS (401 from Asterisk) on the floating address too, within what
	// is left of the same 30 s.
	waittest.Succeeds(t, 30*time.Second-time.Since(start), "SIP at 198.51.100.10:5060", func() error {
		var err error
		in(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_, err = Ping(ctx, "OPTIONS", "198.51.100.10:5060")
		})
		return err
	})
}

// authorization answers a digest challenge as a phone with the
// fan-phone template's password does.
func (u *ua) authorization(challenge, method, uri string) string {
	param := func(k string) string {
		i := strings.Index(challenge, k+"=")
		if i < 0 {
			return ""
		}
		v := challenge[i+len(k)+1:]
		if strings.HasPrefix(v, `"`) {
			return strings.SplitN(v[1:], `"`, 2)[0]
		}
		return strings.SplitN(v, ",", 2)[0]
	}
	h := func(s string) string { sum := md5.Sum([]byte(s)); return hex.EncodeToString(sum[:]) }
	realm, nonce := param("realm"), param("nonce")
	resp := h(h(u.user+":"+realm+":change-me") + ":" + nonce + ":00000001:c0ffee:auth:" + h(method+":"+uri))
	return fmt.Sprintf("Authorization: Digest username=\"%s\", realm=\"%s\", nonce=\"%s\", uri=\"%s\", response=\"%s\", opaque=\"%s\", algorithm=MD5, qop=auth, nc=00000001, cnonce=\"c0ffee\"\r\n",
		u.user, realm, nonce, uri, resp, param("opaque"))
}

func (u *ua) registerAuth(server string) {
	u.t.Helper()
	auth := ""
	for cseq := 1; cseq <= 2; cseq++ {
		u.send(server, fmt.Sprintf("REGISTER sip:198.51.100.10 SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bKreg%s%d;rport\r\nFrom: <sip:%s@198.51.100.10>;tag=r%s\r\n"+
			"To: <sip:%s@198.51.100.10>\r\nCall-ID: reg-%s\r\nCSeq: %d REGISTER\r\nContact: <%s>\r\n%sExpires: 600\r\nContent-Length: 0\r\n\r\n",
			u.addr(), u.user, cseq, u.user, u.user, u.user, u.user, cseq, u.contact(), auth))
		r := u.expect("REGISTER's answer", func(m *sipMsg) bool { _, cm := m.cseq(); return cm == "REGISTER" && m.status >= 200 })
		if r.m.status == 200 {
			return
		}
		auth = u.authorization(r.m.get("www-authenticate"), "REGISTER", "sip:198.51.100.10")
	}
	u.t.Fatal("REGISTER refused")
}

// callScenario is 6001 calling 6002 through the floating address, 6002
// answering, the media going direct, 6001 hanging up; then requests in
// the finished dialog and in one that never was. What the phones and AMI
// user saw comes back normalized: names for the values each run draws.
func callScenario(t *testing.T, in func(func()), direct bool) map[string]string {
	const server = "198.51.100.10:5060"
	out := map[string]string{}
	var a, b *ua
	in(func() {
		a = newUAAt(t, "6001", "198.51.100.50", 5060)
		b = newUAAt(t, "6002", "198.51.100.51", 5060)
	})
	ev := followAMIIn(t, in, "198.51.100.11:5038", "rec", "change-me")
	a.registerAuth(server)
	b.registerAuth(server)

	callID := "compare@198.51.100.50"
	body := a.sdp(1)
	auth, cseq := "", uint32(1)
	var inv received
	for {
		branch := fmt.Sprintf("z9hG4bKcmp%d", cseq)
		a.send(server, fmt.Sprintf("INVITE sip:6002@198.51.100.10 SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:6001@198.51.100.10>;tag=%s\r\n"+
			"To: <sip:6002@198.51.100.10>\r\nCall-ID: %s\r\nCSeq: %d INVITE\r\nContact: <%s>\r\n%sContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
			a.addr(), branch, a.tag, callID, cseq, a.contact(), auth, len(body), body))
		r := a.expect("INVITE's answer", func(m *sipMsg) bool { _, cm := m.cseq(); return cm == "INVITE" && m.status != 0 })
		if r.m.status != 401 {
			out["100 to the caller"] = shape(r.m)
			break
		}
		a.send(server, fmt.Sprintf("ACK sip:6002@198.51.100.10 SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nFrom: <sip:6001@198.51.100.10>;tag=%s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d ACK\r\nContent-Length: 0\r\n\r\n",
			a.addr(), branch, a.tag, r.m.get("to"), callID, cseq))
		auth = a.authorization(r.m.get("www-authenticate"), "INVITE", "sip:6002@198.51.100.10")
		cseq++
	}
	inv = b.expect("the INVITE", isRequest("INVITE"))
	b.answer(inv, 180, "Ringing", b.tag, "")
	ring := a.expect("180", isAnswer(180, "INVITE"))
	b.answer(inv, 200, "OK", b.tag, b.sdp(1))
	calleeAck := b.expect("ACK", isRequest("ACK"))
	ok := a.expect("200", isAnswer(200, "INVITE"))
	pbxTag := tagOf(ok.m.get("to"))
	da := &dialog{callID: callID, local: "<sip:6001@198.51.100.10>;tag=" + a.tag, remote: ok.m.get("to"), target: uriOf(ok.m.get("contact")), cseq: cseq}
	a.send(server, fmt.Sprintf("ACK %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bKcmpack;rport\r\nFrom: %s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d ACK\r\nContent-Length: 0\r\n\r\n",
		da.target, a.addr(), da.local, da.remote, callID, cseq))
	var ra, rb, ackA, ackB received
	if direct {
		ra = a.expect("re-INVITE", isRequest("INVITE"))
		rb = b.expect("re-INVITE", isRequest("INVITE"))
		a.answer(ra, 200, "OK", "", a.sdp(2))
		b.answer(rb, 200, "OK", "", b.sdp(2))
		ackA = a.expect("ACK", isRequest("ACK"))
		ackB = b.expect("ACK", isRequest("ACK"))
	} else {
		out["no re-INVITE"] = fmt.Sprint(a.quiet(300*time.Millisecond, isRequest("INVITE")))
		// The audio goes through the PBX: A's reaches B from the port B's
		// SDP named, and B's reaches A.
		toA, _ := parseSDP(ok.m.body)
		toB, _ := parseSDP(inv.m.body)
		for i := range 5 {
			_, _ = a.rtp.WriteToUDP(rtpPacket(i), toA.addr())
			_, _ = b.rtp.WriteToUDP(rtpPacket(i), toB.addr())
			time.Sleep(20 * time.Millisecond)
		}
		for _, p := range []struct {
			u    *ua
			port int
		}{{a, toA.port}, {b, toB.port}} {
			r, ok := tryRTP(p.u, time.Second)
			if !ok {
				t.Errorf("%s got no audio through the PBX", p.u.user)
			}
			out["audio relayed to "+p.u.user] = fmt.Sprintf("%v from the node's own address %v from the port its SDP named %v",
				ok, ok && r.from.IP.String() == "198.51.100.11", ok && r.from.Port == p.port)
		}
	}
	ev.waitEvent(t, "BridgeEnter PJSIP/6001")
	time.Sleep(200 * time.Millisecond)

	first := mustCSeq(inv.m)
	norm := strings.NewReplacer(inv.m.get("call-id"), "{pbx.B.call-id}", tagOf(inv.m.get("from")), "{pbx.B.tag}", pbxTag, "{pbx.A.tag}",
		callID, "{A.call-id}", a.media(), "{A.media}", b.media(), "{B.media}")
	branchRE := regexp.MustCompile(`branch=z9hG4bKPj[0-9a-f-]{36}`)
	portRE := regexp.MustCompile(`(198\.51\.100\.1[01]):\d+$`)
	ourBranchRE := regexp.MustCompile(`branch=z9hG4bKcmp\d+`)
	n := func(s string) string {
		return ourBranchRE.ReplaceAllString(branchRE.ReplaceAllString(norm.Replace(s), "branch={branch}"), "branch={ours}")
	}
	// record notes a message's shape and values; its CSeq relative to base.
	record := func(label string, r received, base uint32) {
		out["sip "+label] = shape(r.m)
		headers := []string{"via", "from", "to", "contact", "reason"}
		if r.m.method == "BYE" {
			// Asterisk's BYE carries Reason: Q.850;cause=16 in some calls
			// and not in others (docs/asterisk22.md).
			out["sip "+label] = shape(r.m, "reason")
			headers = headers[:4]
		}
		out["sip "+label+" from"] = r.from.String()
		for _, h := range headers {
			if v := r.m.get(h); v != "" {
				out["sip "+label+" "+h] = n(v)
			}
		}
		if r.m.isRequest() {
			out["sip "+label+" request-uri"] = n(r.m.ruri)
			c, _ := r.m.cseq()
			out["sip "+label+" cseq"] = fmt.Sprintf("%+d", int64(c)-int64(base))
		}
		if s, ok := parseSDP(r.m.body); ok {
			out["sip "+label+" sdp"] = n(fmt.Sprintf("c=%s port-is-phone's=%v payloads=%v", s.ip, s.port == a.rtp.LocalAddr().(*net.UDPAddr).Port || s.port == b.rtp.LocalAddr().(*net.UDPAddr).Port, s.payloads))
		}
	}
	out["sip INVITE to the callee first CSeq below 32768"] = fmt.Sprint(first < 32768)
	record("INVITE to the callee", inv, first)
	record("180 to the caller", ring, 0)
	record("ACK to the callee", calleeAck, first)
	record("200 to the caller", ok, 0)
	if direct {
		record("re-INVITE to the caller", ra, mustCSeq(ra.m))
		record("re-INVITE to the callee", rb, first)
		record("ACK to the caller", ackA, mustCSeq(ra.m))
		record("ACK of the callee's re-INVITE", ackB, first)
		out["sip re-INVITE to the caller cseq"] = fmt.Sprint(mustCSeq(ra.m) < 32768)
	}

	for _, ch := range []string{"PJSIP/6001-00000000", "PJSIP/6002-00000001"} {
		for _, v := range []string{"call-id", "local_tag", "remote_tag", "local_uri", "remote_uri", "target_uri", "request_uri", "remote_addr", "local_addr"} {
			out["getvar "+ch+" "+v] = n(getvarIn(t, in, "198.51.100.11:5038", "rec", "change-me", ch, "CHANNEL(pjsip,"+v+")"))
		}
		for _, v := range []string{"direct", "dest", "src"} {
			out["getvar "+ch+" rtp,"+v] = portRE.ReplaceAllString(n(getvarIn(t, in, "198.51.100.11:5038", "rec", "change-me", ch, "CHANNEL(rtp,"+v+")")), "$1:{port}")
		}
	}

	a.request(server, da, "BYE", 0, "")
	out["BYE from the caller"] = fmt.Sprint(a.expect("BYE's answer", isAnswer(200, "BYE")).m.status)
	if direct {
		back := b.expect("re-INVITE back", isRequest("INVITE"))
		record("re-INVITE back to the callee", back, first)
		b.answer(back, 200, "OK", "", b.sdp(3))
		b.expect("ACK", isRequest("ACK"))
	}
	bye := b.expect("BYE", isRequest("BYE"))
	record("BYE to the callee", bye, first)
	b.answer(bye, 200, "OK", "", "")
	ev.waitEvent(t, "Hangup PJSIP/6001")
	time.Sleep(200 * time.Millisecond)

	names := ev.names()
	var setup, hangup []string
	for _, e := range names {
		if e == "FullyBooted" {
			continue
		}
		if len(setup) < 14 {
			setup = append(setup, e)
		} else {
			hangup = append(hangup, e)
		}
	}
	sort.Strings(setup)
	sort.Strings(hangup)
	out["events of the setup"] = strings.Join(setup, ", ")
	out["events of the hangup"] = strings.Join(hangup, ", ")

	// The caller's dialog just ended; a dialog that never was.
	a.request(server, da, "BYE", 0, "")
	out["BYE in the finished dialog"] = a.expect("answer", func(m *sipMsg) bool { _, cm := m.cseq(); return cm == "BYE" && m.status >= 200 }).m.reason
	never := &dialog{callID: "never@x", local: "<sip:6001@198.51.100.10>;tag=x1", remote: "<sip:6002@198.51.100.10>;tag=y1", target: "sip:198.51.100.10:5060", cseq: 5}
	for _, contact := range []string{"", "Contact: <sip:6001@198.51.100.50:5060>\r\n"} {
		for _, m := range []string{"BYE", "INVITE", "UPDATE", "INFO", "REFER", "NOTIFY", "OPTIONS", "MESSAGE"} {
			body := ""
			if m == "INVITE" {
				body = a.sdp(9)
			}
			a.requestWith(server, never, m, contact, body)
			r := a.expect(m+"'s answer", func(x *sipMsg) bool { _, cm := x.cseq(); return cm == m && x.status >= 200 })
			label := fmt.Sprintf("%s in a dialog that never was, Contact %v", m, contact != "")
			out[label] = fmt.Sprintf("%d %s", r.m.status, r.m.reason)
			out[label+": shape"] = shape(r.m)
		}
	}
	return out
}

// shape is a message's header names in order, leaving out the stand-in's
// Server-Node and the names in leave.
func shape(m *sipMsg, leave ...string) string {
	var names []string
	for _, h := range m.headers {
		if h.name != strings.ToLower(NodeHeader) && !slices.Contains(leave, h.name) {
			names = append(names, h.name)
		}
	}
	start := m.method
	if start == "" {
		start = fmt.Sprintf("%d %s", m.status, m.reason)
	}
	return start + ": " + strings.Join(names, ", ")
}

// testNS is a network namespace of the test's (the lab's netlabtest
// imports this package, so it cannot serve here).
type testNS struct {
	name string
	h    netns.NsHandle
}

func newTestNS(t *testing.T, name string) testNS {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	n := testNS{name: name, h: h}
	n.run(t, "ip", "link", "set", "lo", "up")
	return n
}

// run runs a command inside the namespace.
func (n testNS) run(t *testing.T, argv ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns", "exec", n.name}, argv...)...).CombinedOutput(); err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(argv, " "), n.name, err, out)
	}
}

// do runs fn on a thread inside the namespace: sockets it opens live there.
func (n testNS) do(t *testing.T, fn func()) {
	t.Helper()
	if err := netlab.InNamespace(n.h, func() error { fn(); return nil }); err != nil {
		t.Fatalf("namespace %s: %v", n.name, err)
	}
}

// twoHosts are a PBX node and a host for the phones on one bridge, each
// with an eth0, only 198.51.100.0/24 inside.
func twoHosts(t *testing.T) (node, phones testNS) {
	t.Helper()
	id := newUUID()[:6]
	br := newTestNS(t, "fanb2b-br-"+id)
	br.run(t, "ip", "link", "add", "br0", "type", "bridge")
	br.run(t, "ip", "link", "set", "br0", "up")
	var hosts []testNS
	for _, h := range []string{"n1", "ph"} {
		ns := newTestNS(t, "fanb2b-"+h+"-"+id)
		port := "p" + h + id
		br.run(t, "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
		br.run(t, "ip", "link", "set", port, "master", "br0", "up")
		ns.run(t, "ip", "link", "set", "eth0", "up")
		hosts = append(hosts, ns)
	}
	return hosts[0], hosts[1]
}

// rtpPacket is 20 ms of PCMU silence, a packet Asterisk relays.
func rtpPacket(seq int) []byte {
	p := make([]byte, 12+160)
	p[0], p[1] = 0x80, 0
	p[2], p[3] = byte(seq>>8), byte(seq)
	ts := uint32(seq * 160)
	p[4], p[5], p[6], p[7] = byte(ts>>24), byte(ts>>16), byte(ts>>8), byte(ts)
	p[8], p[9], p[10], p[11] = 0x12, 0x34, 0x56, 0x78
	for i := 12; i < len(p); i++ {
		p[i] = 0xff
	}
	return p
}

// standInBinary builds fan-pbxstandin for the test.
func standInBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fan-pbxstandin")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fanpbx/fan/lab/cmd/fan-pbxstandin").CombinedOutput(); err != nil {
		t.Fatalf("go build fan-pbxstandin: %v\n%s", err, out)
	}
	return bin
}
