package fanctl

import (
	"flag"
	"fmt"
	"path/filepath"

	"github.com/fanpbx/fan/cmd/internal/statuspage"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// Config is fanctl's configuration file (--config, FANCTL_CONFIG): where the
// bus is, the credentials to reach it, and whose credentials they are. An
// operator's file is handed out with the operator's credentials; Operator
// must be the operator those credentials belong to, since it names the
// subject fanctl sends requests on and the bus lets the credentials publish
// on that subject only.
type Config struct {
	URL      string        `yaml:"url"`
	Creds    string        `yaml:"creds"`
	NKeySeed string        `yaml:"nkey_seed"`
	TLS      bus.TLSConfig `yaml:"tls"`
	Cluster  string        `yaml:"cluster"`
	Operator string        `yaml:"operator"`
	// Serve configures the status page (fanctl serve).
	Serve statuspage.Config `yaml:"serve"`
}

// Validate checks the bounds of what the file sets, naming the key.
func (c *Config) Validate() error { return c.Serve.Validate() }

// applyConfig loads path and fills every connection setting the command line
// did not set explicitly; it returns the file for the commands' own
// sections.
func applyConfig(fs *flag.FlagSet, path string, cfg *bus.Config, cluster, operator *string) (Config, error) {
	var c Config
	if err := config.Load(path, &c); err != nil {
		return c, fmt.Errorf("fanctl config: %w", err)
	}
	if c.Operator != "" {
		if err := events.ValidToken("operator", c.Operator); err != nil {
			return c, fmt.Errorf("fanctl config %s: %w", path, err)
		}
	}
	// A bundle's files are named relative to its fanctl.yaml, so the bundle
	// works wherever its owner keeps it.
	dir := filepath.Dir(path)
	for _, p := range []*string{&c.Creds, &c.NKeySeed, &c.TLS.CA, &c.TLS.Cert, &c.TLS.Key, &c.Serve.TokenFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fill := func(flagName string, dst *string, v string) {
		if !set[flagName] && v != "" {
			*dst = v
		}
	}
	fill("url", &cfg.URL, c.URL)
	fill("creds", &cfg.Creds, c.Creds)
	fill("nkey", &cfg.NKeySeed, c.NKeySeed)
	fill("tls-ca", &cfg.TLS.CA, c.TLS.CA)
	fill("tls-cert", &cfg.TLS.Cert, c.TLS.Cert)
	fill("tls-key", &cfg.TLS.Key, c.TLS.Key)
	fill("cluster", cluster, c.Cluster)
	fill("operator", operator, c.Operator)
	return c, nil
}
