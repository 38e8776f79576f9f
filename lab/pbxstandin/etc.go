package pbxstandin

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/lab/amipeer"
)

// The stand-in reads the parts of Asterisk's own configuration files that
// it imitates, so a host is set up for it exactly as for Asterisk: the AMI
// listener and users from manager.conf (fanctl install-host's
// manager.d/fan.conf included), the systemname from asterisk.conf, the
// UDP transports it answers SIP on and the endpoints it reports from
// pjsip.conf. Anything else in the files is read and ignored.

// Etc is what the stand-in takes from an Asterisk configuration directory.
type Etc struct {
	// AMIAddr is manager.conf's [general] bindaddr:port ("" when AMI is off).
	AMIAddr    string
	Users      []amipeer.User
	SystemName string
	// SIP are the UDP transports' bind addresses.
	SIP        []string
	Transports []amipeer.Transport
	Endpoints  []amipeer.Endpoint
	// SendContactStatusOnUpdate is pjsip.conf's [global]
	// send_contact_status_on_update_registration.
	SendContactStatusOnUpdate bool
}

// LoadEtc reads manager.conf, asterisk.conf and pjsip.conf in dir. A
// missing asterisk.conf or pjsip.conf leaves its part empty; a missing
// manager.conf is an error, as AMI is what fan talks to.
func LoadEtc(dir string) (Etc, error) {
	var e Etc
	mgr, err := readConf(dir, "manager.conf", false)
	if err != nil {
		return e, err
	}
	port, bind, enabled := "5038", "0.0.0.0", false
	for _, s := range mgr {
		if s.name == "general" {
			enabled = isTrue(s.get("enabled"))
			if v := s.get("port"); v != "" {
				port = v
			}
			if v := s.get("bindaddr"); v != "" {
				bind = v
			}
			continue
		}
		if s.template {
			continue
		}
		e.Users = append(e.Users, amipeer.User{Name: s.name, Secret: s.get("secret"),
			Read: splitList(s.get("read")), Write: splitList(s.get("write"))})
	}
	if enabled {
		e.AMIAddr = net.JoinHostPort(bind, port)
	}
	ast, err := readConf(dir, "asterisk.conf", true)
	if err != nil {
		return e, err
	}
	for _, s := range ast {
		if s.name == "options" {
			e.SystemName = s.get("systemname")
		}
	}
	pj, err := readConf(dir, "pjsip.conf", true)
	if err != nil {
		return e, err
	}
	for _, s := range pj {
		if s.template {
			continue
		}
		switch s.get("type") {
		case "global":
			e.SendContactStatusOnUpdate = isTrue(s.get("send_contact_status_on_update_registration"))
		case "transport":
			t := amipeer.Transport{ID: s.name, Protocol: s.get("protocol"), Bind: s.get("bind"),
				ExternalSignalingAddress: s.get("external_signaling_address"),
				ExternalMediaAddress:     s.get("external_media_address"), LocalNet: s.get("local_net")}
			if t.Protocol == "" || t.Protocol == "udp" {
				bind := t.Bind
				if _, _, err := net.SplitHostPort(bind); err != nil {
					bind = net.JoinHostPort(bind, "5060")
				}
				e.SIP = append(e.SIP, bind)
			}
			e.Transports = append(e.Transports, t)
		case "endpoint":
			e.Endpoints = append(e.Endpoints, amipeer.Endpoint{Name: s.name, Context: s.get("context"),
				Aors: s.get("aors"), Transport: s.get("transport"), Allow: s.get("allow"), Timers: s.get("timers"),
				NoDirectMedia: s.get("direct_media") != "" && !isTrue(s.get("direct_media"))})
		}
	}
	return e, nil
}

// section is one [name] of an Asterisk configuration file, with what its
// templates gave it before its own lines.
type section struct {
	name     string
	template bool
	keys     []string
	values   map[string]string
}

func (s *section) get(k string) string { return s.values[k] }

func (s *section) set(k, v string) {
	if _, ok := s.values[k]; !ok {
		s.keys = append(s.keys, k)
	}
	s.values[k] = v
}

// readConf reads one file with its #include and #tryinclude lines (paths
// relative to dir, globs allowed, as Asterisk reads them).
func readConf(dir, name string, optional bool) ([]*section, error) {
	r := &confReader{dir: dir, byName: map[string]*section{}}
	if err := r.file(name, optional, 0); err != nil {
		return nil, err
	}
	return r.out, nil
}

type confReader struct {
	dir    string
	out    []*section
	cur    *section
	byName map[string]*section
}

func (r *confReader) file(name string, optional bool, depth int) error {
	if depth > 8 {
		return fmt.Errorf("%s: #include nested too deep", name)
	}
	path := name
	if !filepath.IsAbs(path) {
		path = filepath.Join(r.dir, name)
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) && optional {
		return nil
	}
	if err != nil {
		return fmt.Errorf("asterisk configuration: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	inComment := false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if inComment {
			end := strings.Index(line, "--;")
			if end < 0 {
				continue
			}
			line, inComment = line[end+3:], false
		}
		if start := strings.Index(line, ";--"); start >= 0 {
			if end := strings.Index(line[start:], "--;"); end >= 0 {
				line = line[:start] + line[start+end+3:]
			} else {
				line, inComment = line[:start], true
			}
		}
		line = strings.TrimSpace(stripComment(line))
		switch {
		case line == "":
		case strings.HasPrefix(line, "#include") || strings.HasPrefix(line, "#tryinclude"):
			try := strings.HasPrefix(line, "#tryinclude")
			arg := strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(line, "#tryinclude"), "#include"))
			arg = strings.Trim(arg, `"<>`)
			pattern := arg
			if !filepath.IsAbs(pattern) {
				pattern = filepath.Join(r.dir, arg)
			}
			matches, _ := filepath.Glob(pattern)
			if len(matches) == 0 && !try && !strings.ContainsAny(arg, "*?[") {
				return fmt.Errorf("%s:%d: #include %s: no such file", path, n, arg)
			}
			for _, m := range matches {
				if err := r.file(m, try, depth+1); err != nil {
					return err
				}
			}
		case strings.HasPrefix(line, "#"):
			// #exec and the like: not imitated.
		case strings.HasPrefix(line, "["):
			r.section(line)
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || r.cur == nil {
				continue
			}
			r.cur.set(strings.TrimSpace(k), strings.TrimSpace(strings.TrimPrefix(v, ">")))
		}
	}
	return sc.Err()
}

// section opens [name], [name](!) (a template), [name](t1,t2) or
// [name](!,t1): the templates' keys first, then its own.
func (r *confReader) section(line string) {
	end := strings.Index(line, "]")
	if end < 0 {
		return
	}
	s := &section{name: strings.TrimSpace(line[1:end]), values: map[string]string{}}
	rest := strings.TrimSpace(line[end+1:])
	if strings.HasPrefix(rest, "(") && strings.HasSuffix(rest, ")") {
		for _, t := range strings.Split(rest[1:len(rest)-1], ",") {
			t = strings.TrimSpace(t)
			switch {
			case t == "!":
				s.template = true
			case t == "+":
			default:
				if tpl, ok := r.byName[t]; ok {
					for _, k := range tpl.keys {
						s.set(k, tpl.values[k])
					}
				}
			}
		}
	}
	r.out = append(r.out, s)
	r.byName[s.name] = s
	r.cur = s
}

// stripComment drops a ';' comment, keeping an escaped '\;'.
func stripComment(line string) string {
	for i := 0; i < len(line); i++ {
		if line[i] == ';' && (i == 0 || line[i-1] != '\\') {
			return line[:i]
		}
	}
	return strings.ReplaceAll(line, `\;`, ";")
}

func isTrue(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "yes", "true", "y", "t", "1", "on":
		return true
	}
	b, _ := strconv.ParseBool(v)
	return b
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
