package bindtest

import (
	"fmt"
	"strings"

	"github.com/miekg/dns"
)

// Configurations for named in the namespace labs (package stack), where
// each server has an address of its own on port 53: a site's primary for a
// dynamic zone, and a recursive resolver that reaches the zone's servers as
// a resolver on the internet would, honouring the records' TTL.

// PrimaryConfig is named.conf for a primary of zone that listens on listen
// (an IPv4 address, port 53), keeps its files in dir, takes updates signed
// with KeyName (secret) for grants (e.g. "sip.voip.test. A"), and neither
// notifies nor transfers the zone: a primary of its own, the shape of one
// site's server when each site runs one.
func PrimaryConfig(dir, listen, zone, secret string, grants ...string) string {
	var policy strings.Builder
	for _, g := range grants {
		fmt.Fprintf(&policy, "\t\tgrant %s name %s;\n", KeyName, g)
	}
	return fmt.Sprintf(`options {
	directory "%s";
	pid-file "named.pid";
	session-keyfile "session.key";
	listen-on port 53 { %s; };
	listen-on-v6 { none; };
	recursion no;
	dnssec-validation no;
	notify no;
	allow-transfer { none; };
};
controls { };
key "%s" { algorithm hmac-sha256; secret "%s"; };
zone "%s" {
	type primary;
	file "zone.db";
	update-policy {
%s	};
};
`, dir, listen, KeyName, secret, dns.Fqdn(zone), policy.String())
}

// ResolverConfig is named.conf for a recursive resolver listening on
// listen for the clients in allow (a prefix), keeping its files in dir: it
// finds zone's authoritative servers at servers (IPv4 addresses, port 53)
// as a delegation would name them (a static stub: the resolver chooses
// among them by their round trips, and tries another when one does not
// answer), and caches answers for their TTL. Names outside zone go to the
// root named by RootHint's file, root.hint: a lab address where nothing
// answers, so nothing leaves the lab.
func ResolverConfig(dir, listen, allow, zone string, servers ...string) string {
	return fmt.Sprintf(`options {
	directory "%s";
	pid-file "named.pid";
	session-keyfile "session.key";
	listen-on port 53 { %s; };
	listen-on-v6 { none; };
	recursion yes;
	allow-query { %s; };
	allow-recursion { %s; };
	dnssec-validation no;
	notify no;
};
controls { };
zone "." { type hint; file "root.hint"; };
zone "%s" { type static-stub; server-addresses { %s; }; };
`, dir, listen, allow, allow, dns.Fqdn(zone), strings.Join(servers, "; "))
}

// RootHint is the resolver's root.hint: one root server at addr.
func RootHint(addr string) string {
	return fmt.Sprintf(".\t3600000\tNS\troot.lab.\nroot.lab.\t3600000\tA\t%s\n", addr)
}
