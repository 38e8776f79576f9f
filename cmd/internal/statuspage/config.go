package statuspage

import (
	"regexp"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// Config is the `serve:` section of fanctl's configuration file; the
// command line's flags override listen, path_prefix and token_file.
type Config struct {
	// Listen is the page's own address (host:port).
	Listen string `yaml:"listen"`
	// PathPrefix is the path the page is served under, "/" or "/a/b/":
	// behind a reverse proxy that passes paths unchanged it is the
	// proxy's location; behind one that strips it, "/" (every URL the
	// page uses is relative, so both work).
	PathPrefix string `yaml:"path_prefix"`
	// TokenFile holds the bearer token that logs in (never a flag's value
	// or an environment variable: those are visible to every user of the
	// host in /proc).
	TokenFile string `yaml:"token_file"`
	// SessionTTL is how long a login lasts.
	SessionTTL config.Duration `yaml:"session_ttl"`
	// InsecureCookie drops the session cookie's Secure flag, for a lab
	// whose browsers reach the page over plain HTTP on another host than
	// localhost. Behind a TLS proxy leave it off.
	InsecureCookie bool `yaml:"insecure_cookie"`
	// Timeline is how far back the timeline starts when the page starts.
	Timeline config.Duration `yaml:"timeline"`
	// TimelineMax is how many events the timeline keeps.
	TimelineMax int `yaml:"timeline_max"`
	// ExplainLookback is how far before an event its causes are looked
	// for (fanctl explain's --lookback).
	ExplainLookback config.Duration `yaml:"explain_lookback"`
	// Refresh is how often the status is read again without a change, so
	// "last heard" stays current.
	Refresh config.Duration `yaml:"refresh"`
	// MaxClients bounds the open live streams (browsers).
	MaxClients int `yaml:"max_clients"`
}

// Defaults and bounds (docs/bounds.md, cmd/README.md).
const (
	DefaultListen      = "127.0.0.1:9110"
	defaultSessionTTL  = 12 * time.Hour
	defaultTimeline    = time.Hour
	defaultTimelineMax = 500
	defaultLookback    = 24 * time.Hour
	defaultRefresh     = 2 * time.Second
	defaultMaxClients  = 64
	maxPrefixLen       = 256
)

var prefixPattern = regexp.MustCompile(`^/([A-Za-z0-9._~-]+/)*$`)

// Validate checks the keys that are set (0 or empty takes the default);
// each refusal names its key under serve.
func (c *Config) Validate() error {
	var errs []error
	if c.Listen != "" {
		errs = append(errs, config.HostPort("serve.listen", c.Listen, true))
	}
	if c.PathPrefix != "" {
		switch {
		case len(c.PathPrefix) > maxPrefixLen:
			errs = append(errs, config.Errf("serve.path_prefix", "at most %d bytes, got %d", maxPrefixLen, len(c.PathPrefix)))
		case !prefixPattern.MatchString(c.PathPrefix) || strings.Contains(c.PathPrefix, "/../") || strings.Contains(c.PathPrefix, "/./"):
			errs = append(errs, config.Errf("serve.path_prefix", "want / or /path/ (letters, digits, ._~- between slashes), got %q", c.PathPrefix))
		}
	}
	errs = append(errs,
		config.DurationOrZero("serve.session_ttl", c.SessionTTL.D(), time.Minute, 7*24*time.Hour),
		config.DurationOrZero("serve.timeline", c.Timeline.D(), time.Minute, 7*24*time.Hour),
		intOrZero("serve.timeline_max", c.TimelineMax, 10, 10000),
		config.DurationOrZero("serve.explain_lookback", c.ExplainLookback.D(), time.Minute, 7*24*time.Hour),
		config.DurationOrZero("serve.refresh", c.Refresh.D(), 500*time.Millisecond, time.Minute),
		intOrZero("serve.max_clients", c.MaxClients, 1, 1024),
	)
	return config.Join(errs...)
}

func intOrZero(key string, v, lo, hi int) error {
	if v == 0 {
		return nil
	}
	return config.IntIn(key, v, lo, hi)
}

// withDefaults fills what is unset.
func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.PathPrefix == "" {
		c.PathPrefix = "/"
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = config.Duration(defaultSessionTTL)
	}
	if c.Timeline == 0 {
		c.Timeline = config.Duration(defaultTimeline)
	}
	if c.TimelineMax == 0 {
		c.TimelineMax = defaultTimelineMax
	}
	if c.ExplainLookback == 0 {
		c.ExplainLookback = config.Duration(defaultLookback)
	}
	if c.Refresh == 0 {
		c.Refresh = config.Duration(defaultRefresh)
	}
	if c.MaxClients == 0 {
		c.MaxClients = defaultMaxClients
	}
	return c
}
