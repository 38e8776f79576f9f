#!/usr/bin/env bash
# check-examples.sh BINDIR EXAMPLESDIR: the example configurations load with
# these binaries (-check-config), in a throwaway root standing in for a
# host: their paths under /etc/fan, /var/lib/fan, /etc/asterisk and
# /var/spool/asterisk are moved below it. Before the referenced files exist
# every service must refuse, naming the file; with them every one loads; and
# a missing tree or state directory is refused by its key.
set -euo pipefail
bin=${1:?usage: check-examples.sh BINDIR EXAMPLESDIR}
examples=${2:?usage: check-examples.sh BINDIR EXAMPLESDIR}
fail() { echo "check-examples.sh: $*" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/cfg"
services=(prober arbiter ipmover replicator scheduler)
for s in "${services[@]}"; do
	sed -e "s|/etc/fan/|$root/etc/fan/|g" -e "s|/var/lib/fan/|$root/var/lib/fan/|g" \
		-e "s|/etc/asterisk|$root/etc/asterisk|g" -e "s|/var/spool/asterisk|$root/var/spool/asterisk|g" \
		"$examples/$s.yaml" >"$root/cfg/$s.yaml"
done
check() { "$bin/fan-$1" -check-config "$root/cfg/$1.yaml" 2>&1; }

# Nothing there yet: each refuses, naming its bus identity.
for s in "${services[@]}"; do
	if out=$(check "$s"); then fail "$s loaded with none of its files present"; fi
	[[ $out == *"bus.nkey_seed: $root/etc/fan/bus/$s.nk: no such file or directory"* ]] || fail "$s: $out"
done

# What an installed host has: the bundle's files, the state directories
# (the package's tmpfiles.d), Asterisk's directories.
mkdir -p "$root/etc/fan/bus" "$root/var/lib/fan/ipmover" "$root/var/lib/fan/replicator" \
	"$root/etc/asterisk" "$root/var/spool/asterisk/voicemail"
grep -ohE "$root/etc/fan/bus/[^ ]+" "$root"/cfg/*.yaml | sort -u | xargs touch
for s in "${services[@]}"; do
	out=$(check "$s") || fail "$s does not load with its files present: $out"
done

# A mistyped tree or a missing state directory is named by its key.
rmdir "$root/var/spool/asterisk/voicemail"
if out=$(check replicator); then fail "replicator loaded without its voicemail tree"; fi
[[ $out == *"trees[1].path: $root/var/spool/asterisk/voicemail: no such file or directory"* ]] || fail "replicator: $out"
rmdir "$root/var/lib/fan/ipmover"
if out=$(check ipmover); then fail "ipmover loaded without its state directory"; fi
[[ $out == *"state_file: $root/var/lib/fan/ipmover/state.json: its directory"* ]] || fail "ipmover: $out"

# The status page's file (fanctl's, read as strictly): it loads, and the page
# refuses to start until its token file exists, naming it. (Past that it
# would dial the bus, which is not here.)
sed -e "s|/etc/fan/|$root/etc/fan/|g" "$examples/status.yaml" >"$root/cfg/status.yaml"
if out=$("$bin/fanctl" --config "$root/cfg/status.yaml" serve 2>&1); then fail "fanctl serve started without its token file"; fi
[[ $out == *"serve.token_file: token file unusable: stat $root/etc/fan/page.token: no such file"* ]] || fail "status: $out"
echo "example configs: ${#services[@]} load on a host with their files, and name a missing one; status.yaml loads"
