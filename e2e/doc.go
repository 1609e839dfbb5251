// Package e2e holds aether's end-to-end scenarios and the local two-cluster substrate they run
// on (e2e/substrate: per cluster a real kube-apiserver, nodes as network namespaces on a routed
// underlay, pods as namespaces wired by the real CNI chain, and the real aether binaries started
// by hooks; e2e/cmd/substrate starts and stops it; e2e/workloads are the test programs pods
// run). e2e/kind runs the same scenarios against real kind clusters on machines with Docker.
//
// It drives aether only from the outside (binaries, Kubernetes objects, traffic); it never
// imports aether's internals to change their state.
package e2e
