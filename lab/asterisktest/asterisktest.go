// Package asterisktest runs a real Asterisk 22 for a test (FAN_ASTERISK
// names the install; without it the test is skipped), configured as fan
// ships it (deploy/asterisk, through stack.WriteAsteriskEtc), in a
// namespace of its own whose loopback holds the node's address
// (198.51.100.11), the floating one (198.51.100.10) and two phones'
// (198.51.100.51 and .52).
package asterisktest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/lab/peer"
	"github.com/fanpbx/fan/lab/stack"
)

var loopback = []string{"198.51.100.11/32", "198.51.100.10/32", "198.51.100.51/32", "198.51.100.52/32"}

// Node is one Asterisk in its namespace.
type Node struct {
	NS   netlabtest.NS
	Proc *peer.Proc // the running Asterisk, once Start has run
	conf string
	root string
}

// New makes the namespace (named from prefix) and Asterisk's
// configuration from etc, its Shipped and Install filled in; Start runs it.
func New(t *testing.T, prefix string, etc stack.AsteriskEtc) *Node {
	t.Helper()
	root := os.Getenv("FAN_ASTERISK")
	if root == "" {
		t.Skip("FAN_ASTERISK is not set (an Asterisk 22 install, e.g. /opt/asterisk-22)")
	}
	ns := netlabtest.NewNS(t, prefix)
	for _, a := range loopback {
		ns.IP(t, "addr", "add", a, "dev", "lo")
	}
	shipped, err := stack.FindShippedAsterisk()
	if err != nil {
		t.Fatal(err)
	}
	etc.Shipped, etc.Install = shipped, root
	conf, err := stack.WriteAsteriskEtc(t.TempDir(), etc)
	if err != nil {
		t.Fatal(err)
	}
	return &Node{NS: ns, conf: conf, root: root}
}

// Start runs Asterisk in the foreground in the namespace (again, after a
// kill); it is stopped when the test ends.
func (n *Node) Start(t *testing.T) {
	t.Helper()
	n.Proc = peer.MustStart(t, nil, "ip", "netns", "exec", n.NS.Name, filepath.Join(n.root, "sbin", "asterisk"), "-C", n.conf, "-f")
}
