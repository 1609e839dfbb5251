// Package capture is the eBPF form of a pod's outbound capture: cgroup programs that send a
// captured pod's TCP connects to its capture listener (127.0.0.1 or ::1, port 15001) without NAT
// or conntrack, answer the listener's SO_ORIGINAL_DST with the destination the application
// dialled, and send DNS to the cluster DNS service to the agent's resolver (answers appear to
// come from the cluster DNS address). It is the accelerated twin of the nft "output_nat" chain that package
// github.com/aethermesh/aether/capture builds, and makes the same decisions from per-pod maps
// keyed by the pod's netns cookie (docs/ebpf.md has the decision table).
//
// It owns the C program (prog.c, compiled by bpf2go into prog_bpfel.o and prog_bpfel.go, both
// committed; hack/update-bpf.sh regenerates them), its loader (Ensure, and the Load, Attach, Pin,
// OpenPinned it is made of), the per-pod settings (SetPod, DeletePod, ListPods, FromConfig) and
// the kernel probe (Probe). It knows
// nothing of pods, CNI or the agent, and must not touch nft rules or anything outside the maps,
// programs, links and pins it made; choosing between eBPF and nft capture is the agent's.
//
// Linux only, on little-endian CPUs (the object is compiled for bpfel); elsewhere every entry
// point returns ErrUnsupported, so a caller falls back to nft capture.
package capture
