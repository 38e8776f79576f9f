#!/usr/bin/env bash
# check-examples.sh BINDIR EXAMPLESDIR: the example configurations load with
# these binaries (-check-config), in a throwaway root standing in for a
# host: their paths under /etc/fan, /etc/fan-status, /var/lib/fan,
# /etc/asterisk and /var/spool/asterisk are moved below it. Before the files
# they name exist every service must refuse, naming the file; empty stand-ins
# are refused as empty; with real ones (nkey seeds, a CA and certificates
# made here with openssl) every one loads, fan-nats's with the example
# nats-server configuration; a missing tree or state directory, a key
# that is not its certificate's and an interface the host lacks are refused
# by their keys.
set -euo pipefail
bin=${1:?usage: check-examples.sh BINDIR EXAMPLESDIR}
examples=${2:?usage: check-examples.sh BINDIR EXAMPLESDIR}
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "check-examples.sh: $*" >&2; exit 1; }
command -v openssl >/dev/null || fail "openssl not found (Debian: openssl, which ca-certificates pulls in)"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/cfg"
relocate() {
	sed -e "s|/etc/fan/|$root/etc/fan/|g" -e "s|/etc/fan-status/|$root/etc/fan-status/|g" \
		-e "s|/var/lib/fan/|$root/var/lib/fan/|g" -e "s|/etc/asterisk|$root/etc/asterisk|g" \
		-e "s|/var/spool/asterisk|$root/var/spool/asterisk|g" "$@"
}
services=(prober arbiter ipmover replicator scheduler)
for s in "${services[@]}" nats; do
	relocate "$examples/$s.yaml" >"$root/cfg/$s.yaml"
done
# The example's interface is the example host's NIC; this host's loopback
# stands in for it (an absent one is refused below).
sed -i -e 's|^interface: .*|interface: lo|' "$root/cfg/ipmover.yaml"
check() { "$bin/fan-$1" -check-config "$root/cfg/$1.yaml" 2>&1; }

# Nothing there yet: each refuses, naming its bus identity.
for s in "${services[@]}"; do
	if out=$(check "$s"); then fail "$s loaded with none of its files present"; fi
	[[ $out == *"bus.nkey_seed: $root/etc/fan/bus/$s.nk: no such file or directory"* ]] || fail "$s: $out"
done

# Every file a configuration names, as the host's bundle holds it.
mapfile -t files < <(grep -ohE "$root/etc/fan(-status)?/[^ \"',]+" "$root"/cfg/*.yaml | sort -u)
((${#files[@]} > 0)) || fail "the examples name no file under /etc/fan"
for f in "${files[@]}"; do mkdir -p "$(dirname "$f")"; done

# Empty stand-ins are refused by their keys, as empty.
for f in "${files[@]}"; do : >"$f"; done
for s in "${services[@]}"; do
	if out=$(check "$s"); then fail "$s loaded with empty credentials"; fi
	[[ $out == *"bus.nkey_seed: $root/etc/fan/bus/$s.nk is empty"* && $out == *"bus.tls.cert: $root/etc/fan/bus/$s-cert.pem is empty"* ]] ||
		fail "$s with empty files: $out"
done

# What an installed host has: nkey seeds, the bus CA and a certificate and
# key per identity (fanctl writes the same kinds), the state directories
# (the package's tmpfiles.d), Asterisk's directories.
nkey_user_seed() {
	# A NATS user seed: base32 of the seed and user prefixes, 32 random
	# bytes and their CRC-16/XMODEM (little-endian), unpadded.
	local -a b=(149 0)
	local hex crc=0 x i
	hex=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
	for ((i = 0; i < 64; i += 2)); do b+=($((16#${hex:i:2}))); done
	for x in "${b[@]}"; do
		crc=$((crc ^ (x << 8)))
		for ((i = 0; i < 8; i++)); do
			if ((crc & 0x8000)); then crc=$((((crc << 1) ^ 0x1021) & 0xffff)); else crc=$(((crc << 1) & 0xffff)); fi
		done
	done
	b+=($((crc & 0xff)) $((crc >> 8)))
	printf "$(printf '\\x%02x' "${b[@]}")" | base32 -w0 | tr -d '='
}
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=fan bus CA" -days 825 \
	-keyout "$root/ca-key.pem" -out "$root/ca.pem" || fail "openssl: no CA"
leaf() { # leaf CERT KEY: a certificate of the bus CA and its key
	ossl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$(basename "$1" .pem)" -keyout "$2" |
		ossl x509 -req -CA "$root/ca.pem" -CAkey "$root/ca-key.pem" -set_serial "$RANDOM$RANDOM" -days 825 -out "$1" ||
		fail "openssl: no certificate $1"
}
for f in "${files[@]}"; do
	case $f in
	*.nk) nkey_user_seed >"$f" ;;
	*/ca.pem) cp "$root/ca.pem" "$f" ;;
	*-cert.pem) leaf "$f" "${f%-cert.pem}-key.pem" ;;
	*.token) od -An -tx1 -N24 /dev/urandom | tr -d ' \n' >"$f" ;;
	esac
done
# fan-nats's server configuration: the example nats-server.conf (beside the
# examples when installed, in nats/ beside this script in the repository),
# its files moved below the root.
nats_conf=$(grep -oE "^server_config: *[^ #]+" "$root/cfg/nats.yaml" | sed 's/^server_config: *//')
[[ $nats_conf == "$root"/* ]] || fail "nats.yaml names no server_config under /etc/fan: $nats_conf"
nats_example=$examples/nats-server.conf
[[ -f $nats_example ]] || nats_example=$here/nats/nats-server.conf
relocate -e "s|/etc/nats/|$(dirname "$nats_conf")/|g" -e "s|/var/lib/nats|$root/var/lib/fan/nats|g" \
	"$nats_example" >"$nats_conf"
cp "$root/ca.pem" "$(dirname "$nats_conf")/ca.pem"
leaf "$(dirname "$nats_conf")/server-cert.pem" "$(dirname "$nats_conf")/server-key.pem"
mkdir -p "$root/var/lib/fan/ipmover" "$root/var/lib/fan/replicator" "$root/var/lib/fan/nats" \
	"$root/etc/asterisk" "$root/var/spool/asterisk/voicemail"
for s in "${services[@]}" nats; do
	out=$(check "$s") || fail "$s does not load with its files present: $out"
	[[ $out != *warning* ]] || fail "$s warns with fresh certificates: $out"
done

# A mistyped tree, a missing state directory, a key that is another
# identity's and an interface this host lacks are named by their keys.
rmdir "$root/var/spool/asterisk/voicemail"
if out=$(check replicator); then fail "replicator loaded without its voicemail tree"; fi
[[ $out == *"trees[1].path: $root/var/spool/asterisk/voicemail: no such file or directory"* ]] || fail "replicator: $out"
rmdir "$root/var/lib/fan/ipmover"
if out=$(check ipmover); then fail "ipmover loaded without its state directory"; fi
[[ $out == *"state_file: $root/var/lib/fan/ipmover/state.json: its directory"* ]] || fail "ipmover: $out"
mkdir "$root/var/lib/fan/ipmover"
sed -i -e 's|^interface: .*|interface: fan-absent0|' "$root/cfg/ipmover.yaml"
if out=$(check ipmover); then fail "ipmover loaded with an interface this host lacks"; fi
[[ $out == *"interface: fan-absent0 does not exist on this host (it has: "*lo* ]] || fail "ipmover: $out"
cp "$root/etc/fan/bus/scheduler-key.pem" "$root/etc/fan/bus/prober-key.pem"
if out=$(check prober); then fail "prober loaded with another identity's key"; fi
[[ $out == *"bus.tls.key: $root/etc/fan/bus/prober-key.pem is not the key of the certificate in $root/etc/fan/bus/prober-cert.pem"* ]] ||
	fail "prober: $out"

# The status page's file (fanctl's, read as strictly): it loads, and the page
# refuses to start until its token file exists, naming it. (Past that it
# would dial the bus, which is not here.)
relocate "$examples/status.yaml" >"$root/cfg/status.yaml"
token=$(grep -oE "^ *token_file: *[^ #]+" "$root/cfg/status.yaml" | sed 's/^ *token_file: *//')
rm -f "$token"
if out=$("$bin/fanctl" --config "$root/cfg/status.yaml" serve 2>&1); then fail "fanctl serve started without its token file"; fi
[[ $out == *"serve.token_file: token file unusable: stat $token: no such file"* ]] || fail "status: $out"
echo "example configs: ${#services[@]} services and fan-nats load on a host with their files, and name a missing, empty or wrong one; status.yaml loads"
