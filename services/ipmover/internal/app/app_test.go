package app

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/dispatchexec"
	"github.com/fanpbx/fan/services/ipmover/internal/dnsexec"
	"github.com/fanpbx/fan/services/ipmover/internal/ipexec"
)

const common = `cluster: lab
node: n1
bus: {url: "nats://127.0.0.1:4222"}
state_file: /var/lib/fan/ipmover.json
`

const ipKeys = `interface: eth0
groups: [{name: pbx, prefixes: [192.0.2.10/32]}]
`

const dnsKeys = `dns:
  group: web
  zone: voip.test
  name: sip.voip.test
  types: [A]
  primary: 127.0.0.1:53
  key: {name: k, secret: c2VjcmV0}
  sites:
    site-a: {a: [192.0.2.10]}
    site-b: {a: [203.0.113.20]}
`

const dispatcherKeys = `dispatcher:
  url: http://127.0.0.1:5071/RPC
  group: pbx
  nodes: {n1: "sip:192.0.2.11:5060"}
`

func parse(t *testing.T, file string) (daemon.Service, error) {
	t.Helper()
	return Parse("test.yaml", []byte(file), slog.New(slog.DiscardHandler), "test")
}

// executor: selects one executor, and the file is read as that executor's
// configuration alone: a key of another executor is refused, naming the
// key and whose it is, and so is an unknown executor.
func TestExecutorSelectsItsOwnKeys(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       any // the service built, or nil when refused
		refusal    string
	}{
		{"ip by default", common + ipKeys, &ipexec.Service{}, ""},
		{"ip", common + "executor: ip\n" + ipKeys, &ipexec.Service{}, ""},
		{"dns", common + "executor: dns\n" + dnsKeys, noRelease{}, ""},
		{"dispatcher", "cluster: lab\nnode: k1\nbus: {url: \"nats://127.0.0.1:4222\"}\nexecutor: dispatcher\n" + dispatcherKeys, noRelease{}, ""},
		{"interface under dns", common + "executor: dns\ninterface: eth0\n" + dnsKeys, nil, "interface: a key of executor ip, not of executor dns"},
		{"bus_loss under dns", common + "executor: dns\nbus_loss: {policy: release}\n" + dnsKeys, nil, "bus_loss: a key of executor ip, not of executor dns"},
		{"dns under ip", common + ipKeys + dnsKeys, nil, "dns: a key of executor dns, not of executor ip"},
		{"groups under dispatcher", "cluster: lab\nnode: k1\nbus: {url: \"nats://127.0.0.1:4222\"}\nexecutor: dispatcher\n" + ipKeys + dispatcherKeys, nil, "a key of executor ip, not of executor dispatcher"},
		{"unknown key", common + ipKeys + "interfaces: eth1\n", nil, "interfaces: unknown key; did you mean interface?"},
		{"unknown executor", common + "executor: carrier-pigeon\n", nil, `unknown executor "carrier-pigeon"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, err := parse(t, tc.file)
			if tc.want == nil {
				if err == nil || !strings.Contains(err.Error(), tc.refusal) {
					t.Fatalf("err = %v, want a refusal saying %q", err, tc.refusal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch tc.want.(type) {
			case *ipexec.Service:
				if _, ok := svc.(*ipexec.Service); !ok {
					t.Fatalf("built %T", svc)
				}
			case noRelease:
				nr, ok := svc.(noRelease)
				if !ok {
					t.Fatalf("built %T", svc)
				}
				_, dns := nr.Service.(*dnsexec.Service)
				_, disp := nr.Service.(*dispatchexec.Service)
				if dns != strings.Contains(tc.file, "executor: dns") || disp != strings.Contains(tc.file, "executor: dispatcher") {
					t.Fatalf("built %T", nr.Service)
				}
			}
		})
	}
}

// Every example configuration in the repository still loads.
func TestExampleConfigsLoad(t *testing.T) {
	files, _ := filepath.Glob("../../../../deploy/*/*/ipmover.yaml")
	more, _ := filepath.Glob("../../../../deploy/*/*/*/ipmover.yaml")
	files = append(files, more...)
	if len(files) == 0 {
		t.Fatal("no example ipmover.yaml found")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(f, b, slog.New(slog.DiscardHandler), "test"); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
