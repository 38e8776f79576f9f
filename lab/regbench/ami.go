package regbench

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// amiConn is the benchmark's own AMI client: one action at a time on one
// connection, logged in with Events: off, so nothing but answers and
// their list items arrive. (lab imports nothing of fan's packages beyond
// the event contract; fan's AMI client, pkg/ami, tests against lab.)
type amiConn struct {
	mu  sync.Mutex
	c   net.Conn
	br  *bufio.Reader
	seq int
}

// amiMsg is one message's headers, the first value of each.
type amiMsg map[string]string

func dialAMI(addr, user, secret string) (*amiConn, error) {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return nil, err
	}
	a := &amiConn{c: c, br: bufio.NewReaderSize(c, 64<<10)}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := a.br.ReadString('\n'); err != nil {
		c.Close()
		return nil, fmt.Errorf("ami %s banner: %w", addr, err)
	}
	if _, err := fmt.Fprintf(c, "Action: Login\r\nUsername: %s\r\nSecret: %s\r\nEvents: off\r\n\r\n", user, secret); err != nil {
		c.Close()
		return nil, err
	}
	m, err := a.read()
	if err != nil || m["Response"] != "Success" {
		c.Close()
		return nil, fmt.Errorf("ami %s login: %v %v", addr, m, err)
	}
	_ = c.SetDeadline(time.Time{})
	return a, nil
}

func (a *amiConn) Close() { a.c.Close() }

func (a *amiConn) read() (amiMsg, error) {
	m := amiMsg{}
	for {
		line, err := a.br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if len(m) == 0 {
				continue
			}
			return m, nil
		}
		k, v, _ := strings.Cut(line, ":")
		if _, seen := m[k]; !seen {
			m[k] = strings.TrimLeft(v, " ")
		}
	}
}

// do runs one action and returns its response and, for a list, its items.
func (a *amiConn) do(action string, fields ...string) (amiMsg, []amiMsg, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	id := "rb-" + strconv.Itoa(a.seq)
	var b strings.Builder
	fmt.Fprintf(&b, "Action: %s\r\nActionID: %s\r\n", action, id)
	for i := 0; i+1 < len(fields); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", fields[i], fields[i+1])
	}
	b.WriteString("\r\n")
	_ = a.c.SetDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = a.c.SetDeadline(time.Time{}) }()
	if _, err := a.c.Write([]byte(b.String())); err != nil {
		return nil, nil, err
	}
	var resp amiMsg
	var items []amiMsg
	for {
		m, err := a.read()
		if err != nil {
			return nil, nil, fmt.Errorf("ami %s: %w", action, err)
		}
		if m["ActionID"] != id {
			continue
		}
		if resp == nil {
			resp = m
			if m["EventList"] != "start" {
				return resp, nil, nil
			}
			continue
		}
		if m["EventList"] == "Complete" {
			return resp, items, nil
		}
		items = append(items, m)
	}
}

// tree is a family's keys (without the leading "/family/") and values.
func (a *amiConn) tree(family string) (map[string]string, error) {
	r, items, err := a.do("DBGetTree", "Family", family)
	if err != nil {
		return nil, err
	}
	if r["Response"] != "Success" {
		return nil, fmt.Errorf("DBGetTree %s: %s", family, r["Message"])
	}
	out := make(map[string]string, len(items))
	for _, it := range items {
		out[strings.TrimPrefix(it["Key"], "/"+family+"/")] = it["Val"]
	}
	return out, nil
}

var errNotFound = errors.New("not found")

// get is DBGet of one key; errNotFound when Asterisk has none.
func (a *amiConn) get(family, key string) (string, error) {
	r, items, err := a.do("DBGet", "Family", family, "Key", key)
	if err != nil {
		return "", err
	}
	if r["Response"] != "Success" {
		if strings.Contains(r["Message"], "not found") {
			return "", errNotFound
		}
		return "", fmt.Errorf("DBGet: %s", r["Message"])
	}
	for _, it := range items {
		return it["Val"], nil
	}
	return "", errNotFound
}

// amiPool spreads polls over a few connections.
type amiPool struct {
	conns chan *amiConn
}

func newAMIPool(addr, user, secret string, n int) (*amiPool, error) {
	p := &amiPool{conns: make(chan *amiConn, n)}
	for range n {
		c, err := dialAMI(addr, user, secret)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.conns <- c
	}
	return p, nil
}

func (p *amiPool) with(f func(*amiConn) error) error {
	c := <-p.conns
	defer func() { p.conns <- c }()
	return f(c)
}

func (p *amiPool) Close() {
	for {
		select {
		case c := <-p.conns:
			c.Close()
		default:
			return
		}
	}
}
