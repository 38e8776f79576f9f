#!/usr/bin/env bash
# test-deb.sh DEBDIR: the checks CI runs on the package `make deb` built.
#  1. lintian: no error (warnings fan accepts are overridden, each with its
#     reason, in lintian-overrides; any other warning fails too).
#  2. install into a throwaway root (dpkg --root, maintainer scripts run
#     chrootless with DPKG_ROOT): every file lands where systemd and the
#     operator look, the postinst created the fan user and /etc/fan's
#     permissions, the binaries report the package's version, fanctl's
#     shell completion is where bash-completion and zsh look for it and
#     completes in bash.
#  3. purge: the files are gone, the state directory too, /etc/fan keeps
#     what the operator wrote.
set -euo pipefail
dir=${1:?usage: test-deb.sh DEBDIR}
debs=("$dir"/fan_*.deb)
((${#debs[@]} == 1)) && [[ -f ${debs[0]} ]] || { echo "test-deb.sh: want one fan_*.deb in $dir" >&2; exit 1; }
deb=${debs[0]}
fail() { echo "test-deb.sh: $*" >&2; exit 1; }

root=$(mktemp -d)
# lintian's own temporary files go here too, so a run leaves nothing in /tmp.
scratch=$(mktemp -d)
trap 'rm -rf "$root" "$scratch"' EXIT

echo "lintian $(basename "$deb")"
lint=$(TMPDIR=$scratch lintian --fail-on error,warning --allow-root "$deb" 2>&1) || { echo "$lint" >&2; fail "lintian found errors or warnings"; }
[[ -z $lint ]] || echo "$lint"

mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/etc"
touch "$root/var/lib/dpkg/status"
# Depends are not installed in an empty root; the maintainer scripts use the
# host's systemd-sysusers and systemd-tmpfiles on DPKG_ROOT.
dpkg_root() { dpkg --root="$root" --force-script-chrootless --force-depends --log=/dev/null "$@"; }
dpkg_root -i "$deb" >/dev/null

want=(
	usr/bin/fan-prober usr/bin/fan-arbiter usr/bin/fan-ipmover usr/bin/fan-replicator usr/bin/fan-scheduler
	usr/bin/fanctl usr/bin/fan-nats
	lib/systemd/system/fan-prober.service lib/systemd/system/fan-arbiter.service lib/systemd/system/fan-ipmover.service
	lib/systemd/system/fan-replicator.service lib/systemd/system/fan-scheduler.service lib/systemd/system/fan-nats.service
	lib/systemd/system/fan-status.service usr/share/doc/fan/examples/status.yaml etc/fan/status.env
	usr/lib/sysusers.d/fan.conf usr/lib/tmpfiles.d/fan.conf
	usr/share/doc/fan/copyright usr/share/doc/fan/changelog.Debian.gz usr/share/doc/fan/changelog.gz
	usr/share/doc/fan/examples/arbiter.yaml usr/share/doc/fan/examples/prober.yaml usr/share/doc/fan/examples/ipmover.yaml
	usr/share/doc/fan/examples/replicator.yaml usr/share/doc/fan/examples/scheduler.yaml usr/share/doc/fan/examples/site.yaml usr/share/doc/fan/examples/nats.yaml
	usr/share/man/man1/fanctl.1.gz usr/share/man/man1/fan-arbiter.1.gz
	usr/share/bash-completion/completions/fanctl usr/share/zsh/vendor-completions/_fanctl
	usr/share/doc/fan/examples/prometheus/fan-alerts.yml usr/share/doc/fan/examples/prometheus/grafana-fan.json
	etc/fan/arbiter.env etc/fan/prober.env
)
for f in "${want[@]}"; do [[ -e $root/$f ]] || fail "$f not installed"; done
[[ -x $root/usr/bin/fan-arbiter ]] || fail "fan-arbiter not executable"
# The units start the packaged binaries, not /usr/local's.
if grep -l /usr/local "$root"/lib/systemd/system/fan-*.service; then fail "a unit still names /usr/local"; fi
grep -q '^ExecStart=/usr/bin/fan-arbiter ' "$root/lib/systemd/system/fan-arbiter.service" || fail "fan-arbiter.service does not start /usr/bin/fan-arbiter"
grep -q '^ExecStart=/usr/bin/fanctl --config /etc/fan-status/status.yaml serve$' "$root/lib/systemd/system/fan-status.service" || fail "fan-status.service does not start /usr/bin/fanctl serve"
# Conffiles are registered as such (an upgrade keeps the operator's edits).
dpkg_root --status fan | grep -q '^ /etc/fan/arbiter.env ' || fail "/etc/fan/arbiter.env is not a conffile"
# postinst: the fan user exists in the root, /etc/fan is root:fan 0750.
grep -q '^fan:' "$root/etc/passwd" || fail "postinst did not create the fan user (sysusers)"
gid=$(awk -F: '$1 == "fan" {print $3}' "$root/etc/group")
[[ -n $gid ]] || fail "postinst did not create the fan group"
[[ $(stat -c '%a %g' "$root/etc/fan") == "750 $gid" ]] || fail "/etc/fan is $(stat -c '%a %U:%G' "$root/etc/fan"), want 750 root:fan (tmpfiles)"
[[ $(stat -c '%a %g' "$root/var/lib/fan/ipmover") == "750 $gid" ]] || fail "/var/lib/fan/ipmover is not fan's 0750 (tmpfiles)"
# The status page's user is apart from the fan group: it may not read the services' seeds.
sgid=$(awk -F: '$1 == "fan-status" {print $3}' "$root/etc/group")
[[ -n $sgid ]] || fail "postinst did not create the fan-status group"
grep -q '^fan:[^:]*:[^:]*:[^:]*:.*fan-status' "$root/etc/group" && fail "fan-status is a member of the fan group"
[[ $(stat -c '%a %g' "$root/etc/fan-status") == "750 $sgid" ]] || fail "/etc/fan-status is $(stat -c '%a %U:%G' "$root/etc/fan-status"), want 750 root:fan-status (tmpfiles)"
[[ -d $root/var/lib/fan/replicator ]] || fail "/var/lib/fan/replicator not created (tmpfiles)"
# The binaries say the version the package carries.
pkgver=$(dpkg-deb -f "$deb" Version)
for b in fan-prober fan-arbiter fan-ipmover fan-replicator fan-scheduler fanctl fan-nats; do
	line=$("$root/usr/bin/$b" --version) || fail "$b --version failed"
	[[ $line =~ ^$b\ [0-9]+\.[0-9]+\.[0-9]+(~dev\.[0-9]+\.[0-9a-z]+(\.dirty)?)?\ \(commit\ [0-9a-f]{7,} ]] || fail "$b --version: $line"
done
upstream=${pkgver%-*}
[[ $("$root/usr/bin/fanctl" --version) == "fanctl $upstream ("* ]] || fail "fanctl --version does not match package version $pkgver"
# The completion scripts are the packaged fanctl's, and work: bash completes
# a command and a flag's file value from them.
[[ $(head -n 1 "$root/usr/share/zsh/vendor-completions/_fanctl") == "#compdef fanctl" ]] || fail "_fanctl is not a zsh completion"
cmp -s "$root/usr/share/bash-completion/completions/fanctl" <("$root/usr/bin/fanctl" completion bash) ||
	fail "the bash completion is not the packaged fanctl's"
got=$(cd "$root/usr/share/doc/fan/examples" && bash -c 'source "$1"; COMP_WORDS=(fanctl --config arbiter.y); COMP_CWORD=2; _fanctl; echo "${COMPREPLY[*]}"; COMP_WORDS=(fanctl stat); COMP_CWORD=1; _fanctl; echo "${COMPREPLY[*]}"' _ "$root/usr/share/bash-completion/completions/fanctl")
[[ $got == $'arbiter.yaml\nstatus' ]] || fail "bash completion from the package: $got"
# The examples the package ships load with the binaries it ships, on a
# host that has the files they name.
"$(dirname "$0")/../systemd/check-examples.sh" "$root/usr/bin" "$root/usr/share/doc/fan/examples" >/dev/null ||
	fail "the packaged examples do not load with the packaged binaries"

# Purge: files gone, state gone, the operator's configuration kept.
echo "node: n1" >"$root/etc/fan/arbiter.yaml"
dpkg_root --purge fan >/dev/null
for f in "${want[@]}"; do
	[[ $f == etc/fan/* ]] && continue
	[[ ! -e $root/$f ]] || fail "$f left after purge"
done
[[ ! -e $root/etc/fan/arbiter.env ]] || fail "conffile /etc/fan/arbiter.env left after purge"
[[ ! -e $root/var/lib/fan ]] || fail "/var/lib/fan left after purge"
[[ -e $root/etc/fan/arbiter.yaml ]] || fail "purge removed the operator's /etc/fan/arbiter.yaml"
echo "deb-test: $(basename "$deb"): lintian clean, ${#want[@]} files installed, user, permissions, versions and examples checked, purged"
