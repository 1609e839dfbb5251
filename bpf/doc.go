// Package bpf will hold aether's eBPF programs (capture acceleration where the kernel allows),
// one directory per program with its bpf2go-generated loader committed.
//
// Not built yet: eBPF acceleration is outside the current batch (see DESIGN.md, "Not in this
// batch"). Nftables/iptables capture in package capture is the reference behaviour it must match.
package bpf
