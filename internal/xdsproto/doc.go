// Package xdsproto holds the small Envoy proto helpers that the resource builders of package xds
// and package tunnel share: a typed config as an Any, a socket address, the ADS config source, an
// EDS cluster with its upstream bind config, and the network and listener filters both build
// (tcp_proxy, tls_inspector). Each helper fills one Envoy message from plain values and nothing
// more: no names, ports or policies of the mesh.
//
// It imports only Envoy's and protobuf's Go packages: never xds, tunnel, model or any other aether
// package, so that every builder can use it. It is pure: it runs no server and touches no host
// state.
package xdsproto
