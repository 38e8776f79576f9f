package daemon

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/prometheus/client_golang/prometheus"
)

// Roles of the certificate files a fan process reports (the role label of
// fan_cert_not_after_timestamp_seconds).
const (
	// CertRoleBusCA is the CA the bus's servers are checked against
	// (bus.tls.ca).
	CertRoleBusCA = "bus_ca"
	// CertRoleBusClient is the certificate the process presents to the
	// bus (bus.tls.cert).
	CertRoleBusClient = "bus_client"
)

// CertFile is one certificate file a process depends on.
type CertFile struct {
	Role string
	Path string
}

// BusCertFiles are the certificate files of a bus configuration: its CA and
// its client certificate, those that are set.
func BusCertFiles(c bus.Config) []CertFile {
	var files []CertFile
	if c.TLS.CA != "" {
		files = append(files, CertFile{Role: CertRoleBusCA, Path: c.TLS.CA})
	}
	if c.TLS.Cert != "" {
		files = append(files, CertFile{Role: CertRoleBusClient, Path: c.TLS.Cert})
	}
	return files
}

// CertExpiry exports when each certificate a process depends on stops
// being valid, so an alert fires weeks before a reconnect fails on it. The
// files are read at every scrape: a certificate renewed on disk shows at
// once, and what the process will present at its next connection is what
// counts (a TLS session already open outlives its certificate; the next
// one does not).
type CertExpiry struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	// files in the order added; a role and path pair appears once.
	files []CertFile
}

// NewCertExpiry makes the collector for files; Add adds more later.
func NewCertExpiry(files ...CertFile) *CertExpiry {
	c := &CertExpiry{desc: prometheus.NewDesc("fan_cert_not_after_timestamp_seconds",
		"When the certificate in the file stops being valid (Unix time; the earliest of the file's certificates). "+
			"0 when the file cannot be read or holds no certificate: the next connection would fail as if it had expired.",
		[]string{"role", "file"}, nil)}
	c.Add(files...)
	return c
}

// Add reports these files too (a service's own, beside the bus's).
func (c *CertExpiry) Add(files ...CertFile) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range files {
		if f.Path != "" && !slices.Contains(c.files, f) {
			c.files = append(c.files, f)
		}
	}
}

// Describe implements prometheus.Collector.
func (c *CertExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *CertExpiry) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	files := slices.Clone(c.files)
	c.mu.Unlock()
	for _, f := range files {
		var v float64
		if na, ok := NotAfter(f.Path); ok {
			v = float64(na.Unix())
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, f.Role, f.Path)
	}
}

// NotAfter is the earliest expiry of the certificates in a PEM file, and
// whether the file held at least one that parses.
func NotAfter(path string) (na time.Time, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, false
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return na, ok
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			continue
		}
		if !ok || cert.NotAfter.Before(na) {
			na, ok = cert.NotAfter, true
		}
	}
}
