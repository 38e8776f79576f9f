package httphb

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// certCheckEvery bounds how often the files are looked at: at most once a
// second, on a handshake.
const certCheckEvery = time.Second

// CertFiles serves a certificate and key from files and picks up a new
// pair on the first handshake after either file changed (a renewal by
// certbot or an operator's copy): no restart, no signal. A pair that does
// not load is logged and the previous one kept, so a half-written renewal
// never takes the endpoint down.
type CertFiles struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string // the files' sizes and modification times when loaded
	checked time.Time
}

// LoadCertFiles loads the pair once; a pair that does not load is an error
// at start.
func LoadCertFiles(certFile, keyFile string, log *slog.Logger) (*CertFiles, error) {
	c := &CertFiles{certFile: certFile, keyFile: keyFile, log: log}
	stamp, err := c.stampNow()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("http_heartbeat.tls: %w", err)
	}
	c.cert, c.stamp, c.checked = &cert, stamp, time.Now()
	return c, nil
}

func (c *CertFiles) stampNow() (string, error) {
	var s string
	for _, f := range []string{c.certFile, c.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("http_heartbeat.tls: %w", err)
		}
		s += fmt.Sprintf("%d/%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return s, nil
}

// GetCertificate is tls.Config.GetCertificate.
func (c *CertFiles) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) < certCheckEvery {
		return c.cert, nil
	}
	c.checked = time.Now()
	stamp, err := c.stampNow()
	if err != nil || stamp == c.stamp {
		if err != nil {
			c.log.Warn("http heartbeat certificate files unreadable; keeping the loaded pair", "err", err)
		}
		return c.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		// Retried on the next check: cert and key are often replaced one
		// after the other.
		c.log.Warn("http heartbeat certificate changed but does not load; keeping the loaded pair", "err", err)
		return c.cert, nil
	}
	c.cert, c.stamp = &cert, stamp
	c.log.Info("http heartbeat certificate reloaded", "cert", c.certFile)
	return c.cert, nil
}

// TLSConfig is the server configuration: TLS 1.2 at least.
func (c *CertFiles) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.GetCertificate}
}

// GuardTLS wraps the TLS endpoint's listener so that plaintext sent to it
// (net/http answers it 400 without logging) is logged with its source and
// counted like every other refusal. A TLS connection starts with a
// handshake record, byte 0x16; anything else is refused.
func (h *Handler) GuardTLS(ln net.Listener) net.Listener { return tlsGuard{Listener: ln, h: h} }

type tlsGuard struct {
	net.Listener
	h *Handler
}

func (g tlsGuard) Accept() (net.Conn, error) {
	c, err := g.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &firstByteConn{Conn: c, h: g.h}, nil
}

type firstByteConn struct {
	net.Conn
	h    *Handler
	once sync.Once
}

const tlsHandshakeRecord = 0x16

func (c *firstByteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.once.Do(func() {
			if p[0] != tlsHandshakeRecord {
				c.h.refused.WithLabelValues(refusedPlaintext).Inc()
				c.h.log.Warn("http heartbeat refused", "source", c.RemoteAddr().String(), "reason", refusedPlaintext,
					"err", "not a TLS handshake (plaintext to the TLS port)")
			}
		})
	}
	return n, err
}
