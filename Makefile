# aether: the two commands a user types are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
export AETHER_TOOLS_DIR ?= /var/cache/aether-tools

.PHONY: all build tools test lint demo demo-down e2e e2e-nodes e2e-clean substrate-up substrate-down

all: build

build:
	go build ./...

## tools: install or build every tool the tests use (cached in $(AETHER_TOOLS_DIR))
tools:
	hack/tools.sh

## test: tools, gofmt, go mod tidy -diff, go vet, staticcheck, every Go test (privileged ones need root)
test:
	hack/test.sh

## lint: gofmt, go mod tidy -diff, go vet and staticcheck only
lint: tools
	hack/test.sh --lint-only

## demo: two local clusters of real nodes with aether (Helm chart) in the background, a sample
## service exported from beta called from alpha through the waypoint (docs/demo.md); runs as
## root. DEMO_FLAGS=-stand-in uses the fast kubelet stand-in. demo-down stops it.
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

## substrate-up: start the local two-cluster substrate as root (docs/substrate.md); runs until
## Ctrl-C or `make substrate-down`. SUBSTRATE_FLAGS=-identical-pod-cidrs gives both clusters 10.244.0.0/16;
## SUBSTRATE_FLAGS=-real-nodes runs real nodes (containerd, kubelet, kube-proxy).
substrate-up:
	go run ./e2e/cmd/substrate up $(SUBSTRATE_FLAGS)

## substrate-down: stop a substrate started by substrate-up
substrate-down:
	go run ./e2e/cmd/substrate down

## e2e: the scenario suite on the local two-cluster substrate (docs/e2e.md); runs as root.
## `make test` runs it too (it is part of go test ./...).
e2e: tools
	go test -count=1 -v -timeout 30m -run '^TestScenarios$$' ./e2e/scenarios/

## e2e-nodes: the scenario suite on the substrate's real nodes only (containerd, kubelet,
## kube-proxy; aether installed with its Helm chart from images built here); part of `make e2e`.
e2e-nodes: tools
	go test -count=1 -v -timeout 30m -run '^TestScenarios$$/^real-nodes$$' ./e2e/scenarios/

## e2e-clean: remove what crashed or interrupted substrate runs left ($TMPDIR/aesub-*: processes,
## namespace mounts, run directories); runs whose owner process still lives are skipped
e2e-clean:
	go run ./e2e/cmd/substrate clean
