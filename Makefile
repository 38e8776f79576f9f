# fan: failover for Asterisk PBX servers on NATS JetStream.
#   make build   static binaries in bin/
#   make test    go vet, gofmt check, every module's tests with -race (root: also the namespace end-to-end test)
#   make lab     the namespace lab: a real failover, printed as a timeline
#   make deps    install what the lab and the tests need on Debian 12 (root)

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
	fan-lab:cmd:./fan-lab

.PHONY: all build test vet fmt-check unit lab clean modules-standalone fuzz deps

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

# Debian packages: Kamailio (the SIP server answering on the floating IP in
# the lab), SIPp, iproute2 for namespaces.
DEB_PACKAGES := kamailio sip-tester iproute2 procps bind9 bind9-utils keepalived ca-certificates git make
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	cd $(CURDIR) && for m in $$(go list -m -f '{{.Dir}}'); do (cd $$m && go mod download); done

clean:
	rm -rf $(BIN)
