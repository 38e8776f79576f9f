package bus

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/nats-io/nats.go"
)

// SystemAccount is how the arbiter reaches the NATS system account: one of
// a JWT credentials file, an nkey seed file, or a user and password.
type SystemAccount struct {
	Creds    string `yaml:"creds"`
	NKeySeed string `yaml:"nkey_seed"`
	User     string `yaml:"user"`
	Password string `yaml:"password"`
}

func (c *Config) validateLeaders() error {
	var errs []error
	for i, s := range c.LeaderServers {
		if s == "" {
			errs = append(errs, config.Errf(fmt.Sprintf("bus.leader_servers[%d]", i), "empty server name"))
		} else if slices.Index(c.LeaderServers, s) != i {
			errs = append(errs, config.Errf(fmt.Sprintf("bus.leader_servers[%d]", i), "%q listed twice", s))
		}
	}
	sys := c.System
	if sys == nil {
		return config.Join(errs...)
	}
	set := 0
	for _, v := range []string{sys.Creds, sys.NKeySeed, sys.User} {
		if v != "" {
			set++
		}
	}
	if set != 1 {
		errs = append(errs, config.Errf("bus.system", "set exactly one of creds, nkey_seed or user"))
	}
	if sys.User != "" && sys.Password == "" {
		errs = append(errs, config.Errf("bus.system.password", "required with bus.system.user"))
	}
	return config.Join(errs...)
}

// ConnectSystem opens a connection to the system account on the servers of
// cfg.URL, with cfg's TLS settings. It returns nil, nil when cfg.System is
// not set. The connection reconnects forever; the caller closes it.
func ConnectSystem(cfg Config, name string, log *slog.Logger) (*nats.Conn, error) {
	sys := cfg.System
	if sys == nil {
		return nil, nil
	}
	cfg.Defaults()
	// The same servers in the same order as the service's own connection,
	// and a silent one noticed as soon.
	order := newServerOrder(cfg.URL, reconnectWait)
	opts := append(order.options(), liveness(cfg)...)
	opts = append(opts,
		nats.Name(name),
		nats.ReconnectHandler(func(nc *nats.Conn) { order.connected(nc.ConnectedUrl()) }),
		// The first servers may be down when the arbiter starts.
		nats.RetryOnFailedConnect(true),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("system account connection error", "err", err)
		}),
	)
	switch {
	case sys.Creds != "":
		opts = append(opts, nats.UserCredentials(sys.Creds))
	case sys.NKeySeed != "":
		o, err := nats.NkeyOptionFromSeed(sys.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("bus.system nkey seed %s: %w", sys.NKeySeed, err)
		}
		opts = append(opts, o)
	default:
		opts = append(opts, nats.UserInfo(sys.User, sys.Password))
	}
	opts = append(opts, tlsOptions(cfg)...)
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("system account connect %s: %w", redact(cfg.URL), err)
	}
	return nc, nil
}
