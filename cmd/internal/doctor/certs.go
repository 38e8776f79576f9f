package doctor

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
)

// renewSoon is how far ahead an expiry is a warning.
const renewSoon = 30 * 24 * time.Hour

const renewFix = "fanctl nats-config --cluster-file cluster.yaml --out fan-bus --renew on the admin's machine, copy the *-cert.pem files to /etc/fan/bus, restart the services (deploy/systemd/README.md, Certificate renewal)"

// checkCredentials checks a service's bus identity files without the
// network: the nkey seed is a seed, the certificate and key belong
// together, chain to the CA and are valid for more than 30 days. false
// means connecting cannot work.
func (r *run) checkCredentials(s service) bool {
	cfg := s.c.Bus
	label := s.name + "@" + s.c.Node
	usable := true
	if cfg.NKeySeed != "" {
		b, err := os.ReadFile(cfg.NKeySeed)
		var pub string
		if err == nil {
			var kp nkeys.KeyPair
			if kp, err = nkeys.ParseDecoratedNKey(b); err == nil {
				pub, err = kp.PublicKey()
				kp.Wipe()
			}
		}
		if err != nil {
			usable = false
			r.out.addf(Error, "bus.nkey", label+" bus.nkey_seed "+cfg.NKeySeed, "the "+s.name+".nk of this host's bundle (fanctl nats-config), readable by user fan", "not a usable nkey seed: %v", err)
		} else {
			r.out.addf(OK, "bus.nkey", label, "", "seed of %s", pub)
		}
	}
	if cfg.Creds != "" {
		if _, err := os.Stat(cfg.Creds); err != nil {
			usable = false
			r.out.addf(Error, "bus.creds", label+" bus.creds", "", "%v", err)
		}
	}
	var roots *x509.CertPool
	if cfg.TLS.CA != "" {
		cas, err := readCerts(cfg.TLS.CA)
		if err != nil {
			usable = false
			r.out.addf(Error, "bus.tls", label+" bus.tls.ca "+cfg.TLS.CA, "the ca.pem of this host's bundle", "%v", err)
		} else {
			roots = x509.NewCertPool()
			for _, c := range cas {
				roots.AddCert(c)
			}
			// The services of a host share their CA file: one finding.
			if !r.caSeen[cfg.TLS.CA] {
				r.caSeen[cfg.TLS.CA] = true
				r.expiry("bus.tls.ca "+cfg.TLS.CA, cas[0])
			}
		}
	}
	if cfg.TLS.Cert == "" {
		return usable
	}
	pair, err := tls.LoadX509KeyPair(cfg.TLS.Cert, cfg.TLS.Key)
	if err != nil {
		why := err.Error()
		if strings.Contains(why, "does not match") {
			why = "the certificate and the key do not match (" + why + "): TLS cannot start"
		}
		r.out.addf(Error, "bus.tls", label+" bus.tls.cert "+cfg.TLS.Cert+", bus.tls.key "+cfg.TLS.Key,
			"both from this host's bundle: "+s.name+"-cert.pem and "+s.name+"-key.pem, from the same fanctl nats-config run", "%s", why)
		return false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		r.out.addf(Error, "bus.tls", label+" bus.tls.cert "+cfg.TLS.Cert, "", "%v", err)
		return false
	}
	if roots != nil {
		// Checked at a time the certificate is valid: an expiry is the
		// next finding's, not a broken chain.
		at := time.Now()
		if at.After(leaf.NotAfter) {
			at = leaf.NotAfter.Add(-time.Second)
		}
		if at.Before(leaf.NotBefore) {
			at = leaf.NotBefore.Add(time.Second)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: at,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			usable = false
			r.out.addf(Error, "bus.tls", label+" bus.tls.cert "+cfg.TLS.Cert, "certificate, key and ca.pem from the same bundle",
				"not issued by bus.tls.ca (%v): the servers refuse it", err)
		}
	}
	if !r.expiry(label+" bus.tls.cert", leaf) {
		usable = false
	}
	return usable
}

// expiry reports when a certificate stops being valid: an error once it
// has, a warning within 30 days. false means it has expired.
func (r *run) expiry(subject string, c *x509.Certificate) bool {
	now := time.Now()
	left := c.NotAfter.Sub(now)
	when := c.NotAfter.UTC().Format("2006-01-02 15:04 MST")
	switch {
	case left <= 0:
		r.out.addf(Error, "bus.cert-expiry", subject, renewFix, "%s expired on %s: TLS to the bus fails", c.Subject.CommonName, when)
		return false
	case left < renewSoon:
		r.out.addf(Warning, "bus.cert-expiry", subject, renewFix, "%s expires on %s, in %d days: renew it before, or the service loses the bus then",
			c.Subject.CommonName, when, int(left.Hours()/24))
	case now.Before(c.NotBefore):
		r.out.addf(Error, "bus.cert-expiry", subject, "check this host's clock (host.clock)", "%s is valid only from %s", c.Subject.CommonName, c.NotBefore.UTC().Format(time.RFC3339))
		return false
	default:
		r.out.addf(OK, "bus.cert-expiry", subject, "", "%s valid until %s (%d days)", c.Subject.CommonName, when, int(left.Hours()/24))
	}
	return true
}

// readCerts reads every certificate of a PEM file.
func readCerts(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
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
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no certificate", path)
	}
	return out, nil
}
