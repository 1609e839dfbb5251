// Package bpf holds aether's eBPF programs, one directory per program, each with its C source
// (//go:build ignore), the //go:generate bpf2go line beside its Go loader, and the generated
// Go and .o files committed: bpf/capture is outbound TCP capture by cgroup programs
// (docs/ebpf.md). hack/update-bpf.sh regenerates them with Debian bookworm's clang 14;
// hack/verify-bpf.sh fails when a committed file is stale.
//
// Nothing here decides whether a node uses eBPF or nft capture (the agent does, from
// bpf/capture.Probe); nft capture in package github.com/aethermesh/aether/capture is the reference
// behaviour the programs match.
package bpf
