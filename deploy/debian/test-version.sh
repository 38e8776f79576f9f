#!/usr/bin/env bash
# test-version.sh: versions sort by time in dpkg's order, so that an upgrade
# never refuses a newer build as a downgrade (make deb-test runs it).
#  1. the scheme's examples, as package versions (VERSION-1), in order;
#  2. version.sh on a throwaway repository through a release's life: dev
#     builds before any tag, the tag, dev builds after it with VERSION
#     bumped and with the bump forgotten, local changes; each version must
#     sort after the one before, and --next-patch after its input;
#  3. the Makefile's VERSION is version.sh's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
fail() { echo "test-version.sh: $*" >&2; exit 1; }
command -v dpkg >/dev/null || fail "dpkg is needed (Debian)"

# lt A B: package version A-1 sorts before B-1 (and both are valid).
lt() {
	local out
	out=$(dpkg --compare-versions "$1-1" lt "$2-1" 2>&1) || fail "dpkg: $1-1 is not before $2-1 $out"
	[[ -z $out ]] || fail "dpkg complains: $out"
}
in_order() {
	local prev="" v
	for v in "$@"; do
		[[ -z $prev ]] || lt "$prev" "$v"
		prev=$v
	done
}

in_order 0.1.0 0.2.0~dev.5.abc 0.2.0~dev.12.def 0.2.0 0.2.1~dev.1.x

repo=$(mktemp -d)
trap 'rm -rf "$repo"' EXIT
g() { git -C "$repo" -c user.name=test -c user.email=test@example.org -c commit.gpgsign=false -c tag.gpgsign=false "$@"; }
n=0
commit() {
	n=$((n + 1))
	echo "$n" >"$repo/file"
	g add -A
	g commit -q -m "change $n"
}
version() { "$here/version.sh" "$repo"; }
expect() { # PATTERN: the current version matches it
	local v
	v=$(version)
	[[ $v =~ ^$1$ ]] || fail "after change $n: version $v, want $1"
	seen+=("$v")
}
seen=()

g init -q
echo 0.1.0 >"$repo/VERSION"
commit
expect '0\.1\.0~dev\.1\.[0-9a-f]{7,}'
commit
commit
expect '0\.1\.0~dev\.3\.[0-9a-f]{7,}'
g tag v0.1.0
expect '0\.1\.0'
# The work towards 0.2.0.
echo 0.2.0 >"$repo/VERSION"
commit
expect '0\.2\.0~dev\.1\.[0-9a-f]{7,}'
echo local >>"$repo/file"
expect '0\.2\.0~dev\.1\.[0-9a-f]{7,}\.dirty'
commit
commit
commit
commit
expect '0\.2\.0~dev\.5\.[0-9a-f]{7,}'
# A pre-release tag is not a release.
g tag v0.2.0-rc1
[[ $(version) == "${seen[-1]}" ]] || fail "the tag v0.2.0-rc1 changed the version to $(version)"
g tag -a -m 'release 0.2.0' v0.2.0
expect '0\.2\.0'
# Local changes on the release are after it.
echo local >>"$repo/file"
expect '0\.2\.1~dev\.0\.[0-9a-f]{7,}\.dirty'
g checkout -q -- file
# VERSION not bumped yet: the tag's next patch.
commit
expect '0\.2\.1~dev\.1\.[0-9a-f]{7,}'
echo 0.3.0 >"$repo/VERSION"
commit
expect '0\.3\.0~dev\.2\.[0-9a-f]{7,}'
in_order "${seen[@]}"

for v in "${seen[@]}"; do
	lt "$v" "$("$here/version.sh" --next-patch "$v")"
done
[[ $("$here/version.sh" --next-patch 0.2.0~dev.5.abc1234) == 0.2.1~dev.5.abc1234 ]] || fail "--next-patch of a dev build"

# Outside git (a tarball): before every dev build of the release.
tarball=$(mktemp -d)
echo 0.2.0 >"$tarball/VERSION"
v=$("$here/version.sh" "$tarball")
rm -rf "$tarball"
[[ $v == 0.2.0~dev.0.unknown ]] || fail "without git: $v"
lt 0.1.0 "$v"
lt "$v" 0.2.0~dev.1.abc

made=$(make -s -C "$top" --no-print-directory version)
[[ $made == "$("$here/version.sh" "$top")" ]] || fail "make version says $made, version.sh $("$here/version.sh" "$top")"
echo "test-version.sh: ${#seen[@]} versions of a release's life in dpkg's order; make version = version.sh ($made)"
