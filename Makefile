# vpcip — make demo (the main job on vpcsim), make test (everything, as root).
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
export GOFLAGS ?= -buildvcs=false

BINARIES := vpcipd vpcip-cni vpcipctl vpcsim

.PHONY: all build deps demo test lint bench clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES))

deps:
	@bash scripts/deps.sh promtool

## demo: two m5.large nodes on vpcsim, 40 pods through the real plugin path, then tear down.
demo: deps build
	$(GO) run ./test/e2e/demo --bin $(BIN)

## lint: formatting, vet and the dependency rules of design.md §3.
lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt needed:"; echo "$$fmt"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -count=1 ./test/deps

## test: lint, then every package's tests (netns, iptables and e2e tests need root).
test: deps lint
	$(GO) test -count=1 -timeout 18m ./...

## bench: plugin latency vs the reference chain, burst latency, daemon RSS, EC2 calls per 100 pods.
bench: deps build
	$(GO) run ./test/bench --bin $(BIN) --out $(CURDIR)/results

clean:
	rm -rf $(BIN)
