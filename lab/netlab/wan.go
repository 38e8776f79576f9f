package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A WAN lab is several places (sites), each a LAN of its own (a bridge in
// the lab's LAN namespace), joined by one router (host WANRouter) through
// one uplink per place. Each uplink delays every packet by its place's
// Delay in each direction, so a packet from place A to place B takes
// Delay(A) + Delay(B) one way, as over two access links and a fast core.
// The delay is the kernel's netem on both ends of each uplink (tc from
// iproute2), or, on a kernel built without sch_netem, the router's delay
// line: every routed packet passes through a TUN device whose other end
// is a goroutine of the lab's owner that holds it for the same time.
// CutUplink takes a place off the WAN as a lost uplink does: its hosts keep
// their LAN and their addresses, and nothing reaches them from elsewhere.

// WANRouter is the host name of a WAN lab's router.
const WANRouter = "wan"

// PlaceSpec is one place of a WAN lab.
type PlaceSpec struct {
	// Name names the place's bridge and uplink (a host-name token, at most
	// 5 characters).
	Name string
	// Prefix is the place's LAN; the router takes its first address, which
	// every host of the place uses as its default gateway.
	Prefix netip.Prefix
	// Delay is the one-way delay of the place's uplink.
	Delay time.Duration
	// Hosts live on the place's LAN; each address lies in Prefix.
	Hosts []HostSpec
}

// WANSpec describes a WAN lab.
type WANSpec struct {
	// Prefix, Dir, StopTimeout and Logger are as in Spec.
	Prefix      string
	Dir         string
	StopTimeout time.Duration
	Logger      *slog.Logger
	Places      []PlaceSpec
	// NoNetem uses the delay line even where the kernel has netem.
	NoNetem bool
}

// Delay modes a WAN lab reports (WAN.DelayMode).
const (
	DelayNetem = "netem"
	DelayLine  = "delay line"
)

// WAN is a built WAN lab. Close stops its delay line and then closes the
// lab (Lab.Close).
type WAN struct {
	*Lab
	places []PlaceSpec
	mode   string
	line   *delayLine
}

// BuildWAN builds a WAN lab. On error everything it made is already removed.
func BuildWAN(ctx context.Context, spec WANSpec) (*WAN, error) {
	log := spec.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if spec.StopTimeout <= 0 {
		spec.StopTimeout = 3 * time.Second
	}
	if spec.Prefix != "" && !prefixRE.MatchString(spec.Prefix) {
		return nil, fmt.Errorf("netlab: prefix %q must match %s", spec.Prefix, prefixRE)
	}
	if err := checkPlaces(spec.Places); err != nil {
		return nil, err
	}
	if removed, err := Sweep(log); err != nil {
		log.Warn("netlab: sweep before build", "err", err)
	} else if len(removed) > 0 {
		log.Info("netlab: swept leftovers", "namespaces", removed)
	}
	l := &Lab{stopTimeout: spec.StopTimeout, log: log, byName: map[string]*Host{}}
	if err := l.claim(spec.Prefix, spec.Dir); err != nil {
		return nil, err
	}
	l.lanNS = l.prefix + "-" + lanName
	l.log = log.With("lab", l.prefix)
	w := &WAN{Lab: l, places: spec.Places}
	start := time.Now()
	if err := w.build(ctx, spec.NoNetem); err != nil {
		if cerr := w.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup after failed build: %w", cerr))
		}
		return nil, fmt.Errorf("build wan %s: %w", l.prefix, err)
	}
	l.log.Info("netlab: wan built", "places", len(spec.Places), "delay", w.mode, "took", time.Since(start))
	return w, nil
}

func checkPlaces(places []PlaceSpec) error {
	if len(places) < 2 {
		return errors.New("netlab: wan: at least two places")
	}
	names := map[string]bool{WANRouter: true, lanName: true}
	var prefixes []netip.Prefix
	for _, p := range places {
		if !hostNameRE.MatchString(p.Name) || len(p.Name) > 5 {
			return fmt.Errorf("netlab: wan: place name %q must match %s and have at most 5 characters", p.Name, hostNameRE)
		}
		if !p.Prefix.IsValid() || !p.Prefix.Addr().Is4() || !allowedAddr(p.Prefix.Addr()) || p.Prefix.Bits() > 30 {
			return fmt.Errorf("netlab: wan: place %s: prefix %s must be an IPv4 test network of at least 4 addresses", p.Name, p.Prefix)
		}
		for _, q := range prefixes {
			if q.Overlaps(p.Prefix) {
				return fmt.Errorf("netlab: wan: place %s: prefix %s overlaps %s", p.Name, p.Prefix, q)
			}
		}
		prefixes = append(prefixes, p.Prefix.Masked())
		if p.Delay < 0 || p.Delay > time.Second {
			return fmt.Errorf("netlab: wan: place %s: delay %v out of 0..1s", p.Name, p.Delay)
		}
		for _, h := range p.Hosts {
			if !hostNameRE.MatchString(h.Name) || names[h.Name] {
				return fmt.Errorf("netlab: wan: host name %q must match %s and be unique", h.Name, hostNameRE)
			}
			names[h.Name] = true
			a := h.Addr.Addr()
			if !p.Prefix.Contains(a) || h.Addr.Bits() != p.Prefix.Bits() || a == gateway(p.Prefix) || a == p.Prefix.Masked().Addr() {
				return fmt.Errorf("netlab: wan: host %s: %s must lie in %s, be neither its network nor its gateway %s, and have its length",
					h.Name, h.Addr, p.Prefix, gateway(p.Prefix))
			}
		}
	}
	return nil
}

// gateway is the router's address on a place's LAN: the prefix's first.
func gateway(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

// Gateway is the router's address on place's LAN.
func (w *WAN) Gateway(place string) (netip.Addr, error) {
	p, err := w.place(place)
	if err != nil {
		return netip.Addr{}, err
	}
	return gateway(p.Prefix), nil
}

func (w *WAN) place(name string) (PlaceSpec, error) {
	i := slices.IndexFunc(w.places, func(p PlaceSpec) bool { return p.Name == name })
	if i < 0 {
		return PlaceSpec{}, fmt.Errorf("netlab: wan %s: no place %q", w.prefix, name)
	}
	return w.places[i], nil
}

// PlaceOf names the place host lives in.
func (w *WAN) PlaceOf(host string) (string, error) {
	for _, p := range w.places {
		if slices.ContainsFunc(p.Hosts, func(h HostSpec) bool { return h.Name == host }) {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("netlab: wan %s: host %q is in no place", w.prefix, host)
}

// DelayMode says how the uplinks are delayed: DelayNetem or DelayLine.
func (w *WAN) DelayMode() string { return w.mode }

// uplinkPort is a place's uplink on its bridge (in the LAN namespace);
// routerPort is the same uplink's end in the router.
func uplinkPort(place string) string { return "wan-" + place }
func routerPort(place string) string { return "up-" + place }

const (
	bridgePrefix = "br-"
	delayTUN     = "dly0"
	delayTable   = "100"
)

func (w *WAN) build(ctx context.Context, noNetem bool) error {
	l := w.Lab
	if err := l.addNS(ctx, l.lanNS); err != nil {
		return err
	}
	if _, err := runIP(ctx, "-n", l.lanNS, "link", "set", "lo", "up"); err != nil {
		return err
	}
	router := &Host{Name: WANRouter, Role: RoleControl, NS: l.prefix + "-" + WANRouter}
	l.hosts = append(l.hosts, router)
	l.byName[router.Name] = router
	if err := l.addNS(ctx, router.NS); err != nil {
		return err
	}
	if _, err := runIP(ctx, "-n", router.NS, "link", "set", "lo", "up"); err != nil {
		return err
	}
	err := l.Do(WANRouter, func() error {
		for k, v := range map[string]string{
			"/proc/sys/net/ipv4/ip_forward":                "1",
			"/proc/sys/net/ipv4/conf/all/rp_filter":        "0",
			"/proc/sys/net/ipv4/conf/default/rp_filter":    "0",
			"/proc/sys/net/ipv6/conf/all/disable_ipv6":     "1",
			"/proc/sys/net/ipv6/conf/default/disable_ipv6": "1",
		} {
			if err := os.WriteFile(k, []byte(v+"\n"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("router sysctls: %w", err)
	}
	for _, p := range w.places {
		br := bridgePrefix + p.Name
		gw := netip.PrefixFrom(gateway(p.Prefix), p.Prefix.Bits())
		steps := [][]string{
			{"-n", l.lanNS, "link", "add", br, "type", "bridge", "forward_delay", "0", "stp_state", "0"},
			{"-n", l.lanNS, "link", "set", br, "up"},
			{"-n", l.lanNS, "link", "add", uplinkPort(p.Name), "type", "veth", "peer", "name", routerPort(p.Name), "netns", router.NS},
			{"-n", l.lanNS, "link", "set", uplinkPort(p.Name), "master", br},
			{"-n", l.lanNS, "link", "set", uplinkPort(p.Name), "up"},
			// No prefix route: the delay line routes the places' prefixes
			// itself; netem mode adds them back below.
			{"-n", router.NS, "addr", "add", gw.String(), "dev", routerPort(p.Name), "noprefixroute"},
			{"-n", router.NS, "link", "set", routerPort(p.Name), "up"},
		}
		if err := runIPs(ctx, steps); err != nil {
			return err
		}
		if router.Addr == (netip.Prefix{}) {
			router.Addr, router.Port = gw, uplinkPort(p.Name)
		}
		for _, hs := range p.Hosts {
			h := &Host{Name: hs.Name, Role: RoleClient, NS: l.prefix + "-" + hs.Name, Port: portPrefix + hs.Name, Addr: hs.Addr,
				MAC: strings.ToLower(hs.MAC)}
			l.hosts = append(l.hosts, h)
			l.byName[h.Name] = h
			if err := l.addNS(ctx, h.NS); err != nil {
				return err
			}
			add := []string{"-n", l.lanNS, "link", "add", h.Port, "type", "veth", "peer", "name", hostIf, "netns", h.NS}
			if h.MAC != "" {
				add = append(add, "address", h.MAC)
			}
			steps := [][]string{
				{"-n", h.NS, "link", "set", "lo", "up"},
				add,
				{"-n", l.lanNS, "link", "set", h.Port, "master", br},
				{"-n", l.lanNS, "link", "set", h.Port, "up"},
				{"-n", h.NS, "addr", "add", h.Addr.String(), "dev", hostIf},
				{"-n", h.NS, "link", "set", hostIf, "up"},
				{"-n", h.NS, "route", "add", "default", "via", gateway(p.Prefix).String()},
			}
			if err := runIPs(ctx, steps); err != nil {
				return err
			}
			if h.MAC == "" {
				mac, err := ifMAC(ctx, h.NS, hostIf)
				if err != nil {
					return err
				}
				h.MAC = mac
			}
		}
	}
	if !noNetem {
		ok, err := w.netem(ctx)
		if err != nil {
			return err
		}
		if ok {
			w.mode = DelayNetem
			return nil
		}
	}
	w.mode = DelayLine
	return w.startDelayLine(ctx)
}

// netem delays both ends of every uplink with the kernel's netem, and
// routes the places' prefixes straight out of their uplinks. It reports
// false, having changed nothing, when the kernel has no netem.
func (w *WAN) netem(ctx context.Context) (bool, error) {
	router, _ := w.host(WANRouter)
	if _, err := exec.LookPath("tc"); err != nil {
		return false, nil
	}
	for i, p := range w.places {
		ms := strconv.FormatFloat(float64(p.Delay)/float64(time.Millisecond), 'f', -1, 64) + "ms"
		out, err := w.Exec(ctx, WANRouter, "tc", "qdisc", "add", "dev", routerPort(p.Name), "root", "netem", "delay", ms)
		if err != nil {
			if i == 0 && strings.Contains(string(out), "qdisc kind is unknown") {
				return false, nil
			}
			return false, err
		}
		if _, err := runCmd(ctx, "ip", "netns", "exec", w.lanNS, "tc", "qdisc", "add", "dev", uplinkPort(p.Name), "root", "netem", "delay", ms); err != nil {
			return false, err
		}
		if _, err := runIP(ctx, "-n", router.NS, "route", "add", p.Prefix.Masked().String(), "dev", routerPort(p.Name),
			"src", gateway(p.Prefix).String()); err != nil {
			return false, err
		}
	}
	return true, nil
}

// startDelayLine routes every place's prefix into the TUN device and, for
// packets coming back out of it, out of the place's uplink (policy routing
// on the incoming interface), then starts the goroutine that holds each
// packet for its source's and destination's delays.
func (w *WAN) startDelayLine(ctx context.Context) error {
	router, _ := w.host(WANRouter)
	var f *os.File
	if err := w.Do(WANRouter, func() error {
		var err error
		f, err = openTUN(delayTUN)
		return err
	}); err != nil {
		return fmt.Errorf("delay line: %w", err)
	}
	w.line = newDelayLine(f, w.places, w.log)
	steps := [][]string{
		{"-n", router.NS, "link", "set", delayTUN, "up"},
		{"-n", router.NS, "rule", "add", "iif", delayTUN, "lookup", delayTable, "pref", "100"},
	}
	for _, p := range w.places {
		steps = append(steps,
			[]string{"-n", router.NS, "route", "add", p.Prefix.Masked().String(), "dev", delayTUN},
			[]string{"-n", router.NS, "route", "add", p.Prefix.Masked().String(), "dev", routerPort(p.Name), "src",
				gateway(p.Prefix).String(), "table", delayTable})
	}
	if err := runIPs(ctx, steps); err != nil {
		return err
	}
	return w.Do(WANRouter, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/"+delayTUN+"/rp_filter", []byte("0\n"), 0o644)
	})
}

// CutUplink takes place off the WAN: its uplink's port on the place's
// bridge goes down, so the router's end loses its carrier and whatever it
// sends there is lost, and the place's hosts reach nothing beyond their LAN.
func (w *WAN) CutUplink(place string) error { return w.uplink(place, "down") }

// RestoreUplink undoes CutUplink.
func (w *WAN) RestoreUplink(place string) error { return w.uplink(place, "up") }

func (w *WAN) uplink(place, state string) error {
	if _, err := w.place(place); err != nil {
		return err
	}
	_, err := runIP(context.Background(), "-n", w.lanNS, "link", "set", uplinkPort(place), state)
	return err
}

// Close stops the delay line, then closes the lab.
func (w *WAN) Close() error {
	if w.line != nil {
		w.line.stop()
	}
	return w.Lab.Close()
}

// runCmd runs a program and folds its output into the error, as runIP.
func runCmd(ctx context.Context, argv ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}
