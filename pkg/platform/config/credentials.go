package config

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
)

// The files a configuration names are checked for what they are, not only
// that they are there: a truncated seed or a certificate that expired
// fails the unit's ExecStartPre naming its key, not the bus connection
// minutes later. No message shows what a credential file holds.

// ExpiryWarning is how long before a certificate expires its check warns.
const ExpiryWarning = 30 * 24 * time.Hour

// now is the clock certificates are checked against.
var now = time.Now

// readNonEmpty reads a file FileReadable accepts.
func readNonEmpty(key, path string) ([]byte, error) {
	if err := FileReadable(key, path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, Errf(key, "%s: %w", path, describe(err))
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, Errf(key, "%s holds only white space", path)
	}
	return b, nil
}

// NKeySeedFile requires path to hold a NATS user's nkey seed (SU...), the
// identity a fan service connects with.
func NKeySeedFile(key, path string) error {
	if path == "" {
		return nil
	}
	b, err := readNonEmpty(key, path)
	if err != nil {
		return err
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return Errf(key, "%s is not an nkey seed (%v)", path, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return Errf(key, "%s is not an nkey seed (%v)", path, err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return Errf(key, "%s is the seed of %s, want a user's (its seed starts with SU)", path, nkeyKind(pub))
	}
	return nil
}

func nkeyKind(pub string) string {
	switch nkeys.Prefix(pub) {
	case nkeys.PrefixByteOperator:
		return "an operator"
	case nkeys.PrefixByteAccount:
		return "an account"
	case nkeys.PrefixByteServer:
		return "a server"
	case nkeys.PrefixByteCluster:
		return "a cluster"
	}
	return "another kind of key"
}

// CredsFile requires path to be a NATS credentials file: a user's JWT and
// the user's nkey seed.
func CredsFile(key, path string) error {
	if path == "" {
		return nil
	}
	b, err := readNonEmpty(key, path)
	if err != nil {
		return err
	}
	jwt, err := nkeys.ParseDecoratedJWT(b)
	if err != nil || !userJWT(jwt) {
		return Errf(key, "%s is not a NATS credentials file: no user JWT in it", path)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return Errf(key, "%s is not a NATS credentials file: no user nkey seed in it (%v)", path, err)
	}
	kp.Wipe()
	return nil
}

// userJWT reports whether s is shaped like a JWT whose subject is a user's
// public key (the signature is the server's to check).
func userJWT(s string) bool {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 3 {
		return false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return false
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	return json.Unmarshal(payload, &claims) == nil && nkeys.IsValidPublicUserKey(claims.Sub)
}

// CertFile requires path to hold a PEM X.509 certificate (the first is
// this host's, any after it the chain) that is valid now: expired is an
// error, expiring within ExpiryWarning a warning.
func CertFile(key, path string) error {
	_, err := certFile(key, path)
	return err
}

func certFile(key, path string) (*x509.Certificate, error) {
	if path == "" {
		return nil, nil
	}
	b, err := readNonEmpty(key, path)
	if err != nil {
		return nil, err
	}
	certs, err := parseCerts(b)
	if err != nil {
		return nil, Errf(key, "%s: %v", path, err)
	}
	return certs[0], validity(key, path, certs[0])
}

// CertValidity is only the validity part of CertFile, for a certificate
// whose parsing is checked elsewhere: expired or not yet valid is an error,
// expiring within ExpiryWarning a warning; a file that does not parse is
// not its business.
func CertValidity(key, path string) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	certs, err := parseCerts(b)
	if err != nil {
		return nil
	}
	return validity(key, path, certs[0])
}

// CAFile requires path to hold one or more PEM X.509 certificates (the
// authorities a peer's certificate is checked against), each valid now.
func CAFile(key, path string) error {
	if path == "" {
		return nil
	}
	b, err := readNonEmpty(key, path)
	if err != nil {
		return err
	}
	certs, err := parseCerts(b)
	if err != nil {
		return Errf(key, "%s: %v", path, err)
	}
	var errs []error
	for _, c := range certs {
		errs = append(errs, validity(key, path, c))
	}
	return Join(errs...)
}

// KeyPairFiles checks a certificate (CertFile), its private key (a PEM
// private key), and that the key is the certificate's.
func KeyPairFiles(certKey, certPath, keyKey, keyPath string) error {
	cert, certErr := certFile(certKey, certPath)
	if keyPath == "" {
		return certErr
	}
	b, err := readNonEmpty(keyKey, keyPath)
	if err != nil {
		return Join(certErr, err)
	}
	priv, err := parsePrivateKey(b)
	if err != nil {
		return Join(certErr, Errf(keyKey, "%s: %v", keyPath, err))
	}
	if cert == nil {
		return certErr
	}
	pub, ok := priv.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return Join(certErr, Errf(keyKey, "%s is not the key of the certificate in %s (%s)", keyPath, certPath, certKey))
	}
	return certErr
}

// parseCerts reads every CERTIFICATE block of a PEM file; anything else in
// it (a key) is left alone.
func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d does not parse: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("not a PEM certificate (no BEGIN CERTIFICATE block)")
	}
	return out, nil
}

// validity refuses a certificate that has expired or is not valid yet, and
// warns of one that expires soon.
func validity(key, path string, c *x509.Certificate) error {
	t := now()
	name := c.Subject.CommonName
	if name == "" {
		name = c.Subject.String()
	}
	switch {
	case t.After(c.NotAfter):
		return Errf(key, "%s: the certificate %q expired on %s", path, name, c.NotAfter.UTC().Format(time.DateTime+" MST"))
	case t.Before(c.NotBefore):
		return Errf(key, "%s: the certificate %q is not valid before %s (this host's clock says %s)",
			path, name, c.NotBefore.UTC().Format(time.DateTime+" MST"), t.UTC().Format(time.DateTime+" MST"))
	case c.NotAfter.Sub(t) < ExpiryWarning:
		days := int(math.Ceil(c.NotAfter.Sub(t).Hours() / 24))
		in := fmt.Sprintf("%d days", days)
		if days == 1 {
			in = "a day"
		}
		return Warnf(key, "%s: the certificate %q expires in %s (%s): renew it", path, name, in, c.NotAfter.UTC().Format(time.DateTime+" MST"))
	}
	return nil
}

// parsePrivateKey reads the first PEM private key (PKCS #8, PKCS #1 or
// SEC 1), the forms crypto/tls loads.
func parsePrivateKey(b []byte) (crypto.Signer, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("not a PEM private key (no BEGIN ... PRIVATE KEY block)")
		}
		if !strings.HasSuffix(blk.Type, "PRIVATE KEY") {
			continue
		}
		if k, err := x509.ParsePKCS8PrivateKey(blk.Bytes); err == nil {
			switch k := k.(type) {
			case *rsa.PrivateKey, *ecdsa.PrivateKey, ed25519.PrivateKey:
				return k.(crypto.Signer), nil
			}
			return nil, fmt.Errorf("a private key of a kind TLS does not use (%T)", k)
		}
		if k, err := x509.ParsePKCS1PrivateKey(blk.Bytes); err == nil {
			return k, nil
		}
		if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
			return k, nil
		}
		return nil, fmt.Errorf("the %s block does not parse", blk.Type)
	}
}
