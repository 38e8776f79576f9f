#!/usr/bin/env bash
# version.sh [REPO]: the version of the tree at REPO (default: this
# repository), which the Makefile gives every binary (-X main.version) and
# the Debian package (VERSION-1). Versions sort by time, in dpkg's order and
# in SemVer's between releases, so that an upgrade never takes a newer build
# for an older one:
#   at a release tag vX.Y.Z, clean           X.Y.Z
#   anything else                            NEXT~dev.COMMITS.HASH[.dirty]
# NEXT is the VERSION file: the release the work leads to (bumped right after
# tagging). If it still names the last tag's release or an older one, the
# tag's next patch is used, so a forgotten bump cannot sort a build before
# its own release. COMMITS counts the commits since the newest release tag
# (since the root without one), so later commits sort later; HASH is the
# commit; .dirty marks changes to tracked files. '~' sorts before anything,
# the release itself included: 0.1.0 < 0.2.0~dev.5.abc < 0.2.0~dev.12.def
# < 0.2.0 < 0.2.1~dev.1.0ab. Without git (a tarball) COMMITS is 0 and HASH
# "unknown".
#
# version.sh --next-patch VERSION: the same tree one patch later
# (0.2.0 -> 0.2.1, 0.2.0~dev.5.abc -> 0.2.1~dev.5.abc): what make
# systemd-test upgrades to.
set -euo pipefail

semver='^([0-9]+)\.([0-9]+)\.([0-9]+)$'

if [[ ${1:-} == --next-patch ]]; then
	v=${2:?usage: version.sh --next-patch VERSION}
	[[ $v =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)(.*)$ ]] || { echo "version.sh: $v is not X.Y.Z[~...]" >&2; exit 2; }
	echo "${BASH_REMATCH[1]}.${BASH_REMATCH[2]}.$((BASH_REMATCH[3] + 1))${BASH_REMATCH[4]}"
	exit 0
fi

repo=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
next=$(tr -d '[:space:]' <"$repo/VERSION")
[[ $next =~ $semver ]] || { echo "version.sh: $repo/VERSION holds \"$next\", want X.Y.Z" >&2; exit 2; }

# Read-only git: never take the index lock (others may be working in the
# same checkout).
export GIT_OPTIONAL_LOCKS=0
git() { command git -C "$repo" "$@"; }
if ! hash=$(git rev-parse --short=7 HEAD 2>/dev/null); then
	echo "$next~dev.0.unknown"
	exit 0
fi
dirty=""
if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
	dirty=.dirty
fi

# newer A B: A is a later release than B (both X.Y.Z).
newer() {
	local a b i
	IFS=. read -ra a <<<"$1"
	IFS=. read -ra b <<<"$2"
	for i in 0 1 2; do
		((a[i] > b[i])) && return 0
		((a[i] < b[i])) && return 1
	done
	return 1
}

# The newest release tag reachable from HEAD (vX.Y.Z only: no pre-release tags).
if tag=$(git describe --tags --abbrev=0 --match 'v[0-9]*.[0-9]*.[0-9]*' --exclude 'v*-*' --exclude 'v*+*' HEAD 2>/dev/null) &&
	[[ ${tag#v} =~ $semver ]]; then
	released=${tag#v}
	commits=$(git rev-list --count "$tag..HEAD")
	if ((commits == 0)) && [[ -z $dirty ]]; then
		echo "$released"
		exit 0
	fi
	if ! newer "$next" "$released"; then
		next=$("$0" --next-patch "$released")
	fi
else
	commits=$(git rev-list --count HEAD)
fi
echo "$next~dev.$commits.$hash$dirty"
