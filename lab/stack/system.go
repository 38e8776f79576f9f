package stack

import (
	"fmt"
	"os"
	"path/filepath"
)

// The lab's NATS servers put fan's services in an account of their own and
// give the system account one user, the arbiters' bus.system: moving the
// meta leader (which creates every consumer, the ordered ones included) off
// a PBX host needs system-account rights. Clients that bring no identity
// (the lab's services under insecure_lab, fanctl, the tests) land in fan's
// account as before. A throwaway password: the lab's bus is insecure_lab.
const (
	labSystemUser     = "fan-sys"
	labSystemPassword = "fan-lab-system"
	accountsFile      = "nats-accounts.conf"
)

// accountsConf is the nats-server file (-server-config) of a clustered lab.
const accountsConf = `accounts {
  FAN { jetstream: enabled, users: [{user: fan, password: fan}] }
  SYS { users: [{user: %s, password: %s}] }
}
system_account: SYS
no_auth_user: fan
`

// writeAccounts writes accountsConf into the stack's directory.
func (s *Stack) writeAccounts() error {
	p := filepath.Join(s.dir, accountsFile)
	if err := os.WriteFile(p, fmt.Appendf(nil, accountsConf, labSystemUser, labSystemPassword), 0o600); err != nil {
		return fmt.Errorf("nats accounts file: %w", err)
	}
	return nil
}

// accountsArgs are fan-nats's arguments for the accounts file: clustered
// topologies only, as a single server has no raft leader to move.
func (s *Stack) accountsArgs() []string {
	if s.opts.Topology == TopologySingle || s.opts.SecureBus {
		return nil
	}
	return []string{"-server-config", filepath.Join(s.dir, accountsFile)}
}
