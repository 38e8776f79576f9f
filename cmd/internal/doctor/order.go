package doctor

import (
	"fmt"
	"slices"
	"strings"
)

// checkOrder: a service's bus.url lists its own host's server first, then
// the witness's (the server the arbiter's bus.leader_servers names first).
// fan dials them in that order; with another order a PBX host's crash can
// take the bus of the services that must report it, and failovers take
// seconds instead of half of one (deploy/systemd/README.md, section 0).
// Which server a URL reaches is what its INFO says (the server's name),
// not what the URL looks like.
func (r *run) checkOrder(id identity, cs []connection) {
	if len(cs) < 2 {
		return
	}
	local := ""
	if ls, err := r.files.localServer(); err == nil {
		local = ls.Name
	}
	// The witness is the one server the arbiter keeps the raft leaders on
	// (the witness shape); with several (three NATS hosts apart from the
	// PBX hosts) there is none to list second.
	witness := ""
	if a := r.files.arbiter; a != nil && len(a.Bus.LeaderServers) == 1 {
		witness = a.Bus.LeaderServers[0]
	}
	subject := id.name + ".yaml bus.url"
	if local == "" && witness == "" {
		r.out.addf(Skipped, "order.bus-url", subject, "",
			"neither this host's server (nats.yaml server_name) nor a witness's (arbiter.yaml bus.leader_servers naming one server) is known here")
		return
	}
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.name
	}
	var want []string
	if local != "" {
		want = append(want, local)
	}
	if witness != "" && witness != local {
		want = append(want, witness)
	}
	for i, w := range want {
		if i >= len(names) {
			break
		}
		if names[i] == "" {
			r.out.addf(Skipped, "order.bus-url", subject, "", "entry %d (%s) was not reached: its server is not known", i+1, cs[i].url)
			return
		}
		if names[i] == w {
			continue
		}
		r.out.addf(Error, "order.bus-url", subject, "bus.url: "+suggestOrder(cs, want)+" in "+id.file,
			"lists %s (by the servers' names); %s must come first: fan dials them in this order, and a service that sits on another PBX host's server loses the bus when that host crashes, so the failover it should report waits for the dead connection (by hand, 3 of 5 crashes of the host every service listed first took 5.4 to 12.6 s to fail over, against 0.51 to 0.56 s in this order)",
			describeNames(names, cs), whatFirst(local, witness))
		return
	}
	r.out.addf(OK, "order.bus-url", subject, "", "%s: %s", describeNames(names, cs), whatFirst(local, witness))
}

func whatFirst(local, witness string) string {
	switch {
	case local != "" && witness != "" && witness != local:
		return fmt.Sprintf("this host's server %s, then the witness's %s", local, witness)
	case local != "":
		return fmt.Sprintf("this host's server %s", local)
	}
	return fmt.Sprintf("the witness's server %s", witness)
}

func describeNames(names []string, cs []connection) string {
	var out []string
	for i, n := range names {
		if n == "" {
			n = "? (" + cs[i].url + ")"
		}
		out = append(out, n)
	}
	return strings.Join(out, ", ")
}

// suggestOrder is bus.url with the wanted servers first, the rest in their
// order.
func suggestOrder(cs []connection, want []string) string {
	var out []string
	for _, w := range want {
		if i := slices.IndexFunc(cs, func(c connection) bool { return c.name == w }); i >= 0 {
			out = append(out, cs[i].url)
		}
	}
	for _, c := range cs {
		if !slices.Contains(out, c.url) {
			out = append(out, c.url)
		}
	}
	return strings.Join(out, ",")
}
