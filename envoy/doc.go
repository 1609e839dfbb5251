// Package envoy runs the node's Envoy process: its bootstrap (Bootstrap: node id, admin API, one
// static cluster to the agent's ADS server), the supervisor that keeps exactly one Envoy per
// state directory (Supervisor: a flock(2) lock Envoy inherits, adoption of a running Envoy after
// an agent restart, restart with backoff), the admin API client (AdminClient) and the warm-up
// check the CNI ADD path waits on (WaitListenersWarm: listeners out of warming, Envoy LIVE).
// docs/node-proxy.md describes the supervision and the Envoy 1.40 behaviour it relies on.
//
// It owns the process, its files and its admin API; it never builds xDS resources beyond the
// bootstrap (that is xds), never serves ADS, and never changes a network namespace.
package envoy
