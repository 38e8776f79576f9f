package netlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LinkDown sets the host's bridge-side veth down: the host keeps its address and its own
// link state, but nothing reaches it or leaves it, like a pulled cable at the switch.
func (l *Lab) LinkDown(host string) error { return l.port(host, "down") }

// LinkUp reverses LinkDown.
func (l *Lab) LinkUp(host string) error { return l.port(host, "up") }

func (l *Lab) port(host, state string) error {
	h, err := l.host(host)
	if err != nil {
		return err
	}
	_, err = runIP(context.Background(), "-n", l.lanNS, "link", "set", h.Port, state)
	return err
}

// KillAll sends SIGKILL to every process whose network namespace is host's, whoever
// started it, and waits until they are gone, as the host's crash would: what was
// started with StartService stays down too. It returns how many it killed.
func (l *Lab) KillAll(host string) (int, error) {
	h, err := l.host(host)
	if err != nil {
		return 0, err
	}
	// A crashed machine takes its service manager down with it: nothing
	// of the host is restarted (StartService) until the caller starts it
	// again, as a machine that boots does.
	l.mu.Lock()
	procs := slices.Clone(l.procs)
	l.mu.Unlock()
	for _, p := range procs {
		if p.Host == host {
			p.disarm()
		}
	}
	n, err := killInNS(h.NS, 3*time.Second)
	if err != nil {
		return n, err
	}
	// Gone from the namespace is not yet reaped: a Proc of the lab's reads
	// as running until its waiter has collected it, and a caller that
	// restarts what is not running (Stack.StartNode, right after a fast
	// failover) would otherwise skip a process it just killed.
	reaped := time.NewTimer(3 * time.Second)
	defer reaped.Stop()
	for _, p := range procs {
		if p.Host != host {
			continue
		}
		select {
		case <-p.Done():
		case <-reaped.C:
			return n, fmt.Errorf("netlab: %s: kill all on %s: %s not reaped within 3s", l.prefix, host, p.Name)
		}
	}
	return n, nil
}

// PIDs lists the processes whose network namespace is host's.
func (l *Lab) PIDs(host string) ([]int, error) {
	h, err := l.host(host)
	if err != nil {
		return nil, err
	}
	return pidsInNS(h.NS)
}

type nsID struct{ dev, ino uint64 }

func nsIdentity(path string) (nsID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nsID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return nsID{uint64(st.Dev), st.Ino}, nil
}

// pidsInNS compares each process's /proc/PID/ns/net with the namespace's bind mount:
// both resolve to the same nsfs inode. Zombies have no namespace and are skipped, which is
// right: they hold no sockets and cannot be killed again. The caller's own process is
// never listed, because a thread of it may be inside the namespace (Do).
func pidsInNS(ns string) ([]int, error) {
	want, err := nsIdentity(filepath.Join(netnsDir, ns))
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		id, err := nsIdentity("/proc/" + e.Name() + "/ns/net")
		if err != nil || id != want {
			continue
		}
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids, nil
}

func killInNS(ns string, timeout time.Duration) (int, error) {
	killed := map[int]bool{}
	deadline := time.Now().Add(timeout)
	for {
		pids, err := pidsInNS(ns)
		if err != nil {
			return len(killed), fmt.Errorf("kill in %s: %w", ns, err)
		}
		if len(pids) == 0 {
			return len(killed), nil
		}
		if time.Now().After(deadline) {
			return len(killed), fmt.Errorf("netlab: kill in %s: still alive after %v: %v", ns, timeout, pids)
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				killed[pid] = true
			} else if !errors.Is(err, syscall.ESRCH) {
				return len(killed), fmt.Errorf("kill %d in %s: %w", pid, ns, err)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Neigh reads host's neighbour (ARP/NDP) entry for ip on eth0. mac is empty when there is
// no entry or the entry has no link-layer address (INCOMPLETE, FAILED); state is the
// kernel's state list joined with "," (e.g. "REACHABLE", "STALE").
func (l *Lab) Neigh(host string, ip netip.Addr) (mac, state string, err error) {
	h, err := l.host(host)
	if err != nil {
		return "", "", err
	}
	out, err := runIP(context.Background(), "-n", h.NS, "-j", "neigh", "show", "to", ip.String(), "dev", hostIf)
	if err != nil {
		return "", "", err
	}
	var ents []struct {
		Dst    string   `json:"dst"`
		Lladdr string   `json:"lladdr"`
		State  []string `json:"state"`
	}
	if err := json.Unmarshal(out, &ents); err != nil {
		return "", "", fmt.Errorf("neigh %s on %s: parse %q: %w", ip, host, out, err)
	}
	for _, e := range ents {
		if a, perr := netip.ParseAddr(e.Dst); perr == nil && a == ip {
			return strings.ToLower(e.Lladdr), strings.Join(e.State, ","), nil
		}
	}
	return "", "", nil
}

// FlushNeigh empties host's neighbour table on eth0, so the next packet to any address
// asks again; it stands in for the gratuitous ARP a real mover would send.
func (l *Lab) FlushNeigh(host string) error {
	h, err := l.host(host)
	if err != nil {
		return err
	}
	_, err = runIP(context.Background(), "-n", h.NS, "neigh", "flush", "dev", hostIf)
	return err
}
