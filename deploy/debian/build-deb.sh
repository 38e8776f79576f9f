#!/usr/bin/env bash
# build-deb.sh BINDIR VERSION OUTDIR: the Debian package of fan, built with
# dpkg-deb from `make install-files` (PREFIX=/usr, units in
# /lib/systemd/system), so the package and `make install` cannot disagree.
# VERSION is the Makefile's (deploy/debian/version.sh: 0.2.0 at a release,
# 0.2.0~dev.12.abc1234[.dirty] between them, which dpkg sorts by time); the
# package version is VERSION-1.
set -euo pipefail
bin=${1:?usage: build-deb.sh BINDIR VERSION OUTDIR}
version=${2:?usage: build-deb.sh BINDIR VERSION OUTDIR}
out=${3:?usage: build-deb.sh BINDIR VERSION OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
maintainer=${DEB_MAINTAINER:-fan maintainers <fan@fanpbx.github.io>}

# An upstream version dpkg can order: a digit first, then letters, digits
# and . + ~ (no '-': the revision follows it).
[[ $version =~ ^[0-9][A-Za-z0-9.+~]*$ ]] ||
	{ echo "build-deb.sh: version \"$version\" is not a Debian upstream version (make version prints the right one)" >&2; exit 2; }
debver="$version-1"
arch=$(dpkg --print-architecture)
# Reproducible: every timestamp is the commit's.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$top" log -1 --format=%ct 2>/dev/null || date +%s)}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/fan"
make -s -C "$top" install-files DESTDIR="$root" PREFIX=/usr UNITDIR=/lib/systemd/system \
	BIN="$bin" VERSION="$version" >/dev/null

# Conffiles: the services' environment files (log level, GOMEMLIMIT). The
# YAML configurations are not shipped in /etc: a unit without its
# /etc/fan/<service>.yaml refuses to start, which is what keeps an
# unconfigured package from running anything.
install -d "$root/etc/fan"
for s in prober arbiter ipmover replicator scheduler status; do
	install -m 0644 "$top/deploy/systemd/examples/$s.env" "$root/etc/fan/$s.env"
done

# A manual page per binary: its one-line purpose, its -h text and where the
# full documentation is. Written from the binary, so it cannot drift.
declare -A purpose=(
	[fan-prober]="health checks of this node's Asterisk and its peers"
	[fan-arbiter]="decides when floating addresses move; issues fenced commands"
	[fan-ipmover]="moves floating addresses onto and off this node"
	[fan-replicator]="keeps Asterisk configuration, voicemail and registrations in step"
	[fan-scheduler]="publishes failback permits while a window is open"
	[fanctl]="fan's operator command: events, status, explain, actions"
	[fan-nats]="NATS server with JetStream for fan"
)
mandir="$root/usr/share/man/man1"
install -d "$mandir"
for b in "${!purpose[@]}"; do
	help=$("$root/usr/bin/$b" -h 2>&1 || true)
	{
		echo ".TH ${b^^} 1 \"$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)\" \"fan $version\" \"fan\""
		echo ".SH NAME"
		echo "$b \\- ${purpose[$b]}"
		echo ".SH SYNOPSIS"
		echo ".B $b"
		echo "[\\fIflags\\fR]"
		echo ".SH OPTIONS"
		echo ".nf"
		# roff: a leading dot or quote starts a request; backslashes escape.
		sed -e 's/\\/\\e/g' -e "s/^\([.']\)/\\\\\&\1/" <<<"$help"
		echo ".fi"
		echo ".SH SEE ALSO"
		echo "/usr/share/doc/fan/examples, and the README of each service at"
		echo "https://github.com/fanpbx/fan"
	} | gzip -9n >"$mandir/$b.1.gz"
done

doc="$root/usr/share/doc/fan"
install -m 0644 "$here/copyright" "$doc/copyright"
gzip -9n <"$top/CHANGELOG.md" >"$doc/changelog.gz"
date_r=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
{
	echo "fan ($debver) unstable; urgency=medium"
	echo
	echo "  * Release $version: see /usr/share/doc/fan/changelog.gz."
	echo
	echo " -- $maintainer  $date_r"
} | gzip -9n >"$doc/changelog.Debian.gz"
install -D -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/fan"

install -d "$root/DEBIAN"
install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$root/DEBIAN/"
(cd "$root" && find etc -type f -printf '/%p\n' | sort) >"$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s|@VERSION@|$debver|" -e "s|@ARCH@|$arch|" -e "s|@SIZE@|$size|" -e "s|@MAINTAINER@|$maintainer|" \
	"$here/control" >"$root/DEBIAN/control"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$out"
deb="$out/fan_${debver}_${arch}.deb"
dpkg-deb --root-owner-group -Zgzip --build "$root" "$deb" >/dev/null
echo "$deb"
