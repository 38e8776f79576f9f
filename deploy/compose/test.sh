#!/usr/bin/env bash
# The compose lab's test, on this machine's docker engine: build the static
# binaries and the two images, run `fanctl init` on site.yaml (init.sh, into
# a temporary directory), `up` (three NATS servers with TLS and per-service
# nkeys, the admin provisions the streams at three replicas, then every
# host's services), wait until the floating IP answers from n1, check every
# service's /healthz and /metrics, that the three NATS servers are up and
# that the witness's arbiter leads, that the status page reads the bus,
# show that clients without identity or without TLS are refused, kill n1's
# PBX and see the failover to n2 (the client, `fanctl events`), move the
# address back to n1 as the operator, kill n1's whole host (its NATS server
# with it) and see the failover again, then `down` and prove nothing is
# left (containers, network, volumes, images).
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

say "the site: fanctl init on site.yaml (every host's configuration, CA, certificates, one nkey per service per host)"
export FAN_SITE="$tmp/fan-site"
"$here/init.sh" "$bin/fanctl" "$FAN_SITE" >/dev/null

say "up (project $project): three NATS servers with TLS and nkeys, the admin provisions, then every host's services"
t0=$SECONDS
dc up -d >/dev/null 2>&1 || { dc up -d; exit 1; }
say "up returned after $((SECONDS - t0))s"

# Containers by compose service, for `docker exec`: a compose exec costs a
# second or more with docker-compose 1.29, which would blur the timings.
cid() {
	local id
	id=$(docker ps -aq --filter "label=com.docker.compose.project=$project" --filter "label=com.docker.compose.service=$1")
	[[ -n $id ]] || fail "no container for service $1"
	echo "$id"
}
client=$(cid client)
arbiter=$(cid arbiter)

# who answers the floating IP now, as a phone on the lab network sees it
who() { docker exec "$client" fan-pbxstandin sip -timeout 300ms 203.0.113.10:5060 2>/dev/null | tr -d '\r' || true; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
	local limit=$1 what=$2 t0=$SECONDS
	shift 2
	until "$@"; do
		((SECONDS - t0 < limit)) || fail "no $what within ${limit}s"
		sleep 0.2
	done
}
answered_by() { [[ $(who) == *"by node $1"* ]]; }
now_ms() { date +%s%3N; }

t0=$SECONDS
wait_for 90 "holder (the floating IP answering from n1)" answered_by n1
say "n1 holds 203.0.113.10 ($((SECONDS - t0))s after up returned)"

# /healthz and /metrics of every service, from the host over the bridge
# (the site file's metrics_listen: host puts them on each host's address).
http_get() { # http_get HOST PORT PATH [HEADER]: prints the raw response
	exec 3<>"/dev/tcp/$1/$2" || return 1
	printf 'GET %s HTTP/1.0\r\nHost: %s\r\n%s\r\n' "$3" "$1" "${4:+$4$'\r\n'}" >&3
	timeout 5 cat <&3
	exec 3<&-
}
# The response read whole first: a reader that stops early (grep -q, head)
# would end the pipeline with SIGPIPE, which pipefail counts as failure.
status_line() { # status_line HOST PORT PATH [HEADER]
	local r
	r=$(http_get "$@" 2>/dev/null) || true
	printf '%s\n' "${r%%$'\r'*}"
}
services=0
for svc in prober:203.0.113.11:9101 ipmover:203.0.113.11:9102 replicator:203.0.113.11:9103 arbiter:203.0.113.11:9104 \
	prober:203.0.113.12:9101 ipmover:203.0.113.12:9102 replicator:203.0.113.12:9103 arbiter:203.0.113.12:9104 \
	arbiter:203.0.113.3:9104 scheduler:203.0.113.3:9105; do
	IFS=: read -r name host port <<<"$svc"
	healthy() { [[ $(status_line "$host" "$port" /healthz) == *' 200 '* ]]; }
	wait_for 30 "healthy /healthz from $name on $host:$port" healthy
	[[ $(http_get "$host" "$port" /metrics) == *$'\n'"fan_build_info{"*"service=\"$name\""* ]] ||
		fail "$name on $host:$port: /metrics has no fan_build_info"
	services=$((services + 1))
done
say "all $services services answer /healthz 200 and /metrics (prober, ipmover, replicator, arbiter on n1 and n2; arbiter, scheduler on ctl)"

# The NATS servers' own monitor listens on loopback (init's server
# configuration, as on a host), out of the bridge's reach: as root the test
# asks each server's /healthz from inside its host's network namespace.
# Every arbiter replica also reports each server it hears through the
# system account.
if [[ $(id -u) == 0 ]] && command -v nsenter >/dev/null; then
	for s in ctl nats1 nats2; do
		pid=$(docker inspect -f '{{.State.Pid}}' "$(cid "$s")")
		nats_healthy() { nsenter -t "$pid" -n -- bash -c "$(declare -f http_get status_line); status_line 127.0.0.1 8222 /healthz" | grep ' 200 ' >/dev/null; }
		wait_for 30 "healthy /healthz from the NATS server in $s (127.0.0.1:8222 in its host's namespace)" nats_healthy
	done
	say "the three NATS servers answer /healthz 200 in their hosts' namespaces (JetStream current)"
else
	say "not root (or no nsenter): the NATS servers' own /healthz is not read; the arbiters' report follows"
fi
metric() { http_get "$1" 9104 /metrics 2>/dev/null | tr -d '\r' | grep -E "^$2 " | awk '{print $2}'; }
servers_up() {
	local a s
	for a in 203.0.113.3 203.0.113.11 203.0.113.12; do
		for s in nats-ctl nats-n1 nats-n2; do
			[[ $(metric "$a" "fan_nats_server_up\\{server=\"$s\"\\}") == 1 ]] || return 1
		done
	done
}
wait_for 30 "report of the three NATS servers up from all three arbiter replicas" servers_up
say "NATS: nats-ctl, nats-n1 and nats-n2 up, as each of the three arbiter replicas sees them (fan_nats_server_up)"

# The witness's replica leads; the PBX hosts' stand by (standby: true),
# whichever started first: a standby hands the lease back once it hears
# the witness's replica.
witness_leads() {
	[[ $(metric 203.0.113.3 fan_arbiter_leader) == 1 && $(metric 203.0.113.11 fan_arbiter_leader) == 0 &&
		$(metric 203.0.113.12 fan_arbiter_leader) == 0 ]]
}
wait_for 30 "lease held by the witness's arbiter (fan_arbiter_leader 1 on ctl, 0 on n1 and n2)" witness_leads
epoch=$(metric 203.0.113.3 fan_arbiter_epoch)
say "the arbiter leader is the witness's: fan_arbiter_leader 1 on ctl (epoch $epoch), 0 on n1 and n2"

# The status page reads the bus as the viewer, behind its token.
token=$(<"$FAN_SITE/secrets/page.token")
page_holder() { [[ $(http_get 203.0.113.3 9110 /api/status "Authorization: Bearer $token" 2>/dev/null) == *'"holder":"n1"'* ]]; }
wait_for 30 "status page showing n1 as holder (http://203.0.113.3:9110/api/status)" page_holder
[[ $(status_line 203.0.113.3 9110 /api/status) == *' 401 '* ]] || fail "the status page answered /api/status without its token"
say "status page: /api/status shows holder n1 with the token, 401 without"

# Strangers on the lab network. Each attempt says what it tried; each must
# be refused by the server for the reason given, never merely fail locally.
net="${project}_lab"
stranger() { # stranger MOUNT FANCTL-ARGS...: fanctl in a fresh container with only MOUNT
	timeout 60 docker run --rm --network "$net" --label "fan.compose-test=$project" \
		-v "$1" "$FAN_IMAGE" fanctl --url tls://203.0.113.3:4222 "${@:2}" status 2>&1 | tr -d '\r' || true
}
refused() { # refused WHAT PATTERN OUTPUT
	local first
	first=$(grep -m1 -iE "$2" <<<"$3" || true)
	[[ -n $first ]] || { printf '%s\n' "$3" | sed 's/^/    /'; fail "$1: not refused as expected (/$2/)"; }
	say "REFUSED: $1"
	printf '    %s\n' "$(cut -c1-200 <<<"$first")"
}
# The two fanctl attempts run side by side: a fresh container takes seconds
# to start here.
say "ATTEMPT: fanctl over TLS that trusts the lab's CA but presents no certificate and no nkey"
# --insecure-lab only lifts fanctl's own refusal to connect without an
# identity, so that the server is the one to refuse.
stranger "$FAN_SITE/people/you/ca.pem:/stranger/ca.pem:ro" --insecure-lab --tls-ca /stranger/ca.pem >"$tmp/nocert.out" &
say "ATTEMPT: fanctl over TLS with a certificate the lab's CA issued (operator you) but no nkey"
stranger "$FAN_SITE/people/you:/stranger:ro" --tls-ca /stranger/ca.pem \
	--tls-cert /stranger/operator-cert.pem --tls-key /stranger/operator-key.pem >"$tmp/nonkey.out" &
wait
refused "no client certificate: the TLS handshake fails" 'tls error|certificate required|bad certificate' "$(<"$tmp/nocert.out")"
refused "a certificate is not an identity: the server wants the nkey" 'authorization violation' "$(<"$tmp/nonkey.out")"
say "ATTEMPT: plaintext NATS from the host over the bridge: CONNECT and PING without TLS"
exec 3<>/dev/tcp/203.0.113.3/4222 || fail "cannot reach 203.0.113.3:4222 from the host"
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
nats_log() { docker logs "$(cid ctl)" 2>&1 | grep -E 'TLS handshake error|authentication error' || true; }
logged() { [[ $(nats_log | wc -l) -ge 2 ]]; }
wait_for 10 "both refusals in the witness's NATS server's log" logged
say "the witness's NATS server's log of the refusals:"
nats_log | cut -c1-200 | sed 's/^/    /'

events() { docker exec "$arbiter" fanctl events --since 10m 2>/dev/null | tr -d '\r'; }
has() { grep -E "$1" <<<"$2" >/dev/null; }

say "FAULT: n1's PBX dies (fan-pbxstandin ctl dead: AMI refuses, SIP port closed)"
fault=$(now_ms)
docker exec "$(cid pbx1)" fan-pbxstandin ctl dead >/dev/null
wait_for 30 "answer from n2 after the fault" answered_by n2
# Polled through docker exec (~100 ms each), so this is an upper bound;
# the client's own log below has the 200 ms-resolution view.
say "203.0.113.10 answers from n2, seen $(($(now_ms) - fault)) ms after the fault"
chain_recorded() {
	local ev
	ev=$(events)
	has 'health\.transition .*prober@n1 .*->down' "$ev" &&
		has 'arbiter\.decision .*arbiter@ctl .*FAILOVER n1->n2: holder n1 reports' "$ev" &&
		has 'command\.claim_ip .* on n2' "$ev" &&
		has 'command\.result .*ipmover@n2 .*claim_ip on n2: applied' "$ev" &&
		has 'command\.result .*ipmover@n1 .*release_ip on n1: applied' "$ev"
}
wait_for 30 "failover chain in fanctl events (n1 down, FAILOVER n1->n2, claim and release applied)" chain_recorded
say "fanctl events shows the chain:"
events | grep -E 'health\.transition .*->down|arbiter\.decision .*FAILOVER|command\.' | cut -c1-160 | sed 's/^/    /'

say "n1's PBX recovers; the operator you moves the address back: fanctl switchover --to n1 --now"
docker exec "$(cid pbx1)" fan-pbxstandin ctl normal >/dev/null
# Refused (exit 3) until n1 is healthy again: rise 2 at 200 ms.
switch_back() { docker exec "$arbiter" fanctl switchover --to n1 --now --reason "compose-test: n1 is back" >/dev/null 2>&1; }
wait_for 30 "switchover to n1 accepted" switch_back
wait_for 30 "answer from n1 after the switchover" answered_by n1
has 'operator\.action .*switchover .* by you' "$(events)" || fail "the trail does not record the switchover as done by you"
say "n1 holds 203.0.113.10 again; the trail records the switchover as done by you"

say "FAULT: n1's whole host crashes (SIGKILL: its PBX, NATS server, standby arbiter, prober, ipmover, replicator)"
n1=()
for s in pbx1 nats1 arbiter1 prober1 ipmover1 replicator1; do n1+=("$(cid "$s")"); done
fault=$(now_ms)
# One `docker kill` per container, at once: a single call kills them one
# after the other.
for id in "${n1[@]}"; do docker kill "$id" >/dev/null & done
wait
wait_for 30 "answer from n2 after n1's host crashed" answered_by n2
say "203.0.113.10 answers from n2, seen $(($(now_ms) - fault)) ms after the crash"
host_chain() {
	local ev
	ev=$(events)
	has 'arbiter\.decision .*arbiter@ctl .*FAILOVER n1->n2: holder n1 is silent on the bus and peers cannot reach it' "$ev" &&
		[[ $(grep -cE 'command\.result .*ipmover@n2 .*claim_ip on n2: applied' <<<"$ev") -ge 2 ]]
}
wait_for 30 "second failover in fanctl events (n1 silent and unreachable, FAILOVER n1->n2, claim applied)" host_chain
say "fanctl events shows it:"
events | grep -E 'health\.transition .*prober@n2 .*peer-n1.*->down|arbiter\.decision .*silent|command\.result .*ipmover@n2' |
	tail -n 3 | cut -c1-160 | sed 's/^/    /'
[[ $(metric 203.0.113.3 fan_arbiter_leader) == 1 ]] || fail "the witness's arbiter no longer leads after n1's host crashed"
say "the witness's arbiter still leads (epoch $epoch before, $(metric 203.0.113.3 fan_arbiter_epoch) after)"

say "client's view (its log):"
docker logs "$client" 2>&1 | tr -d '\r' | sed 's/^/    /'

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
