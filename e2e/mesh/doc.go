// Package mesh starts aether on the local two-cluster substrate (e2e/substrate): it builds the
// aether binaries and the test workloads, installs the MCS CRDs in every cluster, runs one
// aether-agent per node (in the node's namespaces, through the substrate's node hook; the agent
// starts and supervises the node's Envoy and installs aether-cni into the node's conflist), and one
// aether-registrar per cluster on the shared registry. Workload identities come from one
// development CA both clusters share (the default), or from SPIRE (Options.Identity): a real
// SPIRE server and Controller Manager per cluster, under one upstream CA (one trust domain) or
// federated (a trust domain per cluster), and a real SPIRE agent per node whose Delegated
// Identity API the node's aether agent uses.
// Its handles (Mesh) let scenario tests and the demo command restart agents, stop nodes and cut
// the registry off.
//
// It drives aether only from the outside (binaries, flags, Kubernetes objects, network rules in
// the substrate's own namespaces); it must not import aether's internal packages.
package mesh
