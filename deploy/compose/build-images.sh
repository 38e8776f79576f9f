#!/usr/bin/env bash
# build-images.sh BINDIR [TAG] [REPO]: build the lab's two images from static
# binaries already in BINDIR (`make build BIN=BINDIR`), FROM scratch, so no
# image is pulled. Tags: REPO/fan:TAG and REPO/pbx-standin:TAG (REPO
# defaults to fanlab, TAG to dev).
set -euo pipefail
bin=${1:?usage: build-images.sh BINDIR [TAG] [REPO]}
tag=${2:-dev}
repo=${3:-fanlab}
here=$(cd "$(dirname "$0")" && pwd)

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
for b in fan-prober fan-arbiter fan-ipmover fan-replicator fan-scheduler fan-nats fanctl fan-pbxstandin; do
	[[ -x $bin/$b ]] || { echo "build-images.sh: $bin/$b missing (make build BIN=$bin)" >&2; exit 1; }
	# A dynamically linked binary would not start in an empty image.
	if file "$bin/$b" 2>/dev/null | grep -q 'dynamically linked'; then
		echo "build-images.sh: $bin/$b is dynamically linked; build with CGO_ENABLED=0" >&2
		exit 1
	fi
	cp "$bin/$b" "$ctx/"
done
docker build -q -f "$here/images/fan.Dockerfile" -t "$repo/fan:$tag" "$ctx" >/dev/null
docker build -q -f "$here/images/pbx-standin.Dockerfile" -t "$repo/pbx-standin:$tag" "$ctx" >/dev/null
echo "built $repo/fan:$tag $repo/pbx-standin:$tag"
