# fan: failover for Asterisk PBX servers on NATS JetStream.
#   make build   static binaries in bin/
#   make test    go vet, gofmt check, every module's tests with -race (root: also the namespace end-to-end test)
#   make lab     the namespace lab: a real failover, printed as a timeline

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

.PHONY: all build test vet fmt-check unit lab clean modules-standalone fuzz

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

clean:
	rm -rf $(BIN)
