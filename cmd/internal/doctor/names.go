package doctor

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// checkNames: the names in every local file agree with each other and with
// the bus. cluster and node are subject tokens: a service with another
// cluster publishes where nobody listens, one with another node speaks for a
// host that is not this one (and the bus refuses it: its identity is this
// host's).
func (r *run) checkNames(b busFacts, groups map[string]*groupInfo) {
	svcs := r.files.services()
	clusters := map[string][]string{}
	var order []string
	add := func(file, cluster string) {
		if _, ok := clusters[cluster]; !ok {
			order = append(order, cluster)
		}
		clusters[cluster] = append(clusters[cluster], file)
	}
	for _, s := range svcs {
		add(s.name+".yaml", s.c.Cluster)
	}
	if r.files.status != nil && r.files.status.Cluster != "" {
		add("status.yaml", r.files.status.Cluster)
	}
	want := r.cluster(b)
	if len(order) > 1 {
		for _, c := range order {
			if c == want {
				continue
			}
			r.out.addf(Error, "names.cluster", strings.Join(clusters[c], ", "), "cluster: "+want+" in "+strings.Join(clusters[c], ", "),
				"cluster %q, while %s say %q: its events go to subjects nobody of this cluster reads", c, strings.Join(clusters[want], ", "), want)
		}
	} else if want != "" {
		r.out.addf(OK, "names.cluster", "", "", "%q in every file", want)
	}
	if b.statusErr == "" && len(b.clusters) > 0 && !slices.Contains(b.clusters, want) {
		r.out.addf(Error, "names.cluster", "the bus", "cluster: in every file must be the arbiter's: one of "+strings.Join(b.clusters, ", "),
			"no group of cluster %q on the bus; it has groups of %s", want, strings.Join(b.clusters, ", "))
	}

	nodes := map[string][]string{}
	var norder []string
	for _, s := range svcs {
		if _, ok := nodes[s.c.Node]; !ok {
			norder = append(norder, s.c.Node)
		}
		nodes[s.c.Node] = append(nodes[s.c.Node], s.name+".yaml")
	}
	node := majority(norder, nodes, func(n string) bool { return r.files.arbiter != nil && r.files.arbiter.Node == n })
	if len(norder) > 1 {
		for _, n := range norder {
			if n == node {
				continue
			}
			r.out.addf(Error, "names.node", strings.Join(nodes[n], ", "), "node: "+node+" in "+strings.Join(nodes[n], ", "),
				"node %q, while %s say %q: every service of a host speaks as the same node, and the bus lets each identity speak only for its own host", n, strings.Join(nodes[node], ", "), node)
		}
	} else if node != "" {
		r.out.addf(OK, "names.node", "", "", "%q in every file", node)
	}

	if !r.files.isPBX() {
		return
	}
	if len(groups) == 0 {
		why := b.statusErr
		if why == "" {
			why = "the bus has no group status record of this cluster yet (the arbiter has not run)"
		}
		r.out.addf(Skipped, "names.group", "", "", "the arbiter's groups are not known here: no arbiter.yaml on this host, and %s", why)
		return
	}
	known := sortedKeys(groups)
	used := map[string]string{} // group -> where this host names it
	if rp := r.files.replicator; rp != nil && rp.Group != "" {
		used[rp.Group] = "replicator.yaml group"
	}
	if ip := r.files.ipmover; ip != nil {
		for i, g := range ip.Groups {
			if _, ok := used[g.Name]; !ok {
				used[g.Name] = fmt.Sprintf("ipmover.yaml groups[%d]", i)
			}
		}
	}
	for _, name := range sortedKeys(used) {
		g, ok := groups[name]
		where := used[name]
		if !ok {
			r.out.addf(Error, "names.group", where+" "+name, "name one of the arbiter's groups: "+strings.Join(known, ", "),
				"%q is not a group of the arbiter (its groups: %s)", name, strings.Join(known, ", "))
			continue
		}
		if !g.has(node) {
			r.out.addf(Error, "names.group", where+" "+name,
				fmt.Sprintf("add %s to groups[%s].nodes in the arbiter's arbiter.yaml on every arbiter host (the witness's and the standbys')", node, name),
				"the arbiter's group %s (%s) does not list this node %q (it lists %s): this node is never given it", name, g.from(), node, strings.Join(g.Nodes, ", "))
			continue
		}
		r.out.addf(OK, "names.group", where+" "+name, "", "a group of the arbiter (%s) that lists %s", g.from(), node)
	}
	if rp := r.files.replicator; rp != nil && rp.Group == "" {
		r.out.addf(Error, "names.group", "replicator.yaml group", "group: <the arbiter's group> in "+filepath.Join(r.o.Etc, "replicator.yaml"), "no group: the replicator does not know whose files are the source")
	}
}

// majority is the value most files give; on a tie the one prefer says
// (nil: the first).
func majority(order []string, by map[string][]string, prefer func(string) bool) string {
	best := ""
	for _, v := range order {
		switch {
		case v == "":
		case best == "", len(by[v]) > len(by[best]):
			best = v
		case len(by[v]) == len(by[best]) && prefer != nil && prefer(v) && !prefer(best):
			best = v
		}
	}
	return best
}

// cluster is the cluster this host's files agree on: the name most of them
// give; on a tie the one the bus has groups of, else the arbiter's.
func (r *run) cluster(b busFacts) string {
	by := map[string][]string{}
	var order []string
	for _, s := range r.files.services() {
		if _, ok := by[s.c.Cluster]; !ok {
			order = append(order, s.c.Cluster)
		}
		by[s.c.Cluster] = append(by[s.c.Cluster], s.name)
	}
	return majority(order, by, func(c string) bool {
		if slices.Contains(b.clusters, c) {
			return true
		}
		return len(b.clusters) == 0 && r.files.arbiter != nil && r.files.arbiter.Cluster == c
	})
}
