// Package substrate runs aether's local multi-cluster test environment on one Linux machine,
// without Docker: per cluster a real kube-apiserver with its etcd, one shared registry etcd, a
// shared development CA, nodes as network namespaces on a routed underlay namespace (Flannel's
// vxlan devices, routes, masquerade rules and subnet.env set up by hand), a stub kube-dns per
// cluster, and a kubelet stand-in per node that runs Pods bound to the node through the node's
// real CNI conflist (libcni) and starts their commands in the pod namespaces.
//
// It owns only what it creates: namespaces and mounts under its run directory
// (<TMPDIR>/aesub-<random>), the processes it starts, and objects in its own API servers. It
// never changes the root network namespace (no link, address, route or rule there) and never
// mounts anything in the root mount namespace outside its run directory: node files are bound
// at their real paths only inside each node process's own mount namespace. aether's processes
// (agent, Envoy, registrar) are started by Hooks; the substrate does not import aether's
// internals. See docs/substrate.md.
package substrate
