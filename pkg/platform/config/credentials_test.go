package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
)

// writeCert writes a self-signed certificate valid from notBefore to
// notAfter and its key, and returns their paths.
func writeCert(t *testing.T, dir, name string, notBefore, notAfter time.Time) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: notBefore, NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, name+"-cert.pem"), filepath.Join(dir, name+"-key.pem")
	write(t, certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	write(t, keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	return certPath, keyPath
}

func write(t *testing.T, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func seed(t *testing.T, kp nkeys.KeyPair, err error) []byte {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	s, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// userCreds is a credentials file as nsc writes one: a user JWT (its
// signature is the server's business, not this check's) and the seed.
func userCreds(t *testing.T) []byte {
	kp, err := nkeys.CreateUser()
	s := seed(t, kp, err)
	pub, _ := kp.PublicKey()
	enc := base64.RawURLEncoding.EncodeToString
	jwt := enc([]byte(`{"typ":"JWT","alg":"ed25519-nkey"}`)) + "." + enc([]byte(`{"sub":"`+pub+`"}`)) + "." + enc([]byte("sig"))
	return []byte(fmt.Sprintf("-----BEGIN NATS USER JWT-----\n%s\n------END NATS USER JWT------\n\n"+
		"************************* IMPORTANT *************************\n\n"+
		"-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n", jwt, s))
}

func TestCredentialFiles(t *testing.T) {
	dir := t.TempDir()
	user, err := nkeys.CreateUser()
	userSeed := write(t, filepath.Join(dir, "user.nk"), seed(t, user, err))
	acct, err := nkeys.CreateAccount()
	acctSeed := write(t, filepath.Join(dir, "account.nk"), seed(t, acct, err))
	empty := write(t, filepath.Join(dir, "empty"), nil)
	blank := write(t, filepath.Join(dir, "blank"), []byte(" \n\n"))
	garbage := write(t, filepath.Join(dir, "garbage"), []byte("SUhunter2-not-a-seed\n"))
	creds := write(t, filepath.Join(dir, "user.creds"), userCreds(t))

	n := now()
	good, goodKey := writeCert(t, dir, "good", n.Add(-time.Hour), n.Add(400*24*time.Hour))
	expired, _ := writeCert(t, dir, "expired", n.Add(-48*time.Hour), n.Add(-24*time.Hour))
	soon, _ := writeCert(t, dir, "soon", n.Add(-time.Hour), n.Add(10*24*time.Hour+time.Hour))
	future, _ := writeCert(t, dir, "future", n.Add(24*time.Hour), n.Add(48*time.Hour))
	_, otherKey := writeCert(t, dir, "other", n.Add(-time.Hour), n.Add(400*24*time.Hour))
	chain := write(t, filepath.Join(dir, "chain.pem"), append(must(os.ReadFile(good)), must(os.ReadFile(expired))...))

	for _, c := range []struct {
		name string
		err  error
		want string // "" = accepted; "warning: ..." = only a warning
	}{
		{"user seed", NKeySeedFile("bus.nkey_seed", userSeed), ""},
		{"unset seed", NKeySeedFile("bus.nkey_seed", ""), ""},
		{"zero-byte seed", NKeySeedFile("bus.nkey_seed", empty), "bus.nkey_seed: " + empty + " is empty"},
		{"blank seed", NKeySeedFile("bus.nkey_seed", blank), "bus.nkey_seed: " + blank + " holds only white space"},
		{"not a seed", NKeySeedFile("bus.nkey_seed", garbage), "bus.nkey_seed: " + garbage + " is not an nkey seed"},
		{"account seed", NKeySeedFile("bus.nkey_seed", acctSeed), "bus.nkey_seed: " + acctSeed + " is the seed of an account, want a user's"},
		{"missing seed", NKeySeedFile("bus.nkey_seed", filepath.Join(dir, "nope")), "bus.nkey_seed: " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{"creds", CredsFile("bus.creds", creds), ""},
		{"seed as creds", CredsFile("bus.creds", userSeed), "bus.creds: " + userSeed + " is not a NATS credentials file"},
		{"zero-byte creds", CredsFile("bus.creds", empty), "bus.creds: " + empty + " is empty"},
		{"certificate", CertFile("bus.tls.cert", good), ""},
		{"zero-byte certificate", CertFile("bus.tls.cert", empty), "bus.tls.cert: " + empty + " is empty"},
		{"key as certificate", CertFile("bus.tls.cert", goodKey), "bus.tls.cert: " + goodKey + ": not a PEM certificate"},
		{"expired certificate", CertFile("bus.tls.cert", expired), "bus.tls.cert: " + expired + `: the certificate "expired" expired on `},
		{"certificate not yet valid", CertFile("bus.tls.cert", future), "bus.tls.cert: " + future + `: the certificate "future" is not valid before `},
		{"certificate expiring soon", CertFile("bus.tls.cert", soon), "warning: bus.tls.cert: " + soon + `: the certificate "soon" expires in 11 days`},
		{"CA", CAFile("bus.tls.ca", good), ""},
		{"CA with an expired one", CAFile("bus.tls.ca", chain), "bus.tls.ca: " + chain + `: the certificate "expired" expired`},
		{"zero-byte CA", CAFile("bus.tls.ca", empty), "bus.tls.ca: " + empty + " is empty"},
		{"key pair", KeyPairFiles("bus.tls.cert", good, "bus.tls.key", goodKey), ""},
		{"mismatched key", KeyPairFiles("bus.tls.cert", good, "bus.tls.key", otherKey), "bus.tls.key: " + otherKey + " is not the key of the certificate in " + good + " (bus.tls.cert)"},
		{"certificate as key", KeyPairFiles("bus.tls.cert", good, "bus.tls.key", good), "bus.tls.key: " + good + ": not a PEM private key"},
		{"zero-byte key", KeyPairFiles("bus.tls.cert", good, "bus.tls.key", empty), "bus.tls.key: " + empty + " is empty"},
	} {
		var fe *FieldError
		switch {
		case c.want == "" && c.err != nil:
			t.Errorf("%s: refused: %v", c.name, c.err)
		case c.want == "":
		case c.err == nil:
			t.Errorf("%s: accepted, want %q", c.name, c.want)
		case !errors.As(c.err, &fe):
			t.Errorf("%s: %v is not a FieldError", c.name, c.err)
		case strings.HasPrefix(c.want, "warning: "):
			if !fe.Warning || !strings.HasPrefix(c.err.Error(), strings.TrimPrefix(c.want, "warning: ")) {
				t.Errorf("%s: got %v (warning %v), want the warning %q", c.name, c.err, fe.Warning, c.want)
			}
		case fe.Warning || !strings.HasPrefix(c.err.Error(), c.want):
			t.Errorf("%s: got %v (warning %v), want %q", c.name, c.err, fe.Warning, c.want)
		}
		// A credential's contents never appear in a message.
		if c.err != nil && (strings.Contains(c.err.Error(), "hunter2") || strings.Contains(c.err.Error(), string(must(os.ReadFile(userSeed))))) {
			t.Errorf("%s: the message shows the file's contents: %v", c.name, c.err)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestHostNames(t *testing.T) {
	if err := InterfaceExists("interface", "lo"); err != nil {
		t.Fatalf("lo: %v", err)
	}
	err := InterfaceExists("interface", "eth-not-here0")
	if err == nil || !strings.HasPrefix(err.Error(), "interface: eth-not-here0 does not exist on this host (it has: ") || !strings.Contains(err.Error(), "lo") {
		t.Fatalf("missing interface: %v", err)
	}
	for _, ok := range []string{"127.0.0.1:9101", "0.0.0.0:4222", "[::]:4222", "localhost:1", "nats.example.net:4222", "nonsense"} {
		if err := ListenLocal("http_listen", ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	// An address of this host is accepted, and one that is not (from a
	// documentation range no host here holds) is refused naming those it has.
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			if err := ListenLocal("http_listen", net.JoinHostPort(ipn.IP.String(), "9101")); err != nil {
				t.Errorf("this host's %s: %v", ipn.IP, err)
			}
		}
	}
	err = ListenLocal("http_listen", "203.0.113.254:9101")
	if err == nil || !strings.HasPrefix(err.Error(), "http_listen: 203.0.113.254 is not an address of this host") {
		t.Fatalf("foreign address: %v", err)
	}
}
