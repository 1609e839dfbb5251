// Package mesh starts aether on the local two-cluster substrate (e2e/substrate): it builds the
// aether binaries and the test workloads, installs the MCS CRDs in every cluster, runs one
// aether-agent per node (in the node's namespaces, through the substrate's node hook; the agent
// starts and supervises the node's Envoy and installs aether-cni into the node's conflist), and one
// aether-registrar per cluster on the shared registry. Both clusters share one development CA.
// Its handles (Mesh) let scenario tests and the demo command restart agents, stop nodes and cut
// the registry off.
//
// It drives aether only from the outside (binaries, flags, Kubernetes objects, network rules in
// the substrate's own namespaces); it must not import aether's internal packages.
package mesh
