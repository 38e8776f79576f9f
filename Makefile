# fan: failover for Asterisk PBX servers on NATS JetStream.
#   make build   static binaries in bin/
#   make test    go vet, staticcheck, gofmt check, one version of each dependency, every module's tests with -race (root: also the namespace end-to-end test)
#   make lab     the namespace lab: a real failover, printed as a timeline
#   make deps    install what the lab and the tests need on Debian 12 (root)
#   make bench-failover  fan and keepalived side by side in namespaces (CYCLES=30, FLAP=5m)
#   make bench-trail     bytes fan writes to its audit and live streams per PBX node per day (TRAIL=2m, root)
#   make bench-scale     the arbiter and fan-nats under 1,000 simulated nodes: CPU, memory, transition-to-command p50/p99 (NODES=1000, SCALE_WINDOW=60s)
#   make bench-prober    the prober's CPU for 200 checks at 200 ms against the floor and a process per check (PROBER_WINDOW=10s)
#   make bench-sync      the replicator against rsync (local, and -az over SSH as root) and a plain checked copy: initial sync of 10,000 files / 1 GiB, no-change pass, change to visible; then a 50,000-file spool: change to visible, CPU and memory per node (SPOOL_FILES)
#   make bench-registrations  registrations from the holder to the standby: 200 OK to the standby's AstDB, costs, mass churn, reach after a crash (PHONES=2000, root; FAN_ASTERISK=dir for a real Asterisk 22)
#   make bench-calls     calls up when the holder's PBX is killed, fan and keepalived: survived, audio gap, hang-ups carried, orphaned legs (CALLS_DIRECT=10 CALLS_ANCHORED=2 CALL_CYCLES=3, root; FAN_ASTERISK=dir for a real Asterisk 22)
#   make chaos           randomized faults against the invariants (DURATION=10m); exits non-zero on a breach
#   make install         binaries, systemd units, fanctl's shell completion and example configs under DESTDIR/PREFIX (make uninstall)
#   make deb             the Debian package in build/ (make deb-test: version ordering, lintian, install into a throwaway root)
#   make version         the version the binaries and the package get (DEVELOPING.md, "Versions and releases")
#   make prometheus-rules  promtool check and test of deploy/prometheus's alert rules
#   make images          the compose lab's images (FROM scratch, nothing pulled)
#   make compose-creds   the compose lab's site: fanctl init on deploy/compose/site.yaml into deploy/compose/fan-site/
#   make compose-test    the compose lab: up, a failover, down (docker)
#   make systemd-verify  systemd-analyze verify on every unit
#   make systemd-test    the package and its units under a real systemd (a Debian 12 container; docker, debootstrap)
#   make fuzz            every parser's fuzz target, FUZZTIME each (default 30s)

SHELL       := /bin/bash
# The version every binary's --version prints and the Debian package carries
# (deploy/debian/version.sh; DEVELOPING.md, "Versions and releases"): X.Y.Z
# at a release tag vX.Y.Z, otherwise NEXT~dev.COMMITS.HASH[.dirty], where
# NEXT is the VERSION file (the release being worked towards) and COMMITS
# counts the commits since the last release tag (since the root without
# one), so builds sort by time in dpkg's order: 0.1.0 < 0.2.0~dev.5.abc1234
# < 0.2.0~dev.12.def5678 < 0.2.0 < 0.2.1~dev.1.0123abc. make version prints
# it. COMMIT is printed by every binary's --version too.
ifeq ($(origin VERSION),undefined)
VERSION     := $(shell deploy/debian/version.sh $(CURDIR))
$(if $(VERSION),,$(error deploy/debian/version.sh found no version))
endif
ifeq ($(origin COMMIT),undefined)
COMMIT      := $(or $(shell git rev-parse --short=12 HEAD 2>/dev/null),unknown)
endif
LDFLAGS     := -s -w -X main.version=$(VERSION) \
	-X github.com/fanpbx/fan/pkg/platform/daemon.Commit=$(COMMIT) \
	-X github.com/fanpbx/fan/cmd/internal/fanctl.Commit=$(COMMIT)
GOBUILD     := CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)'
BIN         := $(CURDIR)/bin
PKGS        := github.com/fanpbx/fan/...
TESTFLAGS   ?= -race -count=1 -timeout 20m

# binary => module directory and package inside it
BINARIES := \
	fan-prober:services/prober:./cmd/fan-prober \
	fan-arbiter:services/arbiter:./cmd/fan-arbiter \
	fan-ipmover:services/ipmover:./cmd/fan-ipmover \
	fan-replicator:services/replicator:./cmd/fan-replicator \
	fan-scheduler:services/scheduler:./cmd/fan-scheduler \
	fanctl:cmd:./fanctl \
	fan-nats:cmd:./fan-nats \
	fan-amipeer:lab:./cmd/fan-amipeer \
	fan-pbxstandin:lab:./cmd/fan-pbxstandin \
	fan-lab:lab:./cmd/fan-lab \
	fan-bench:lab:./cmd/fan-bench \
	fan-chaos:lab:./cmd/fan-chaos

TRAIL ?= 2m
.PHONY: all build test vet lint fmt-check unit lab clean modules-standalone deps-check fuzz deps install install-files uninstall deb deb-test version prometheus-rules images compose-creds compose-test systemd-verify bench-failover bench-calls bench-trail bench-prober bench-sync bench-scale bench-registrations chaos

all: build

# The version the binaries and the package get (see VERSION above).
version:
	@echo '$(VERSION)'

build:
	@mkdir -p $(BIN)
	@set -e; for spec in $(BINARIES); do \
		IFS=: read -r name dir pkg <<< "$$spec"; \
		echo "build $$name"; \
		(cd $$dir && $(GOBUILD) -o $(BIN)/$$name $$pkg); \
	done

vet:
	go vet $(PKGS)

# staticcheck, pinned, with every check (staticcheck.conf); make deps
# installs it, and lint installs it when it is missing or another version.
STATICCHECK_VERSION := v0.8.2
STATICCHECK         := $(or $(shell go env GOBIN),$(firstword $(subst :, ,$(shell go env GOPATH)))/bin)/staticcheck
lint:
	@$(STATICCHECK) -version 2>/dev/null | grep -qF '($(STATICCHECK_VERSION:v%=%))' || \
		go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(STATICCHECK) $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Every module must build on its own (its go.mod replaces, not go.work).
modules-standalone:
	@set -e; for m in $$(go list -m -f '{{.Dir}}'); do \
		echo "standalone build $${m#$(CURDIR)/}"; \
		(cd $$m && GOWORK=off go build ./... && GOWORK=off go vet ./... >/dev/null); \
	done

# Every module compiles the same version of each dependency (each also
# builds alone, so one left behind would ship its own); lab/depcheck.
deps-check:
	go run ./lab/cmd/fan-depcheck

unit: build
	FAN_BIN=$(BIN) go test $(TESTFLAGS) $(PKGS)

test: vet lint fmt-check modules-standalone deps-check unit

# Fuzz every parser, one target after the other, FUZZTIME each (default
# 30s; CI runs a short pass). A crash is saved under the package's
# testdata/fuzz/<target>/: commit it as a seed with the fix.
# FUZZTIME is a duration (30s) or a count of inputs (10000x). CI gives a
# count: with a duration, Go 1.26's fuzz coordinator can report its own
# stop at the deadline as "context deadline exceeded", a failure with no
# crasher (go.dev/issue/75804, fixed in Go 1.27); a count has no deadline.
FUZZTIME ?= 30s
# Minimising each new interesting input may take 60 s by default, which
# stalled whole short runs; 1 s keeps the time for fuzzing.
FUZZMINIMIZETIME ?= 1s
FUZZ_TARGETS := \
	pkg/events:FuzzDecode \
	pkg/events:FuzzContentRequest \
	pkg/ami:FuzzReader \
	pkg/sipoptions:FuzzParseMessage \
	pkg/platform/config:FuzzParse \
	services/prober/internal/app:FuzzConfig \
	services/arbiter/internal/httphb:FuzzHeartbeatBody \
	services/replicator/internal/fstree:FuzzDecodeManifest \
	services/ipmover/internal/fence:FuzzOpen \
	services/ipmover/internal/keeper:FuzzParseMessage \
	services/ipmover/internal/keeper:FuzzCapture
fuzz:
	@set -e; for spec in $(FUZZ_TARGETS); do \
		IFS=: read -r dir target <<< "$$spec"; \
		echo "fuzz $$dir $$target ($(FUZZTIME))"; \
		(cd $$dir && go test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) .); \
	done

lab: build
	$(BIN)/fan-lab -bin $(BIN)

# Failover time from the client's side, fan and keepalived in the same
# topology and run: pbx-death, node-crash, link-cut, then the flap scenario.
# TOPOLOGY=colocated|dedicated runs fan on a three-server NATS cluster;
# LEADERS=forced moves every raft leader and the arbiter lease onto the
# crashing node before each node-crash.
CYCLES   ?= 30
FLAP     ?= 5m
TOPOLOGY ?= single
LEADERS  ?= fan
# What fan writes to its streams at the lab's check rates (root).
bench-trail: build
	$(BIN)/fan-bench -bin $(BIN) -trail $(TRAIL)

# The arbiter (fan-arbiter, a process of its own) and fan-nats under NODES
# simulated nodes in groups of two and three (services/arbiter/internal/
# nodesim): CPU in cores, resident memory, and the time from a health
# transition to its command stored in FAN_CMD, over SCALE_WINDOW of
# SCALE_RATE transitions a second. SCALE_PROFILE=dir also saves the
# arbiter's CPU and allocation profiles over the window.
NODES         ?= 1000
SCALE_WINDOW  ?= 60s
SCALE_RATE    ?= 4
SCALE_PROFILE ?=
bench-scale:
	@mkdir -p $(BIN)
	cd services/arbiter && $(GOBUILD) -o $(BIN)/fan-arbiter ./cmd/fan-arbiter
	cd cmd && $(GOBUILD) -o $(BIN)/fan-nats ./fan-nats
	cd services/arbiter && go test -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x -timeout 30m ./internal/nodesim \
		-args -scale.bin=$(BIN) -scale.nodes=$(NODES) -scale.window=$(SCALE_WINDOW) -scale.rate=$(SCALE_RATE) -scale.profile=$(if $(SCALE_PROFILE),$(abspath $(SCALE_PROFILE)))

bench-failover: build
	$(BIN)/fan-bench -bin $(BIN) -cycles $(CYCLES) -flap $(FLAP) -topology $(TOPOLOGY) -leaders $(LEADERS)

# Calls in progress when the holder's PBX is killed (kill -9), fan and
# keepalived moving the same address in the same topology (lab/bench,
# calls.go): CALLS_DIRECT calls with direct media and CALLS_ANCHORED with
# their audio through the PBX, kept CALLS_HOLD after the failover, then hung
# up. FAN_ASTERISK names an Asterisk 22 install to run as the PBXs instead of
# fan-pbxstandin.
CALLS_DIRECT   ?= 10
CALLS_ANCHORED ?= 2
CALLS_HOLD     ?= 10s
CALL_CYCLES    ?= 3
bench-calls: build
	$(BIN)/fan-bench -bin $(BIN) -scenarios calls -flap 0 -cycles $(CALL_CYCLES) -calls-direct $(CALLS_DIRECT) \
		-calls-anchored $(CALLS_ANCHORED) -calls-hold $(CALLS_HOLD) -topology $(TOPOLOGY) $(if $(FAN_ASTERISK),-asterisk $(FAN_ASTERISK))

# The prober's own cost: the real binary, 200 checks at 200 ms against
# local peers, CPU share of one core over PROBER_WINDOW, against two
# references running the same checks at the same rate (lab/probefloor): the
# floor, the probes' socket work alone, and a process per check as
# keepalived's vrrp_script runs them; then each kind alone (see the
# prober's README, "Cost").
PROBER_WINDOW ?= 10s
bench-prober:
	cd services/prober && go test -run '^$$' -bench Prober200 -benchtime 1x ./internal/app -args -prober.window=$(PROBER_WINDOW)

# The replicator against local rsync on the same data, in the same run
# (see the replicator's README, "Performance"; root drops the page cache
# first). As root, with OpenSSH installed (not in DEB_PACKAGES: only this
# benchmark needs it; apt-get install openssh-server openssh-client rsync),
# it also times rsync -az --delete over SSH between two network namespaces,
# with an sshd and keys made for the run and removed after it. SYNC_FILES and SYNC_BYTES size the tree; the initial sync's
# figures are the medians of SYNC_RUNS alternated runs of both tools. Then a voicemail spool of SPOOL_FILES files
# (SPOOL_BYTES in all) is synced and each replicator, a process of its own, is measured quiet and under one change a
# second: change to visible on the standby (adds, deletes, edits), CPU and memory per node (BenchmarkSpool).
# SPOOL_CHANGES_FOR (a duration such as 25m) makes that phase last as long, cycling adds, edits and
# deletes so the tree keeps its size, for memory's slope over time; empty keeps the 70 changes.
SYNC_FILES  ?= 10000
SYNC_BYTES  ?= 1073741824
SYNC_RUNS   ?= 3
SPOOL_FILES ?= 50000
SPOOL_BYTES ?= 524288000
SPOOL_CHANGES_FOR ?=
bench-sync:
	cd services/replicator && FAN_BENCH_FILES=$(SYNC_FILES) FAN_BENCH_BYTES=$(SYNC_BYTES) FAN_BENCH_RUNS=$(SYNC_RUNS) \
		FAN_BENCH_SPOOL_FILES=$(SPOOL_FILES) FAN_BENCH_SPOOL_BYTES=$(SPOOL_BYTES) FAN_BENCH_SPOOL_CHANGES_FOR=$(SPOOL_CHANGES_FOR) \
		go test -run '^$$' -bench 'VersusRsync|Spool' -benchtime 1x -timeout 3h ./internal/replicate

# Registrations carried from the holder to the standby (lab/regbench, a
# network namespace of its own): PHONES phones registered through SIPp and
# re-registering, the replicators' costs, 30 % unregistering at once, and
# the share of phones the new holder reaches after a crash. FAN_ASTERISK
# names an Asterisk 22 install to run as both PBXs instead of the stand-in.
PHONES ?= 2000
bench-registrations:
	@mkdir -p $(BIN)
	cd cmd && $(GOBUILD) -o $(BIN)/fan-nats ./fan-nats
	cd services/replicator && $(GOBUILD) -o $(BIN)/fan-replicator ./cmd/fan-replicator
	cd lab && $(GOBUILD) -o $(BIN)/fan-pbxstandin ./cmd/fan-pbxstandin && $(GOBUILD) -o $(BIN)/fan-regbench ./cmd/fan-regbench
	$(BIN)/fan-regbench -bin $(BIN) -phones $(PHONES) $(if $(FAN_ASTERISK),-asterisk $(FAN_ASTERISK))

# Randomized faults (kill -9 of services, NATS restarts, frozen PBX, link
# cuts, NATS-only partitions) with ARP and SIP observers; see lab/chaos.
# TOPOLOGY=colocated runs it on a three-server bus (a NATS server on each
# PBX node and on the witness) and adds one server's kill -9 and route cut.
DURATION ?= 10m
chaos: build
	$(BIN)/fan-chaos -bin $(BIN) -duration $(DURATION) -topology $(TOPOLOGY)

# Debian packages: Kamailio (the SIP server answering on the floating IP in
# the lab), SIPp, curl (the pool lab's nodes post their heartbeats with
# it), iproute2 for namespaces; lintian, fakeroot and systemd
# (systemd-sysusers, systemd-tmpfiles) for make deb-test; debootstrap for
# make systemd-test's container image; prometheus for
# promtool (make prometheus-rules); zsh to check fanctl's completion script;
# openssl and coreutils (base32) for the examples' throwaway credentials
# (deploy/systemd/check-examples.sh).
DEB_PACKAGES := kamailio sip-tester curl iproute2 iptables procps bind9 bind9-utils keepalived rsync ca-certificates git make \
	lintian fakeroot systemd prometheus zsh chromium debootstrap openssl coreutils
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	cd $(CURDIR) && for m in $$(go list -m -f '{{.Dir}}'); do (cd $$m && go mod download); done
	go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Production install: the five services, fanctl and fan-nats, one systemd
# unit per service, the fan user (sysusers.d) and /etc/fan's permissions
# (tmpfiles.d), the examples under $(DOCDIR)/examples. The Debian package
# (make deb) is exactly `install-files` with PREFIX=/usr and
# UNITDIR=/lib/systemd/system (it installs what `make build` made).
# `install` builds, installs the files, seeds /etc/fan with the
# examples (never overwriting an operator's: a changed one lands as
# *.example) and, on a live system, creates the user and reloads systemd.
# sysusers.d and tmpfiles.d go under /usr/lib whatever PREFIX is: systemd
# reads them only from /usr/lib, /etc and /run, never /usr/local.
# fanctl's shell completion is written by the fanctl just built (fanctl
# completion bash|zsh), where bash-completion and zsh look: zsh's
# vendor-completions for /usr (Debian's place for packages), site-functions
# elsewhere.
PREFIX      ?= /usr/local
DESTDIR     ?=
SYSCONFDIR  ?= /etc
UNITDIR     ?= /etc/systemd/system
SYSUSERSDIR ?= /usr/lib/sysusers.d
TMPFILESDIR ?= /usr/lib/tmpfiles.d
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR  ?= $(PREFIX)/share/zsh/$(if $(filter /usr,$(PREFIX)),vendor-completions,site-functions)
DOCDIR      ?= $(PREFIX)/share/doc/fan
SERVICES    := prober arbiter ipmover replicator scheduler
# One unit per service, fan-nats's (a host may run the stock nats-server
# instead) and the status page's (fan-status: fanctl serve).
UNITS       := $(SERVICES) nats status
INSTALLED_BINARIES := $(addprefix fan-,$(SERVICES)) fanctl fan-nats
EXAMPLES    := $(wildcard deploy/systemd/examples/*.yaml deploy/systemd/examples/*.env)
install-files:
	@test -x $(BIN)/fanctl || { echo 'install-files: no binaries in $(BIN) (make build first)' >&2; exit 1; }
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR)/examples
	@set -e; for b in $(INSTALLED_BINARIES); do install -m 0755 $(BIN)/$$b $(DESTDIR)$(PREFIX)/bin/$$b; done
	@set -e; for s in $(UNITS); do \
		sed 's|/usr/local/bin/|$(PREFIX)/bin/|g' deploy/systemd/fan-$$s.service > $(DESTDIR)$(UNITDIR)/fan-$$s.service; \
		chmod 0644 $(DESTDIR)$(UNITDIR)/fan-$$s.service; \
	done
	install -m 0644 $(EXAMPLES) deploy/systemd/nats/nats-server.conf $(DESTDIR)$(DOCDIR)/examples/
	install -d $(DESTDIR)$(DOCDIR)/examples/prometheus
	install -m 0644 deploy/prometheus/fan-alerts.yml deploy/prometheus/grafana-fan.json deploy/prometheus/README.md $(DESTDIR)$(DOCDIR)/examples/prometheus/
	install -d $(DESTDIR)$(DOCDIR)/examples/asterisk
	install -m 0644 $(wildcard deploy/asterisk/*) $(DESTDIR)$(DOCDIR)/examples/asterisk/
	install -D -m 0644 deploy/systemd/fan.sysusers.conf $(DESTDIR)$(SYSUSERSDIR)/fan.conf
	install -D -m 0644 deploy/systemd/fan.tmpfiles.conf $(DESTDIR)$(TMPFILESDIR)/fan.conf
	install -d $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR)
	$(BIN)/fanctl completion bash > $(DESTDIR)$(BASHCOMPDIR)/fanctl
	$(BIN)/fanctl completion zsh > $(DESTDIR)$(ZSHCOMPDIR)/_fanctl
	chmod 0644 $(DESTDIR)$(BASHCOMPDIR)/fanctl $(DESTDIR)$(ZSHCOMPDIR)/_fanctl

install: build
	$(MAKE) --no-print-directory install-files
	install -d $(DESTDIR)$(SYSCONFDIR)/fan
	@# The units' process environments; the configurations are fanctl
	@# init's, installed by fanctl install-host.
	@set -e; for f in $(notdir $(filter %.env,$(EXAMPLES))); do \
		[ -e $(DESTDIR)$(SYSCONFDIR)/fan/$$f ] || install -m 0644 deploy/systemd/examples/$$f $(DESTDIR)$(SYSCONFDIR)/fan/$$f; \
	done
	@# On a live system (no DESTDIR): what the package's postinst does.
	@if [ -z "$(DESTDIR)" ] && command -v systemd-sysusers >/dev/null; then \
		systemd-sysusers fan.conf && systemd-tmpfiles --create fan.conf; \
		if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi; \
	fi
	@echo "installed under $(DESTDIR)$(PREFIX); next: fanctl init and fanctl install-host (deploy/systemd/README.md)"

# Removes what install-files put in place; keeps /etc/fan (configuration,
# credentials), /var/lib/fan (state) and the fan user, as `apt remove` does.
uninstall:
	@set -e; for s in $(UNITS); do \
		if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl disable --now fan-$$s.service 2>/dev/null || true; fi; \
		rm -f $(DESTDIR)$(UNITDIR)/fan-$$s.service; \
	done
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(INSTALLED_BINARIES))
	rm -f $(DESTDIR)$(SYSUSERSDIR)/fan.conf $(DESTDIR)$(TMPFILESDIR)/fan.conf
	rm -f $(DESTDIR)$(BASHCOMPDIR)/fanctl $(DESTDIR)$(ZSHCOMPDIR)/_fanctl
	rm -rf $(DESTDIR)$(DOCDIR)
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "kept $(DESTDIR)$(SYSCONFDIR)/fan, /var/lib/fan and the fan user; remove them by hand to purge"

# The Debian package: build/fan_<version>_<arch>.deb from install-files.
# deb-test checks that versions sort by time in dpkg's order
# (test-version.sh), runs lintian on the package (errors fail; the overrides
# say why each remaining warning stays), installs it into a throwaway root,
# checks every file landed and the maintainer scripts ran, then purges it.
DEB_DIR     ?= $(CURDIR)/build
deb: build
	rm -f $(DEB_DIR)/fan_*.deb
	deploy/debian/build-deb.sh "$(BIN)" "$(VERSION)" "$(DEB_DIR)"

# Alert rules and dashboard (deploy/prometheus): promtool check rules,
# promtool test rules, and every queried metric exists in the code.
prometheus-rules:
	deploy/prometheus/check.sh

deb-test: deb
	deploy/debian/test-version.sh
	deploy/debian/test-deb.sh "$(DEB_DIR)"
	deploy/debian/test-install.sh "$(BIN)" $(DEB_DIR)/fan_*.deb

# The compose lab's images, built FROM scratch from the static binaries.
FAN_TAG     ?= dev
images: build
	deploy/compose/build-images.sh $(BIN) $(FAN_TAG)

# The compose lab's configuration and credentials, made by `fanctl init` from
# the lab's site file as an installation makes them, into
# deploy/compose/fan-site/ (git-ignored; kept and reused by later runs).
compose-creds: build
	deploy/compose/init.sh $(BIN)/fanctl

# Builds its own binaries, images and credentials under a unique project
# name, runs a failover, shows that clients without identity or TLS are
# refused, and removes everything it made (containers, network, images).
compose-test:
	deploy/compose/test.sh

systemd-verify: build
	deploy/systemd/verify.sh $(BIN)

# The package installed in a Debian 12 container whose PID 1 is systemd
# (lab/systemdbox; docker without --privileged): every unit started on a
# loopback bus, Type=notify readiness, the watchdog restarting a stopped
# service, kill -9 of fan-ipmover leaving no floating address, reload of
# fan-scheduler, no sandbox refusal in the journal. Then docs/operations.md's
# Install, Rolling upgrade, Rollback and Uninstall blocks on three such
# boxes (two PBX hosts and a witness, a three-server bus): upgraded to the
# same tree rebuilt as the next patch version, rolled back, purged. The
# image is made once with debootstrap from the apt mirror and kept as a
# docker tag named by a hash of its recipe; the containers are always
# removed.
SYSTEMD_NEXT_VERSION = $(shell deploy/debian/version.sh --next-patch '$(VERSION)')
PACKAGED_BINARIES    = $(filter $(addsuffix :%,$(INSTALLED_BINARIES)),$(BINARIES))
.PHONY: systemd-test
systemd-test: deb
	rm -rf $(DEB_DIR)/next
	$(MAKE) --no-print-directory build BIN=$(DEB_DIR)/next/bin VERSION=$(SYSTEMD_NEXT_VERSION) BINARIES='$(PACKAGED_BINARIES)'
	deploy/debian/build-deb.sh $(DEB_DIR)/next/bin $(SYSTEMD_NEXT_VERSION) $(DEB_DIR)/next
	FAN_DEB=$$(ls $(DEB_DIR)/fan_*.deb) FAN_DEB_NEXT=$$(ls $(DEB_DIR)/next/fan_*.deb) FAN_STANDIN=$(BIN)/fan-pbxstandin \
		go test -count=1 -timeout 30m -v -run 'TestUnitsUnderSystemd|TestRunbookPackage' ./lab/systemdbox

clean:
	rm -rf $(BIN) $(DEB_DIR)
