package natsserver

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats-server/v2/server"
)

// checkListeners refuses to start a server whose client or route listener is
// reachable from other machines without authentication and TLS
// (bus.ErrInsecure, the refusal a client makes of such a server). It names
// each listener that is wrong (errors.Join), the client's first.
func checkListeners(o *server.Options, insecureLab bool) error {
	if insecureLab {
		return nil
	}
	var errs []error
	if !o.DontListen && !bus.IsLoopbackHost(o.Host) {
		var missing []string
		if !hasClientAuth(o) {
			missing = append(missing, "authentication")
		}
		if o.TLSConfig == nil {
			missing = append(missing, "TLS")
		}
		if len(missing) > 0 {
			errs = append(errs, &listenerError{route: false, err: fmt.Errorf("%w: nats client listener %s is not loopback and has no %s; give a server configuration "+
				"with authorization and tls blocks (fanctl nats-config writes one), or the insecure-lab flag for a throwaway lab",
				bus.ErrInsecure, net.JoinHostPort(o.Host, fmt.Sprint(o.Port)), strings.Join(missing, " and "))})
		}
	}
	if o.Cluster.Port != 0 && !bus.IsLoopbackHost(o.Cluster.Host) && o.Cluster.TLSConfig == nil {
		errs = append(errs, &listenerError{route: true, err: fmt.Errorf("%w: nats route listener %s is not loopback and has no TLS; give the cluster block a tls block "+
			"(verify: true), or the insecure-lab flag for a throwaway lab",
			bus.ErrInsecure, net.JoinHostPort(o.Cluster.Host, fmt.Sprint(o.Cluster.Port)))})
	}
	return errors.Join(errs...)
}

// listenerError is checkListeners' refusal of one listener: the client's
// (listen) or the routes' (cluster.listen).
type listenerError struct {
	route bool
	err   error
}

func (e *listenerError) Error() string { return e.err.Error() }
func (e *listenerError) Unwrap() error { return e.err }

// hasClientAuth reports whether every client must prove who it is: users,
// nkeys, a token, an operator's JWTs, or a client certificate. A no_auth_user
// lets anonymous clients in, so it counts as none.
func hasClientAuth(o *server.Options) bool {
	if o.NoAuthUser != "" {
		return false
	}
	return len(o.Nkeys) > 0 || len(o.Users) > 0 || o.Username != "" || o.Authorization != "" ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || (o.TLSConfig != nil && o.TLSVerify)
}
