#!/usr/bin/env bash
# init.sh FANCTL [DIR]: the compose lab's configuration and credentials, made
# as an installation makes them: `FANCTL init --site site.yaml --out DIR`
# (default DIR: deploy/compose/fan-site, git-ignored). docker-compose.yml
# mounts each host's DIR/hosts/<host>/files/etc/fan read-only at /etc/fan in
# every fan container of that host, the witness's files/etc/fan-status in
# its status page, the operator's bundle (DIR/people/you) in the witness's
# arbiter and the admin's (DIR/admin) in the one-shot provisioner.
#
# Run again after editing site.yaml: init keeps the CA, keys and secrets in
# DIR and rewrites what the change implies (it names the hosts and files).
# The containers see the new files at once, their directories being
# mounted; restart (or SIGHUP) the services whose files changed.
set -euo pipefail
fanctl=${1:?usage: init.sh FANCTL [DIR]}
here=$(cd "$(dirname "$0")" && pwd)
dir=${2:-$here/fan-site}
umask 077

"$fanctl" init --site "$here/site.yaml" --out "$dir"

# The stand-in PBX is given the AMI secret init made for its host, as a
# real Asterisk is given DIR/hosts/<host>/asterisk/manager-fan.conf.
for host in n1 n2; do
	printf 'FAN_PBX_AMI_SECRET=%s\n' "$(<"$dir/secrets/ami-$host")" >"$dir/pbx-$host.env"
done

# The containers run as root without CAP_DAC_OVERRIDE, so files init wrote
# 0600 for another user would be unreadable to them. DIR itself stays 0700:
# nobody else on this machine reaches them.
if [[ $(id -u) != 0 ]]; then
	chmod -R a+rX "$dir/hosts" "$dir/people" "$dir/admin"
fi
