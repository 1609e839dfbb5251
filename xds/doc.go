// Package xds turns the mesh model into Envoy configuration (listeners, clusters, routes, EDS
// endpoints, SDS secrets) with one pure builder per resource, serves it to the node's Envoy over
// ADS (state-of-the-world and delta, go-control-plane), and supervises the Envoy process (bootstrap,
// adoption after an agent restart, restart with backoff).
//
// It reads model values and workload identities; it never programs the kernel (capture) or
// answers DNS (dnsd), and never writes to Kubernetes or the registry.
package xds
