// Package tunnel builds the east-west waypoint: the node's tunnel listener on node_ip:15443
// (tls_inspector, one SNI-matched filter chain per exported local service, tcp_proxy of the raw,
// still-encrypted bytes to that service's pods on this node at :15008) and the split-horizon EDS
// entries that send cross-cluster traffic to remote nodes' tunnel listeners.
//
// It never terminates TLS and never gives a chain to a service that is not exported. It produces
// Envoy resources for package xds to serve; it does not run a server of its own.
package tunnel
