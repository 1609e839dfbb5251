// Package xds turns the mesh model into Envoy configuration (listeners, clusters, routes, EDS
// endpoints, SDS secrets) with one pure builder per resource (Build; a Builder rebuilds only what
// changed since its last model), serves it to the node's Envoy over ADS (state-of-the-world and
// delta, go-control-plane; Server, with WaitForAck for the CNI ADD path). The Envoy process
// itself (bootstrap, supervisor, admin API) is package envoy's.
// docs/node-proxy.md describes the layout and the Envoy 1.40 behaviour it relies on (checked by
// the TestPrivilegedEnvoyFact tests).
//
// It reads model values and takes SVIDs from the identity package; it never programs the kernel
// (capture), never answers DNS (dnsd), never starts or signals Envoy (envoy), never writes to Kubernetes or the registry, and never
// changes a network namespace (Envoy opens sockets inside pod namespaces itself).
package xds
