package natsserver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/config/configtest"
)

// serverConf is a nats-server configuration of the shape fanctl
// nats-config writes: a client listener off loopback with TLS, client
// certificates and authorization, and a cluster block with its own tls
// block.
func serverConf(cert, key, ca, clusterCert, clusterKey string) string {
	return fmt.Sprintf(`server_name: nats-1
listen: "0.0.0.0:4222"
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
}
authorization { token: "0123456789abcdef" }
cluster {
  name: fan
  listen: "0.0.0.0:6222"
  tls {
    cert_file: %q
    key_file: %q
    ca_file: %q
    verify: true
  }
}
`, cert, key, ca, clusterCert, clusterKey, ca)
}

// readErrors are the lines of what CheckHost reports, errors and warnings
// told apart as a loader tells them.
func report(t *testing.T, e Config) (warnings []string, errs []string) {
	t.Helper()
	w, err := config.NewDoc("fan-nats.yaml").Report(e.CheckHost(""))
	if err != nil {
		errs = strings.Split(err.Error(), "\n")
	}
	return w, errs
}

// A nats-server configuration is read with nats-server's own parser and
// the files its tls blocks name are checked for what they are; every
// error is reported on its line of that file.
func TestCheckHostReadsTheServerConfiguration(t *testing.T) {
	dir := t.TempDir()
	n := time.Now()
	cert, key := configtest.WriteCert(t, dir, "server", n.Add(-time.Hour), n.Add(400*24*time.Hour))
	_, otherKey := configtest.WriteCert(t, dir, "other", n.Add(-time.Hour), n.Add(400*24*time.Hour))
	expired, expiredKey := configtest.WriteCert(t, dir, "expired", n.Add(-48*time.Hour), n.Add(-time.Hour))
	soon, soonKey := configtest.WriteCert(t, dir, "soon", n.Add(-time.Hour), n.Add(5*24*time.Hour))
	empty := configtest.WriteFile(t, dir, "empty.pem", nil)
	e := func(conf string) Config {
		return Config{StoreDir: filepath.Join(dir, "store"), Listen: "0.0.0.0:4222", ServerName: "nats-1",
			ServerConfig: configtest.WriteFile(t, dir, "nats-server.conf", []byte(conf)),
			Cluster:      Cluster{Name: "fan", Listen: "0.0.0.0:6222"}}
	}
	conf := filepath.Join(dir, "nats-server.conf")

	if w, errs := report(t, e(serverConf(cert, key, cert, cert, key))); len(errs) != 0 || len(w) != 0 {
		t.Fatalf("a good configuration: warnings %q, errors %q", w, errs)
	}

	// A key that is not the certificate's, a zero-byte CA, an expired
	// certificate, and a field nats-server does not know: all of them.
	broken := strings.Replace(serverConf(cert, otherKey, empty, expired, expiredKey), "cluster {", "bogus_field: 1\ncluster {", 1)
	_, errs := report(t, e(broken))
	want := []string{
		conf + ":5: tls.key_file: " + otherKey + " is not the key of the certificate in " + cert + " (tls.cert_file)",
		conf + ":6: tls.ca_file: " + empty + " is empty",
		conf + ":10:1: unknown field \"bogus_field\"",
		conf + ":15: cluster.tls.cert_file: " + expired + `: the certificate "expired" expired on `,
		conf + ":17: cluster.tls.ca_file: " + empty + " is empty",
	}
	if len(errs) != len(want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(errs, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(errs[i], want[i]) {
			t.Errorf("line %d:\n got %s\nwant %s...", i+1, errs[i], want[i])
		}
	}

	// A syntax error is placed on its line.
	_, errs = report(t, e("listen: 0.0.0.0:4222\ncluster {\n  routes: [\n"))
	if len(errs) != 1 || !strings.HasPrefix(errs[0], conf+":") || !strings.Contains(errs[0], "not a valid nats-server configuration") {
		t.Fatalf("syntax error: %q", errs)
	}

	// A certificate that expires soon is a warning, not a refusal.
	w, errs := report(t, e(serverConf(soon, soonKey, cert, cert, key)))
	if len(errs) != 0 || len(w) != 1 || !strings.HasPrefix(w[0], conf+":4: tls.cert_file: "+soon+`: the certificate "soon" expires in 5 days`) {
		t.Fatalf("expiring certificate: warnings %q, errors %q", w, errs)
	}

	// A missing file is refused by the key naming it.
	missing := Config{StoreDir: dir, ServerConfig: filepath.Join(dir, "nope.conf")}
	_, errs = report(t, missing)
	if len(errs) != 1 || errs[0] != "fan-nats.yaml: server_config: "+filepath.Join(dir, "nope.conf")+": no such file or directory" {
		t.Fatalf("missing file: %q", errs)
	}
}

// The listeners are judged as Start judges them, each refusal by
// its key; an address this host does not have is refused too.
func TestCheckHostListeners(t *testing.T) {
	dir := t.TempDir()
	err := (&Config{StoreDir: dir, Listen: "0.0.0.0:4222", ServerName: "n",
		Cluster: Cluster{Name: "fan", Listen: "0.0.0.0:6222"}}).CheckHost("nats")
	var keys []string
	for _, e := range flattenAll(err) {
		var fe *config.FieldError
		if errors.As(e, &fe) && errors.Is(e, bus.ErrInsecure) {
			keys = append(keys, fe.Key)
		}
	}
	if strings.Join(keys, ",") != "nats.listen,nats.cluster.listen" {
		t.Fatalf("insecure listeners: %v", err)
	}
	err = (&Config{StoreDir: dir, Listen: "203.0.113.254:4222", InsecureLab: true}).CheckHost("")
	if err == nil || !strings.HasPrefix(err.Error(), "listen: 203.0.113.254 is not an address of this host") {
		t.Fatalf("foreign address: %v", err)
	}
	file := configtest.WriteFile(t, dir, "store-is-a-file", []byte("x"))
	err = (&Config{StoreDir: file}).CheckHost("")
	if err == nil || err.Error() != "store_dir: "+file+" is not a directory" {
		t.Fatalf("store: %v", err)
	}
	if err := (&Config{StoreDir: filepath.Join(dir, "new"), Listen: "127.0.0.1:4222"}).CheckHost(""); err != nil {
		t.Fatalf("a loopback server: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); err == nil {
		t.Fatal("CheckHost made the store")
	}
}
