package regbench

import (
	"bufio"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A phone is a user and the contact address it registers: SIPp sends the
// REGISTERs (its scenario writes each phone's Contact from the injection
// file), and the benchmark listens on each contact port itself, so an
// INVITE to the contact (what Originate PJSIP/<aor> makes the PBX send) is
// seen by the phone it is meant for.
type phone struct {
	user string
	port int
}

func (p phone) uri() string { return fmt.Sprintf("sip:%s@127.0.0.1:%d", p.user, p.port) }

// key is the contact's AstDB key below registrar/ (res_pjsip/location.c).
func (p phone) key() string {
	h := md5.Sum([]byte(p.uri()))
	return "contact/" + p.user + ";@" + hex.EncodeToString(h[:])
}

// phoneListeners answer INVITEs on every contact port and note when each
// port was first reached after a mark.
type phoneListeners struct {
	mu      sync.Mutex
	since   time.Time
	reached map[int]time.Time
	conns   []*net.UDPConn
	wg      sync.WaitGroup
}

func listenPhones(ports []int) (*phoneListeners, error) {
	l := &phoneListeners{reached: map[int]time.Time{}}
	for _, port := range ports {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("phone port %d: %w", port, err)
		}
		l.conns = append(l.conns, c)
		l.wg.Add(1)
		go l.serve(c, port)
	}
	return l, nil
}

// mark starts counting INVITEs from now.
func (l *phoneListeners) mark() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.since, l.reached = time.Now(), map[int]time.Time{}
}

func (l *phoneListeners) reachedAt(port int) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.reached[port]
	return t, ok
}

func (l *phoneListeners) serve(c *net.UDPConn, port int) {
	defer l.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			return
		}
		msg := string(buf[:n])
		if !strings.HasPrefix(msg, "INVITE ") {
			continue
		}
		now := time.Now()
		l.mu.Lock()
		if _, ok := l.reached[port]; !ok && !l.since.IsZero() {
			l.reached[port] = now
		}
		l.mu.Unlock()
		// Busy: the call ends at once, the phone was reached.
		var vias []string
		hdr := map[string]string{}
		head, _, _ := strings.Cut(msg, "\r\n\r\n")
		for _, line := range strings.Split(head, "\r\n")[1:] {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			k = strings.ToLower(strings.TrimSpace(k))
			if k == "via" || k == "v" {
				vias = append(vias, "Via: "+strings.TrimSpace(v))
				continue
			}
			if _, seen := hdr[k]; !seen {
				hdr[k] = strings.TrimSpace(v)
			}
		}
		resp := "SIP/2.0 486 Busy Here\r\n" + strings.Join(vias, "\r\n") + "\r\nFrom: " + hdr["from"] + "\r\nTo: " + hdr["to"] +
			";tag=rb" + strconv.Itoa(port) + "\r\nCall-ID: " + hdr["call-id"] + "\r\nCSeq: " + hdr["cseq"] + "\r\nContent-Length: 0\r\n\r\n"
		_, _ = c.WriteToUDP([]byte(resp), from)
	}
}

func (l *phoneListeners) Close() {
	for _, c := range l.conns {
		c.Close()
	}
	l.wg.Wait()
}

// registerScenario is SIPp's scenario: one REGISTER per call, its user,
// contact port and Expires from the injection file, and a log line with
// the time the 200 OK came (SIPp's clock, to the microsecond).
const registerScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="fan-regbench register">
  <send retrans="500">
    <![CDATA[

      REGISTER sip:[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch];rport
      Max-Forwards: 70
      From: <sip:[field0]@[remote_ip]>;tag=[call_number]
      To: <sip:[field0]@[remote_ip]>
      Call-ID: [call_id]
      CSeq: [cseq] REGISTER
      Contact: <sip:[field0]@[local_ip]:[field1]>
      Expires: [field2]
      User-Agent: fan-regbench
      Content-Length: 0

    ]]>
  </send>
  <recv response="200">
    <action>
      <gettimeofday assign_to="sec,usec"/>
      <log message="ok [field0] [field1] [field2] [$sec] [$usec]"/>
    </action>
  </recv>
</scenario>
`

// sipp is one SIPp run over an injection file of phones.
type sipp struct {
	cmd  *exec.Cmd
	log  string
	done chan error
}

// runSIPp registers phones (expires 0 unregisters them) at rate a second,
// count REGISTERs in all (the injection file is read in a loop: a phone
// registers again once every len(phones)/rate seconds); count 0 runs
// until stopped.
func runSIPp(dir, name, server string, localPort int, phones []phone, expires int, rate float64, count int) (*sipp, error) {
	sf := filepath.Join(dir, "register.xml")
	if err := os.WriteFile(sf, []byte(registerScenario), 0o644); err != nil {
		return nil, err
	}
	inf := filepath.Join(dir, name+".csv")
	var b strings.Builder
	b.WriteString("SEQUENTIAL\n")
	for _, p := range phones {
		fmt.Fprintf(&b, "%s;%d;%d\n", p.user, p.port, expires)
	}
	if err := os.WriteFile(inf, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	s := &sipp{log: filepath.Join(dir, name+"-ok.log"), done: make(chan error, 1)}
	args := []string{server, "-sf", sf, "-inf", inf, "-i", "127.0.0.1", "-p", strconv.Itoa(localPort), "-bind_local",
		"-nostdin", "-trace_logs", "-log_file", s.log, "-trace_err", "-error_file", filepath.Join(dir, name+"-err.log"),
		"-r", strconv.FormatFloat(rate*10, 'f', 0, 64), "-rp", "10000", "-recv_timeout", "5000", "-l", "5000"}
	if count > 0 {
		args = append(args, "-m", strconv.Itoa(count))
	}
	s.cmd = exec.Command("sipp", args...)
	s.cmd.Dir = dir
	out, err := os.Create(filepath.Join(dir, name+"-sipp.out"))
	if err != nil {
		return nil, err
	}
	s.cmd.Stdout, s.cmd.Stderr = out, out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("sipp: %w", err)
	}
	go func() {
		s.done <- s.cmd.Wait()
		out.Close()
	}()
	return s, nil
}

// wait waits for a counted run to end.
func (s *sipp) wait(ctx context.Context) error {
	select {
	case err := <-s.done:
		if err != nil {
			// SIPp exits 1 when some calls failed; the log says which
			// REGISTERs were answered, which is what counts here.
			var ee *exec.ExitError
			if !asExit(err, &ee) || ee.ExitCode() > 1 {
				return fmt.Errorf("sipp: %w", err)
			}
		}
		return nil
	case <-ctx.Done():
		s.stop()
		return ctx.Err()
	}
}

func asExit(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*ee = e
	}
	return ok
}

func (s *sipp) stop() {
	if s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
}

// answered is one REGISTER's 200 OK as SIPp logged it.
type answered struct {
	user    string
	port    int
	expires int
	at      time.Time
}

// tail follows SIPp's log file and sends each 200 OK, until ctx ends.
func tail(ctx context.Context, path string, out chan<- answered) {
	var f *os.File
	for f == nil {
		var err error
		if f, err = os.Open(path); err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var partial string
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			partial += line
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return
		}
		line, partial = partial+line, ""
		f := strings.Fields(line)
		if len(f) != 6 || f[0] != "ok" {
			continue
		}
		port, _ := strconv.Atoi(f[2])
		exp, _ := strconv.Atoi(f[3])
		// SIPp prints its variables as decimals ("1796661933.000000").
		sec, _ := strconv.ParseFloat(f[4], 64)
		usec, _ := strconv.ParseFloat(f[5], 64)
		a := answered{user: f[1], port: port, expires: exp, at: time.Unix(int64(sec), int64(usec)*1000)}
		select {
		case out <- a:
		case <-ctx.Done():
			return
		}
	}
}
