#!/usr/bin/env bash
# The compose lab's test, on this machine's docker engine: build the static
# binaries and the two images, make the bus's credentials with `fanctl
# nats-config` (creds.sh, into a temporary directory), `up` (NATS with TLS
# and per-service nkeys; the admin provisions the streams), wait until the
# floating IP answers from n1, check every service's /healthz and /metrics,
# show that clients without identity or without TLS are refused, kill n1's
# PBX, wait until the floating IP answers from n2, find the failover in
# `fanctl events`, then `down` and prove nothing is left (containers,
# network, volumes, images).
#
#   deploy/compose/test.sh                 (make compose-test)
#   FAN_BIN=/tmp/bin deploy/compose/test.sh   use binaries already built there
#   COMPOSE="docker compose" ...              the v2 plugin instead of docker-compose
#
# Under CI=true a missing docker is a failure, elsewhere a skip.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
start=$SECONDS

say() { printf '%s compose-test: %s\n' "$(date -u +%H:%M:%S.%3N)" "$*"; }
fail() { say "FAIL: $*"; exit 1; }
skip_or_fail() {
	if [[ -n ${CI:-} ]]; then fail "prerequisite missing under CI: $*"; fi
	say "SKIP: $*"
	exit 0
}

if [[ -z ${COMPOSE:-} ]]; then
	if command -v docker-compose >/dev/null; then COMPOSE=docker-compose
	elif docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"
	else skip_or_fail "neither docker-compose nor the docker compose plugin is installed"; fi
fi
docker info >/dev/null 2>&1 || skip_or_fail "docker engine not reachable"

# A unique project keeps parallel runs and a user's own lab apart; the
# images carry it too so that removing them cannot touch anyone else's.
project="fanct$(date +%s)$$"
repo="fanlab-$project"
export FAN_IMAGE="$repo/fan:test" FAN_STANDIN_IMAGE="$repo/pbx-standin:test" FAN_PBX_IMAGE="$repo/pbx-standin:test"
tmp=$(mktemp -d)
dc() { $COMPOSE -p "$project" -f "$here/docker-compose.yml" "$@"; }

cleanup() {
	rc=$?
	set +e
	if ((rc != 0)); then
		say "logs of the failed run (last 40 lines per service):"
		dc logs --no-color --tail=40 2>&1 | sed 's/^/    /'
	fi
	docker ps -aq --filter "label=fan.compose-test=$project" | xargs -r docker rm -f >/dev/null 2>&1
	dc down -v --remove-orphans >/dev/null 2>&1
	docker rmi -f "$FAN_IMAGE" "$FAN_STANDIN_IMAGE" >/dev/null 2>&1
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT

bin=${FAN_BIN:-}
if [[ -z $bin ]]; then
	bin="$tmp/bin"
	say "building static binaries"
	make -s -C "$root" build BIN="$bin" >/dev/null
fi
say "building images $FAN_IMAGE $FAN_STANDIN_IMAGE (FROM scratch)"
"$here/build-images.sh" "$bin" test "$repo" >/dev/null 2>&1 || "$here/build-images.sh" "$bin" test "$repo"

say "credentials: fanctl nats-config on cluster.yaml (CA, certificates, one nkey per service per host)"
export FAN_CREDS="$tmp/creds"
"$here/creds.sh" "$bin/fanctl" "$FAN_CREDS" >/dev/null

say "up (project $project): NATS with TLS and nkeys, then the admin provisions, then the services"
dc up -d >/dev/null 2>&1 || { dc up -d; exit 1; }

# who answers the floating IP now, as a phone on the lab network sees it
who() { dc exec -T client fan-pbxstandin sip -timeout 300ms 203.0.113.10:5060 2>/dev/null | tr -d '\r' || true; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
	local limit=$1 what=$2 t0=$SECONDS
	shift 2
	until "$@"; do
		((SECONDS - t0 < limit)) || fail "no $what within ${limit}s"
		sleep 0.2
	done
}
answered_by() { [[ $(who) == *"by node $1"* ]]; }

t0=$SECONDS
wait_for 90 "holder (the floating IP answering from n1)" answered_by n1
say "n1 holds 203.0.113.10 ($((SECONDS - t0))s after up)"

# /healthz and /metrics of every service, from the host over the bridge.
http_get() { # http_get HOST PORT PATH: prints the raw response
	exec 3<>"/dev/tcp/$1/$2" || return 1
	printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&3
	timeout 5 cat <&3
	exec 3<&-
}
for svc in prober:203.0.113.11:9101 ipmover:203.0.113.11:9102 replicator:203.0.113.11:9103 \
	prober:203.0.113.12:9101 ipmover:203.0.113.12:9102 replicator:203.0.113.12:9103 \
	arbiter:203.0.113.3:9104 scheduler:203.0.113.4:9105; do
	IFS=: read -r name host port <<<"$svc"
	healthy() { http_get "$host" "$port" /healthz 2>/dev/null | head -1 | grep -q ' 200 '; }
	wait_for 30 "healthy /healthz from $name on $host:$port" healthy
	http_get "$host" "$port" /metrics | grep -q "^fan_build_info{.*service=\"$name\"" ||
		fail "$name on $host:$port: /metrics has no fan_build_info"
done
say "all 8 services answer /healthz 200 and /metrics"

# Strangers on the lab network. Each attempt says what it tried; each must
# be refused by the server for the reason given, never merely fail locally.
net="${project}_lab"
stranger() { # stranger MOUNT FANCTL-ARGS...: fanctl in a fresh container with only MOUNT
	timeout 60 docker run --rm --network "$net" --label "fan.compose-test=$project" \
		-v "$1" "$FAN_IMAGE" fanctl --url tls://nats:4222 "${@:2}" status 2>&1 | tr -d '\r' || true
}
refused() { # refused WHAT PATTERN OUTPUT
	local first
	first=$(grep -m1 -iE "$2" <<<"$3" || true)
	[[ -n $first ]] || { printf '%s\n' "$3" | sed 's/^/    /'; fail "$1: not refused as expected (/$2/)"; }
	say "REFUSED: $1"
	printf '    %s\n' "$(cut -c1-200 <<<"$first")"
}
say "ATTEMPT: fanctl over TLS that trusts the lab's CA but presents no certificate and no nkey"
# --insecure-lab only lifts fanctl's own refusal to connect without an
# identity, so that the server is the one to refuse.
out=$(stranger "$FAN_CREDS/bus/ca/ca.pem:/stranger/ca.pem:ro" --insecure-lab --tls-ca /stranger/ca.pem)
refused "no client certificate: the TLS handshake fails" 'tls error|certificate required|bad certificate' "$out"
say "ATTEMPT: fanctl over TLS with a certificate the lab's CA issued (operator you) but no nkey"
out=$(stranger "$FAN_CREDS/bus/hosts/you:/stranger:ro" --tls-ca /stranger/ca.pem \
	--tls-cert /stranger/operator-cert.pem --tls-key /stranger/operator-key.pem)
refused "a certificate is not an identity: the server wants the nkey" 'authorization violation' "$out"
say "ATTEMPT: plaintext NATS from the host over the bridge: CONNECT and PING without TLS"
exec 3<>/dev/tcp/203.0.113.2/4222 || fail "cannot reach 203.0.113.2:4222 from the host"
info=''
read -r -t 5 info <&3 || true
printf 'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n' >&3
# cat ends at the server's FIN (0) or RST (1: the server closed with our
# bytes unread); timeout's 124 means the connection was still open at 5 s.
rc=0
timeout 5 cat <&3 >"$tmp/plaintext.reply" 2>/dev/null || rc=$?
closed=yes
((rc != 124)) || closed=no
exec 3<&-
[[ $info == *'"tls_required":true'* ]] || fail "the server does not announce tls_required: ${info:0:200}"
grep -aq PONG "$tmp/plaintext.reply" && fail "a plaintext client got a PONG"
[[ $closed == yes ]] || fail "the server kept a plaintext connection open for 5 s"
say "REFUSED: plaintext: INFO says tls_required; the clear-text CONNECT got no PONG and the server closed the connection ($( ((rc == 0)) && echo FIN || echo reset), $(wc -c <"$tmp/plaintext.reply") bytes sent back)"
# The server's own account of the two fanctl attempts (it closes a
# clear-text connection without a log line).
nats_log() { dc logs --no-color nats 2>/dev/null | grep -E 'TLS handshake error|authentication error' || true; }
logged() { [[ $(nats_log | wc -l) -ge 2 ]]; }
wait_for 10 "both refusals in the nats server's log" logged
say "the nats server's log of the refusals:"
nats_log | cut -c1-200 | sed 's/^/    /'

say "FAULT: n1's PBX dies (fan-pbxstandin ctl dead: AMI refuses, SIP port closed)"
fault=$(date +%s%3N)
dc exec -T pbx1 fan-pbxstandin ctl dead >/dev/null
wait_for 30 "answer from n2 after the fault" answered_by n2
# Polled through `docker compose exec` (~100 ms each), so this is an upper
# bound; the client's own log below has the 200 ms-resolution view.
say "203.0.113.10 answers from n2, seen $(($(date +%s%3N) - fault)) ms after the fault"

events() { dc exec -T arbiter fanctl events --since 10m 2>/dev/null | tr -d '\r'; }
chain_recorded() {
	local ev
	ev=$(events)
	grep -E 'health\.transition .*prober@n1 .*->down' <<<"$ev" >/dev/null &&
		grep -E 'arbiter\.decision .*FAILOVER n1->n2' <<<"$ev" >/dev/null &&
		grep -E 'command\.claim_ip .* on n2' <<<"$ev" >/dev/null &&
		grep -E 'command\.result .*ipmover@n2 .*claim_ip on n2: applied' <<<"$ev" >/dev/null &&
		grep -E 'command\.result .*ipmover@n1 .*release_ip on n1: applied' <<<"$ev" >/dev/null
}
wait_for 30 "failover chain in fanctl events (n1 down, FAILOVER n1->n2, claim and release applied)" chain_recorded
say "fanctl events shows the chain:"
events | grep -E 'health\.transition|arbiter\.decision|command\.' | cut -c1-160 | sed 's/^/    /'
say "client's view (docker compose logs client):"
dc logs --no-color client 2>/dev/null | sed 's/^/    /'

say "down"
dc down -v --remove-orphans >/dev/null 2>&1
left=$(docker ps -aq --filter "label=com.docker.compose.project=$project")
[[ -z $left ]] || fail "containers left behind: $left"
left=$(docker network ls -q --filter "label=com.docker.compose.project=$project")
[[ -z $left ]] || fail "networks left behind: $left"
left=$(docker volume ls -q --filter "label=com.docker.compose.project=$project")
[[ -z $left ]] || fail "volumes left behind: $left"
docker rmi -f "$FAN_IMAGE" "$FAN_STANDIN_IMAGE" >/dev/null
left=$(docker images -q "$repo/*")
[[ -z $left ]] || fail "images left behind: $left"
say "PASS in $((SECONDS - start))s; nothing left behind"
