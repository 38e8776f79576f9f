#!/usr/bin/env bash
# test-install.sh BINDIR DEB: `make install` and `make uninstall` agree with
# the package. Installs with the package's layout (PREFIX=/usr,
# UNITDIR=/lib/systemd/system) under a DESTDIR, compares the file list with
# the package's (the package adds only Debian's own files: copyright,
# changelogs, manual pages, lintian overrides; make install adds only the
# seeded /etc/fan), then uninstalls and checks only /etc/fan is left.
set -euo pipefail
bin=${1:?usage: test-install.sh BINDIR DEB}
deb=${2:?usage: test-install.sh BINDIR DEB}
top=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "test-install.sh: $*" >&2; exit 1; }
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
layout=(PREFIX=/usr UNITDIR=/lib/systemd/system BIN="$bin" DESTDIR="$dest")
make -s -C "$top" install-files "${layout[@]}" >/dev/null
make -s -C "$top" install "${layout[@]}" >/dev/null
installed=$(cd "$dest" && find . -type f | sed 's|^\./||' | grep -v '^etc/fan/' | sort)
packaged=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ {print $6}' | sed 's|^\./||' |
	grep -Ev '^(etc/fan/|usr/share/doc/fan/(copyright|changelog)|usr/share/man/|usr/share/lintian/)' | sort)
if [[ $installed != "$packaged" ]]; then
	diff <(echo "$packaged") <(echo "$installed") >&2 || true
	fail "make install (right) and the package (left) disagree"
fi
[[ -e $dest/usr/lib/sysusers.d/fan.conf ]] || fail "make install did not put sysusers in /usr/lib/sysusers.d"
make -s -C "$top" uninstall "${layout[@]}" >/dev/null
left=$(cd "$dest" && find . -type f | sed 's|^\./||' | grep -v '^etc/fan/' || true)
[[ -z $left ]] || fail "make uninstall left: $left"
[[ -e $dest/etc/fan/arbiter.env ]] || fail "make uninstall removed the units' environment files"
echo "make install/uninstall: $(wc -l <<<"$installed") files, the package's layout"
