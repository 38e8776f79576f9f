#!/usr/bin/env bash
# verify.sh BINDIR: `systemd-analyze verify` on every unit in this directory,
# with the binaries the units start taken from BINDIR (verify requires the
# executables to exist), and fail on any warning, not only on errors.
set -euo pipefail
bin=${1:?usage: verify.sh BINDIR (make build BIN=BINDIR first)}
bin=$(cd "$bin" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
command -v systemd-analyze >/dev/null || { echo "verify.sh: systemd-analyze not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
units=()
for u in "$here"/*.service; do
	sed "s|/usr/local/bin/|$bin/|g" "$u" >"$tmp/$(basename "$u")"
	units+=("$tmp/$(basename "$u")")
done
((${#units[@]} == 7)) || { echo "verify.sh: want 7 units, found ${#units[@]}" >&2; exit 1; }
out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "${units[@]}" 2>&1) || {
	echo "$out" >&2
	exit 1
}
# Warnings (unknown keys, bad values) do not change the exit status.
if [[ -n $out ]]; then
	echo "$out" >&2
	echo "verify.sh: systemd-analyze verify printed the above; fix the units" >&2
	exit 1
fi
echo "systemd-analyze verify: ${#units[@]} units clean"
# The example configs the units point at must load with today's binaries
# (a key renamed in a service would otherwise ship a broken example), and
# -check-config must name the files they reference when they are missing.
"$here/check-examples.sh" "$bin" "$here/examples"
