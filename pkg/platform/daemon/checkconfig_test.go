package daemon

import (
	"bytes"
	"context"
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

func writeFile(t *testing.T, path string, b []byte) string {
	t.Helper()
	return configtest.WriteFile(t, filepath.Dir(path), filepath.Base(path), b)
}

// writeUserSeed writes a fresh NATS user seed, as fanctl nats-config does.
func writeUserSeed(t *testing.T, dir, name string) string {
	return configtest.WriteUserSeed(t, dir, name)
}

// writeCertPair writes a self-signed certificate valid until notAfter and
// its key.
func writeCertPair(t *testing.T, dir, name string, notAfter time.Time) (certPath, keyPath string) {
	return configtest.WriteCert(t, dir, name, notAfter.Add(-400*24*time.Hour), notAfter)
}

// hasLine reports whether one of err's errors reads prefix....
func hasLine(err error, prefix string) bool {
	if err == nil {
		return false
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		if strings.HasPrefix(line, prefix) {
			return true
		}
	}
	return false
}

// testConfig is a service's configuration as the services write theirs:
// Common inline (and with it CheckHost), a key of its own.
type testConfig struct {
	Common `yaml:",inline"`
	Rise   int `yaml:"rise"`
}

func (c *testConfig) Validate() error {
	return config.Join(c.Common.Validate(), config.IntIn("rise", c.Rise, 1, 10))
}

type doneService struct{}

func (doneService) Run(context.Context) error { return nil }

// loadingBuild is a Builder as the services write theirs; it remembers the
// path it was given.
func loadingBuild(path *string) Builder {
	return func(o Options) (Service, error) {
		*path = o.ConfigPath
		var c testConfig
		if err := LoadConfig(o, &c); err != nil {
			return nil, err
		}
		return doneService{}, nil
	}
}

// run calls Run with its output captured.
func run(t *testing.T, args []string, build Builder) (code int, out, errOut string) {
	t.Helper()
	var o, e bytes.Buffer
	stdout, stderr = &o, &e
	t.Cleanup(func() { stdout, stderr = os.Stdout, os.Stderr })
	code = Run(args, "fan-test", "t", "/nonexistent/default.yaml", build)
	return code, o.String(), e.String()
}

// -check-config reports every error of the file, each on its own line with
// the file, the line and the key, then how many; the files the bus section
// names are checked for what they are.
func TestCheckConfigReportsEveryError(t *testing.T) {
	dir := t.TempDir()
	empty := writeFile(t, filepath.Join(dir, "svc.nk"), nil)
	expiredCA, _ := writeCertPair(t, dir, "ca", time.Now().Add(-24*time.Hour))
	cert, _ := writeCertPair(t, dir, "svc", time.Now().Add(365*24*time.Hour))
	_, otherKey := writeCertPair(t, dir, "other", time.Now().Add(365*24*time.Hour))
	path := writeFile(t, filepath.Join(dir, "svc.yaml"), fmt.Appendf(nil, `cluster: lab
node: n1
bus:
  url: nats://127.0.0.1:4222
  nkey_seed: %s
  tls:
    ca: %s
    cert: %s
    key: %s
http_listen: 127.0.0.1:9101
rsie: 2
rise: two
shutdown_timeout: -1s
`, empty, expiredCA, cert, otherKey))
	var got string
	code, out, errOut := run(t, []string{"-check-config", path}, loadingBuild(&got))
	want := []string{
		path + ":5: bus.nkey_seed: " + empty + " is empty",
		path + ":7: bus.tls.ca: " + expiredCA + `: the certificate "ca" expired on `,
		path + ":9: bus.tls.key: " + otherKey + " is not the key of the certificate in " + cert + " (bus.tls.cert)",
		path + ":11: rsie: unknown key; did you mean rise?",
		path + `:12: rise: want a whole number, got "two"`,
		path + ":13: shutdown_timeout: must be between 100ms and 5m0s, got -1s",
		"fan-test: configuration " + path + " refused: 6 errors",
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code != 1 || out != "" || len(lines) != len(want) {
		t.Fatalf("exit %d, stdout %q, stderr:\n%s", code, out, errOut)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d:\n got %s\nwant %s...", i+1, lines[i], w)
		}
	}
	// The service's start reads the file with the same loader and refuses
	// it the same way.
	code, _, startErr := run(t, []string{"-config", path}, loadingBuild(&got))
	if code != 1 || startErr != errOut {
		t.Errorf("start: exit %d, stderr\n%s\nwant the same as -check-config's", code, startErr)
	}
}

// A certificate that expires within 30 days is a warning: printed, the
// file still valid.
func TestCheckConfigWarnsOfExpiringCertificate(t *testing.T) {
	dir := t.TempDir()
	seed := writeUserSeed(t, dir, "svc.nk")
	cert, key := writeCertPair(t, dir, "svc", time.Now().Add(10*24*time.Hour))
	path := writeFile(t, filepath.Join(dir, "svc.yaml"), fmt.Appendf(nil,
		"cluster: lab\nnode: n1\nbus:\n  url: nats://127.0.0.1:4222\n  nkey_seed: %s\n  tls: {ca: %s, cert: %s, key: %s}\nrise: 2\n", seed, cert, cert, key))
	var got string
	code, out, errOut := run(t, []string{"-check-config", path}, loadingBuild(&got))
	if code != 0 || !strings.Contains(out, "is valid, with 2 warnings") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, k := range []string{"bus.tls.ca", "bus.tls.cert"} {
		if !strings.Contains(errOut, "warning: "+path+":6: "+k+": "+cert+`: the certificate "svc" expires in 10 days`) {
			t.Errorf("no warning for %s in:\n%s", k, errOut)
		}
	}
}

// "-check-config PATH" checks PATH wherever the flags are, and a leftover
// argument is refused by name with exit 2, before anything is read.
func TestCheckConfigArgumentOrder(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the path checked, or the refusal
		code int
	}{
		{[]string{"-check-config", "new.yaml"}, "new.yaml", 0},
		{[]string{"-check-config", "new.yaml", "-log-level", "debug"}, "new.yaml", 0},
		{[]string{"-check-config", "new.yaml", "-log-level=debug", "-log-format", "text"}, "new.yaml", 0},
		{[]string{"-log-level", "debug", "-check-config", "new.yaml"}, "new.yaml", 0},
		{[]string{"new.yaml", "-check-config"}, "new.yaml", 0},
		{[]string{"-log-level", "debug", "new.yaml", "-check-config", "-log-format", "text"}, "new.yaml", 0},
		{[]string{"-config", "new.yaml", "-check-config"}, "new.yaml", 0},
		{[]string{"-check-config", "-config", "new.yaml"}, "new.yaml", 0},
		{[]string{"-check-config", "-config", "new.yaml", "new.yaml"}, "new.yaml", 0},
		{[]string{"-check-config", "--", "-odd-name.yaml"}, "-odd-name.yaml", 0},
		{[]string{"-check-config"}, "/nonexistent/default.yaml", 0},
		{[]string{"-check-config", "a.yaml", "b.yaml"}, `fan-test: unexpected argument "b.yaml"`, 2},
		{[]string{"-check-config", "a.yaml", "-log-level", "debug", "b.yaml"}, `fan-test: unexpected argument "b.yaml"`, 2},
		{[]string{"-config", "a.yaml", "-check-config", "b.yaml"}, `fan-test: unexpected argument "b.yaml" (-config already names a.yaml)`, 2},
		{[]string{"stray.yaml"}, `fan-test: unexpected argument "stray.yaml"`, 2},
		{[]string{"-config", "a.yaml", "stray"}, `fan-test: unexpected argument "stray"`, 2},
		{[]string{"-release-all", "stray"}, `fan-test: unexpected argument "stray"`, 2},
	} {
		var got string
		build := func(o Options) (Service, error) {
			got = o.ConfigPath
			return doneService{}, nil
		}
		code, out, errOut := run(t, tc.args, build)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.args, code, tc.code, errOut)
			continue
		}
		if tc.code == 0 {
			if got != tc.want || !strings.Contains(out, "configuration "+tc.want+" is valid") {
				t.Errorf("%q: checked %q (stdout %q), want %q", tc.args, got, out, tc.want)
			}
			continue
		}
		if got != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, tc.want) {
			t.Errorf("%q: built %q, stderr %q, want one line %q...", tc.args, got, errOut, tc.want)
		}
	}
}

// Every file the bus section names is checked for what it is, each
// problem named by its key.
func TestCheckFilesWhatTheFilesAre(t *testing.T) {
	dir := t.TempDir()
	seed := writeUserSeed(t, dir, "svc.nk")
	empty := writeFile(t, filepath.Join(dir, "empty"), nil)
	cert, key := writeCertPair(t, dir, "svc", time.Now().Add(365*24*time.Hour))
	expired, expiredKey := writeCertPair(t, dir, "old", time.Now().Add(-time.Hour))
	_, otherKey := writeCertPair(t, dir, "other", time.Now().Add(365*24*time.Hour))
	for name, tc := range map[string]struct {
		set  func(c *Common)
		want string
	}{
		"all good":               {func(c *Common) {}, ""},
		"zero-byte seed":         {func(c *Common) { c.Bus.NKeySeed = empty }, "bus.nkey_seed: " + empty + " is empty"},
		"certificate as seed":    {func(c *Common) { c.Bus.NKeySeed = cert }, "bus.nkey_seed: " + cert + " is not an nkey seed"},
		"zero-byte certificate":  {func(c *Common) { c.Bus.TLS.Cert = empty }, "bus.tls.cert: " + empty + " is empty"},
		"zero-byte CA":           {func(c *Common) { c.Bus.TLS.CA = empty }, "bus.tls.ca: " + empty + " is empty"},
		"mismatched key":         {func(c *Common) { c.Bus.TLS.Key = otherKey }, "bus.tls.key: " + otherKey + " is not the key of the certificate in " + cert},
		"expired certificate":    {func(c *Common) { c.Bus.TLS.Cert, c.Bus.TLS.Key = expired, expiredKey }, "bus.tls.cert: " + expired + `: the certificate "old" expired on`},
		"seed as creds":          {func(c *Common) { c.Bus.NKeySeed, c.Bus.Creds = "", seed }, "bus.creds: " + seed + " is not a NATS credentials file"},
		"zero-byte system seed":  {func(c *Common) { c.Bus.System = &bus.SystemAccount{NKeySeed: empty} }, "bus.system.nkey_seed: " + empty + " is empty"},
		"http_listen not here":   {func(c *Common) { c.HTTPListen = "203.0.113.254:9101" }, "http_listen: 203.0.113.254 is not an address of this host"},
		"http_listen everywhere": {func(c *Common) { c.HTTPListen = "0.0.0.0:9101" }, ""},
	} {
		c := Common{Cluster: "lab", Node: "n1"}
		c.Bus.URL, c.Bus.NKeySeed, c.Bus.TLS.CA, c.Bus.TLS.Cert, c.Bus.TLS.Key = "nats://127.0.0.1:4222", seed, cert, cert, key
		tc.set(&c)
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: Validate: %v", name, err)
		}
		err := c.CheckHost()
		var fe *config.FieldError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", name, err)
		case tc.want != "" && (!errors.As(err, &fe) || !hasLine(err, tc.want)):
			t.Errorf("%s: %v, want %q...", name, err, tc.want)
		}
	}
}

type releasing struct{ released *bool }

func (releasing) Run(context.Context) error { return nil }

func (r releasing) ReleaseAll(context.Context) error {
	*r.released = true
	return nil
}

// -release-all (the ipmover's ExecStopPost) must release what the node
// holds even when what the file names on the host is no longer right: an
// empty seed or an expired certificate refuses a start, never a release.
func TestReleaseAllSkipsHostChecks(t *testing.T) {
	dir := t.TempDir()
	empty := writeFile(t, filepath.Join(dir, "svc.nk"), nil)
	path := writeFile(t, filepath.Join(dir, "svc.yaml"), fmt.Appendf(nil,
		"cluster: lab\nnode: n1\nbus: {url: \"nats://127.0.0.1:4222\", nkey_seed: %s}\nrise: 2\n", empty))
	var released bool
	build := func(o Options) (Service, error) {
		var c testConfig
		if err := LoadConfig(o, &c); err != nil {
			return nil, err
		}
		return releasing{&released}, nil
	}
	if code, _, errOut := run(t, []string{"-config", path, "-release-all"}, build); code != 0 || !released {
		t.Fatalf("-release-all: exit %d, released %v: %s", code, released, errOut)
	}
	if code, _, errOut := run(t, []string{"-config", path, "-check-config"}, build); code != 1 || !strings.Contains(errOut, "bus.nkey_seed: "+empty+" is empty") {
		t.Fatalf("-check-config: exit %d: %s", code, errOut)
	}
}
