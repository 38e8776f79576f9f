#!/usr/bin/env bash
# creds.sh FANCTL [DIR]: the compose lab's bus credentials, made as an
# installation makes them. Runs `FANCTL nats-config` on cluster.yaml into
# DIR/bus (default DIR: deploy/compose/creds, git-ignored), then writes each
# service's configuration into DIR/config/<host>/: the file of the same name
# in config/ followed by the bus section `fanctl nats-config` wrote into that
# host's bundle. docker-compose.yml mounts each host's bundle read-only at
# /etc/fan/bus (the nats server's at /etc/nats, the operator's at
# /etc/fan/operator) and the assembled configurations at /etc/fan.
#
# Run again after editing config/: the CA, keys and certificates already in
# DIR/bus are kept (nats-config reuses them), the configurations rewritten.
set -euo pipefail
fanctl=${1:?usage: creds.sh FANCTL [DIR]}
here=$(cd "$(dirname "$0")" && pwd)
dir=${2:-$here/creds}

mkdir -p "$dir"
# Other users of this machine have no business reading the lab's keys.
chmod 0700 "$dir"
"$fanctl" nats-config --cluster-file "$here/cluster.yaml" --out "$dir/bus" >/dev/null
hosts=$dir/bus/hosts

for host in n1 n2 ctl; do
	mkdir -p "$dir/config/$host"
	for base in "$here/config/$host"/*.yaml; do
		svc=$(basename "$base" .yaml)
		snippet=$hosts/$host/$svc-bus.yaml
		[[ -f $snippet ]] || { echo "creds.sh: no bus section for $svc on $host in $hosts/$host" >&2; exit 1; }
		{ cat "$base"; echo; cat "$snippet"; } >"$dir/config/$host/$svc.yaml"
	done
done

# fanctl in the arbiter's container speaks as the operator "you", whose
# bundle is mounted at /etc/fan/operator rather than the host's /etc/fan/bus.
sed 's#/etc/fan/bus/#/etc/fan/operator/#' "$hosts/you/fanctl.yaml" >"$dir/config/ctl/fanctl.yaml"

# The containers run as root without CAP_DAC_OVERRIDE, so a key that is
# 0600 and owned by another user would be unreadable to them. DIR itself
# stays 0700: nobody else on this machine reaches the keys.
if [[ $(id -u) != 0 ]]; then
	find "$dir/bus/hosts" -type f -exec chmod 0644 {} +
fi
echo "credentials and configurations in $dir"
