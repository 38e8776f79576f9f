package notify

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// Config is the arbiter's notify section: hooks told of holder changes,
// health transitions of a group's checks and needs-human decisions.
type Config struct {
	// Queue is how many events may wait for each hook; beyond it the
	// oldest waiting is dropped and counted (fan_notify_dropped_total).
	Queue int `yaml:"queue"`
	// CatchUp: a replica that takes the lease runs its hooks for the
	// events it read in this long before, which the replica that led may
	// not have delivered (at least once; receivers dedupe by event id and group).
	CatchUp config.Duration `yaml:"catch_up"`
	Hooks   []HookConfig    `yaml:"hooks"`
}

// HookConfig is one hook: a command or a webhook, for some groups and kinds.
type HookConfig struct {
	Name string `yaml:"name"`
	// Groups the hook hears of (empty: every group).
	Groups []string `yaml:"groups"`
	// Events the hook hears of (empty: every kind).
	Events []Kind `yaml:"events"`
	// Timeout bounds one run of a command (then its process group is
	// killed) or one attempt of a webhook.
	Timeout config.Duration `yaml:"timeout"`
	// Command is an argv run without a shell; Command[0] is an absolute path.
	Command []string       `yaml:"command"`
	Webhook *WebhookConfig `yaml:"webhook"`
}

// WebhookConfig is where and how a hook POSTs each event.
type WebhookConfig struct {
	URL string `yaml:"url"`
	// SecretFile holds the shared secret the body is signed with
	// (X-Fan-Signature); surrounding white space is ignored.
	SecretFile string `yaml:"secret_file"`
	// MaxTries bounds the attempts of one event; Backoff is the wait
	// before the second, doubling up to MaxBackoff.
	MaxTries   int             `yaml:"max_tries"`
	Backoff    config.Duration `yaml:"backoff"`
	MaxBackoff config.Duration `yaml:"max_backoff"`
	// InsecurePlaintext allows http:// off loopback (behind a TLS proxy on
	// this host only): the events name nodes and reasons.
	InsecurePlaintext bool `yaml:"insecure_plaintext"`
}

// Defaults and ranges (README "Notify hooks", docs/bounds.md).
const (
	DefaultQueue      = 64
	DefaultCatchUp    = 30 * time.Second
	DefaultTimeout    = 10 * time.Second
	DefaultMaxTries   = 5
	DefaultBackoff    = time.Second
	DefaultMaxBackoff = 30 * time.Second

	maxQueue      = 4096
	maxHooks      = 32
	maxArgs       = 64
	maxTries      = 20
	minSecretLen  = 16
	maxCatchUp    = 10 * time.Minute
	minTimeout    = 100 * time.Millisecond
	maxTimeout    = 5 * time.Minute
	minBackoff    = 10 * time.Millisecond
	maxBackoffCap = 10 * time.Minute
)

// Validate checks the section against the groups the arbiter decides on
// and fills defaults, reporting every key that is wrong. Keys are named
// from the file's root ("notify.…").
func (c *Config) Validate(groups []string) error {
	errs := []error{
		config.IntIn("notify.queue", c.Queue, 0, maxQueue),
		config.DurationOrZero("notify.catch_up", c.CatchUp.D(), time.Second, maxCatchUp),
		config.CountIn("notify.hooks", len(c.Hooks), 0, maxHooks),
	}
	if c.Queue == 0 {
		c.Queue = DefaultQueue
	}
	if c.CatchUp == 0 {
		c.CatchUp = config.Duration(DefaultCatchUp)
	}
	names := map[string]bool{}
	for i := range c.Hooks {
		h := &c.Hooks[i]
		key := func(k string) string { return fmt.Sprintf("notify.hooks[%d].%s", i, k) }
		if err := events.ValidToken("name", h.Name); err != nil {
			errs = append(errs, &config.FieldError{Key: key("name"), Err: err})
		} else if names[h.Name] {
			errs = append(errs, config.Errf(key("name"), "duplicate hook %q", h.Name))
		}
		names[h.Name] = true
		errs = append(errs, h.validate(key, groups))
	}
	return config.Join(errs...)
}

func (h *HookConfig) validate(key func(string) string, groups []string) error {
	var errs []error
	for _, g := range h.Groups {
		if !slices.Contains(groups, g) {
			errs = append(errs, config.Errf(key("groups"), "%q is not a configured group", g))
		}
	}
	for _, k := range h.Events {
		if !slices.Contains(Kinds, k) {
			errs = append(errs, config.Errf(key("events"), "%q is not one of %v", k, Kinds))
		}
	}
	errs = append(errs, config.DurationOrZero(key("timeout"), h.Timeout.D(), minTimeout, maxTimeout))
	if h.Timeout == 0 {
		h.Timeout = config.Duration(DefaultTimeout)
	}
	switch {
	case len(h.Command) > 0 && h.Webhook != nil:
		errs = append(errs, config.Errf(key("command"), "a hook is a command or a webhook, not both"))
	case len(h.Command) > 0:
		errs = append(errs, config.CountIn(key("command"), len(h.Command), 1, maxArgs))
		if !filepath.IsAbs(h.Command[0]) {
			errs = append(errs, config.Errf(key("command"), "%q: the program is an absolute path (no shell, no PATH search)", h.Command[0]))
		}
		if slices.ContainsFunc(h.Command, func(a string) bool { return strings.ContainsRune(a, 0) }) {
			errs = append(errs, config.Errf(key("command"), "an argument holds a NUL byte"))
		}
	case h.Webhook != nil:
		errs = append(errs, h.Webhook.validate(func(k string) string { return key("webhook." + k) }))
	default:
		errs = append(errs, config.Errf(key("command"), "set command (an argv) or webhook"))
	}
	return config.Join(errs...)
}

func (w *WebhookConfig) validate(key func(string) string) error {
	bounds := config.Join(
		config.IntIn(key("max_tries"), w.MaxTries, 0, maxTries),
		config.DurationOrZero(key("backoff"), w.Backoff.D(), minBackoff, maxBackoffCap),
		config.DurationOrZero(key("max_backoff"), w.MaxBackoff.D(), minBackoff, maxBackoffCap),
	)
	errs := []error{bounds}
	if w.MaxTries == 0 {
		w.MaxTries = DefaultMaxTries
	}
	if w.Backoff == 0 {
		w.Backoff = config.Duration(DefaultBackoff)
	}
	if w.MaxBackoff == 0 {
		w.MaxBackoff = config.Duration(max(DefaultMaxBackoff, w.Backoff.D()))
	}
	if bounds == nil && w.MaxBackoff < w.Backoff {
		errs = append(errs, config.Errf(key("max_backoff"), "below backoff (%v)", w.Backoff.D()))
	}
	u, err := url.Parse(w.URL)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
		errs = append(errs, config.Errf(key("url"), "want an http:// or https:// URL, got %q", w.URL))
	case u.User != nil:
		errs = append(errs, config.Errf(key("url"), "no credentials in the URL: the body is signed with secret_file"))
	case u.Scheme == "http" && !w.InsecurePlaintext && !bus.IsLoopbackHost(hostOnly(u.Host)):
		errs = append(errs, config.Errf(key("url"), "https required off loopback (insecure_plaintext: true only behind a TLS proxy on this host)"))
	}
	if w.SecretFile == "" {
		errs = append(errs, config.Errf(key("secret_file"), "required: receivers verify the signature with it"))
	}
	return config.Join(errs...)
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// CheckFiles requires each command's program to be an executable file and
// each webhook's secret to be readable and long enough, so -check-config
// refuses a missing one by its key. It is apart from Validate because a
// configuration is also validated where its paths are not this host's
// (fanctl replay reads the arbiter's file).
func (c *Config) CheckFiles() error {
	var errs []error
	for i, h := range c.Hooks {
		key := func(k string) string { return fmt.Sprintf("notify.hooks[%d].%s", i, k) }
		if len(h.Command) > 0 {
			if err := config.FileReadable(key("command"), h.Command[0]); err != nil {
				errs = append(errs, err)
			} else if st, err := os.Stat(h.Command[0]); err == nil && st.Mode().Perm()&0o111 == 0 {
				errs = append(errs, config.Errf(key("command"), "%s is not executable", h.Command[0]))
			}
		}
		if h.Webhook != nil {
			if _, err := readSecret(key("webhook.secret_file"), h.Webhook.SecretFile); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return config.Join(errs...)
}

// readSecret reads a webhook's shared secret.
func readSecret(key, path string) ([]byte, error) {
	if err := config.FileReadable(key, path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &config.FieldError{Key: key, Err: err}
	}
	s := []byte(strings.TrimSpace(string(b)))
	if len(s) < minSecretLen {
		return nil, config.Errf(key, "%s: a secret of at least %d characters is required", path, minSecretLen)
	}
	return s, nil
}
