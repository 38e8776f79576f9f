package dnsexec

import (
	"encoding/base64"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// Ranges of the DNS executor's keys (README "Configuration"). Zero means
// the default everywhere a default exists; the defaults lie inside the ranges.
const maxSites = 256

func (d *DNSConfig) validateBounds() error {
	errs := []error{
		config.DurationOrZero("dns.timeout", d.Timeout, 100*time.Millisecond, time.Minute),
		config.DurationOrZero("dns.verify_timeout", d.VerifyTimeout, 100*time.Millisecond, 10*time.Minute),
		config.DurationOrZero("dns.verify_interval", d.VerifyInterval, 10*time.Millisecond, 10*time.Second),
		config.DurationOrZero("dns.fudge", d.Fudge, time.Second, time.Hour),
		config.DurationOrZero("dns.ttl", d.TTL, time.Second, 24*time.Hour),
		config.CountIn("dns.sites", len(d.Sites), 0, maxSites),
		config.CountIn("dns.servers", len(d.Servers), 0, 16),
		config.CountIn("dns.primaries", len(d.Primaries), 0, 16),
		config.DurationOrZero("dns.resync", d.Resync, 100*time.Millisecond, time.Minute),
	}
	if d.Primary != "" {
		errs = append(errs, config.HostPort("dns.primary", d.Primary, false))
	}
	for i, s := range d.Servers {
		errs = append(errs, config.HostPort(fmt.Sprintf("dns.servers[%d]", i), s, false))
	}
	for i, s := range d.Primaries {
		errs = append(errs, config.HostPort(fmt.Sprintf("dns.primaries[%d]", i), s, false))
	}
	// An HMAC key is base64 as tsig-keygen prints it; anything else fails
	// every signed UPDATE at the worst moment, a failover.
	if d.Key.Secret != "" {
		if b, err := base64.StdEncoding.DecodeString(d.Key.Secret); err != nil || len(b) == 0 {
			errs = append(errs, config.Errf("dns.key.secret", "want the key in base64, as tsig-keygen prints it"))
		}
	}
	return config.Join(errs...)
}
