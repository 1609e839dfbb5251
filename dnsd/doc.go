// Package dnsd is the node agent's DNS resolver on HOST_IP:18054 (UDP and TCP): authoritative for
// the mesh domain and for <svc>.<ns>.svc.clusterset.local from local ServiceImports, answering the
// search-list expansions of mesh names directly, and forwarding every other name to the
// upstreams from the agent's resolv.conf (kube-dns).
//
// It reads an index built from the mesh model and swapped atomically; it never changes the model
// and never touches Kubernetes or the registry itself.
package dnsd
