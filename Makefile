# fan: failover for Asterisk PBX servers on NATS JetStream.
#   make build   static binaries in bin/
#   make test    go vet, gofmt check, every module's tests with -race (root: also the namespace end-to-end test)
#   make lab     the namespace lab: a real failover, printed as a timeline
#   make deps    install what the lab and the tests need on Debian 12 (root)
#   make bench-failover  fan and keepalived side by side in namespaces (CYCLES=30, FLAP=5m)
#   make chaos           randomized faults against the invariants (DURATION=10m); exits non-zero on a breach
#   make install         binaries, systemd units and example configs under DESTDIR/PREFIX
#   make images          the compose lab's images (FROM scratch, nothing pulled)
#   make compose-test    the compose lab: up, a failover, down (docker)
#   make systemd-verify  systemd-analyze verify on every unit

SHELL       := /bin/bash
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
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
	fan-lab:cmd:./fan-lab \
	fan-bench:lab:./cmd/fan-bench \
	fan-chaos:lab:./cmd/fan-chaos

.PHONY: all build test vet fmt-check unit lab clean modules-standalone fuzz deps install images compose-test systemd-verify bench-failover chaos

all: build

build:
	@mkdir -p $(BIN)
	@set -e; for spec in $(BINARIES); do \
		IFS=: read -r name dir pkg <<< "$$spec"; \
		echo "build $$name"; \
		(cd $$dir && $(GOBUILD) -o $(BIN)/$$name $$pkg); \
	done

vet:
	go vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Every module must build on its own (its go.mod replaces, not go.work).
modules-standalone:
	@set -e; for m in $$(go list -m -f '{{.Dir}}'); do \
		echo "standalone build $${m#$(CURDIR)/}"; \
		(cd $$m && GOWORK=off go build ./... && GOWORK=off go vet ./... >/dev/null); \
	done

unit: build
	FAN_BIN=$(BIN) go test $(TESTFLAGS) $(PKGS)

test: vet fmt-check modules-standalone unit

# Fuzz the event decoder for a while (FUZZTIME=1m to change).
FUZZTIME ?= 30s
fuzz:
	cd pkg/events && go test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME)

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
bench-failover: build
	$(BIN)/fan-bench -bin $(BIN) -cycles $(CYCLES) -flap $(FLAP) -topology $(TOPOLOGY) -leaders $(LEADERS)

# Randomized faults (kill -9 of services, NATS restarts, frozen PBX, link
# cuts, NATS-only partitions) with ARP and SIP observers; see lab/chaos.
# TOPOLOGY=colocated runs it on a three-server bus (a NATS server on each
# PBX node and on the witness) and adds one server's kill -9 and route cut.
DURATION ?= 10m
chaos: build
	$(BIN)/fan-chaos -bin $(BIN) -duration $(DURATION) -topology $(TOPOLOGY)

# Debian packages: Kamailio (the SIP server answering on the floating IP in
# the lab), SIPp, iproute2 for namespaces.
DEB_PACKAGES := kamailio sip-tester iproute2 iptables procps bind9 bind9-utils keepalived rsync ca-certificates git make
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	cd $(CURDIR) && for m in $$(go list -m -f '{{.Dir}}'); do (cd $$m && go mod download); done

# Production install: the five services and fanctl, one systemd unit per
# service, example configs (never overwriting an operator's). Packagers set
# DESTDIR; PREFIX is where the binaries go (the units name $(PREFIX)/bin).
PREFIX      ?= /usr/local
DESTDIR     ?=
SYSCONFDIR  ?= /etc
UNITDIR     ?= /etc/systemd/system
SERVICES    := prober arbiter ipmover replicator scheduler
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/fan
	@set -e; for s in $(SERVICES); do \
		install -m 0755 $(BIN)/fan-$$s $(DESTDIR)$(PREFIX)/bin/fan-$$s; \
		sed 's|/usr/local/bin/|$(PREFIX)/bin/|g' deploy/systemd/fan-$$s.service > $(DESTDIR)$(UNITDIR)/fan-$$s.service; \
		chmod 0644 $(DESTDIR)$(UNITDIR)/fan-$$s.service; \
		for f in $$s.yaml $$s.env; do \
			if [ -e $(DESTDIR)$(SYSCONFDIR)/fan/$$f ]; then \
				install -m 0640 deploy/systemd/examples/$$f $(DESTDIR)$(SYSCONFDIR)/fan/$$f.example; \
			else \
				install -m 0640 deploy/systemd/examples/$$f $(DESTDIR)$(SYSCONFDIR)/fan/$$f; \
			fi; \
		done; \
	done
	install -m 0755 $(BIN)/fanctl $(DESTDIR)$(PREFIX)/bin/fanctl
	install -D -m 0644 deploy/systemd/fan.sysusers.conf $(DESTDIR)$(PREFIX)/lib/sysusers.d/fan.conf
	@# On a live system (no DESTDIR): create the fan user and let it read its configs.
	@if [ -z "$(DESTDIR)" ] && command -v systemd-sysusers >/dev/null; then \
		systemd-sysusers $(PREFIX)/lib/sysusers.d/fan.conf && \
		chgrp fan $(SYSCONFDIR)/fan $(SYSCONFDIR)/fan/*.yaml* && chmod 0750 $(SYSCONFDIR)/fan; \
	fi
	@echo "installed under $(DESTDIR)$(PREFIX) and $(DESTDIR)$(SYSCONFDIR)/fan; next: deploy/systemd/README.md"

# The compose lab's images, built FROM scratch from the static binaries.
FAN_TAG     ?= dev
images: build
	deploy/compose/build-images.sh $(BIN) $(FAN_TAG)

# Builds its own binaries and images under a unique project name, runs a
# failover, and removes everything it made (containers, network, images).
compose-test:
	deploy/compose/test.sh

systemd-verify: build
	deploy/systemd/verify.sh $(BIN)

clean:
	rm -rf $(BIN)
