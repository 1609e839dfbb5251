// Package tunnel builds the east-west waypoint: the node's tunnel listener on node_ip:15443
// (tls_inspector, one SNI-matched filter chain per exported local service, plus one per target
// port that not all of the service's local pods serve, tcp_proxy of the raw, still-encrypted
// bytes to that service's (or port's) pods on this node at :15008), with refusal chains that
// close and count everything else by reason. The caller side (split-horizon EDS entries at remote
// nodes' node_ip:15443 and the waypoint SNI) lives in package xds, which also adds these
// resources to the node's snapshot (xds.Options.EastWestWaypoint). docs/waypoint.md describes both.
//
// It never terminates TLS and never gives a chain to a service that is not exported. It is pure:
// it produces Envoy resources for package xds to serve, runs no server and touches no host state.
package tunnel
