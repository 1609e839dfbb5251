# aether: the two commands a user types are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
export AETHER_TOOLS_DIR ?= /var/cache/aether-tools

.PHONY: all build tools test test-unit lint demo demo-down e2e e2e-clean

all: build

build:
	go build ./...

## tools: install or build every tool the tests use (cached in $(AETHER_TOOLS_DIR))
tools:
	hack/tools.sh

## test: tools, gofmt, go vet, staticcheck, every Go test (privileged ones need root)
test:
	hack/test.sh

## lint: gofmt, go vet and staticcheck only
lint: tools
	hack/test.sh --lint-only

## demo: the two-cluster demo (see README.md for what exists today)
demo:
	hack/demo.sh up

demo-down:
	hack/demo.sh down

## generate / verify: regenerate committed generated code, or fail when it is stale
.PHONY: generate verify
generate:
	for u in hack/update-*.sh; do "$$u"; done

verify:
	for v in hack/verify-*.sh; do "$$v"; done
