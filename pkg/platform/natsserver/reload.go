package natsserver

import (
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
)

// Reload applies c to a running server as nats-server's own reload does:
// what may change live (users and their permissions, accounts, TLS
// certificates, the route list) is applied without dropping a connection,
// and a change that needs a restart (a listen address, the server's name,
// the cluster's name) is refused, leaving the server as it was. The server
// configuration file is read again, so a new identity added to it by
// `fanctl init` is accepted at once.
func Reload(srv *server.Server, c Config) error {
	opts, err := options(c)
	if err != nil {
		return err
	}
	if err := checkListeners(opts, c.InsecureLab); err != nil {
		return fmt.Errorf("embedded nats reload: %w", err)
	}
	if err := srv.ReloadOptions(opts); err != nil {
		return fmt.Errorf("embedded nats reload: %w", err)
	}
	return nil
}
