// Package capture builds and applies the traffic-capture rules in a pod's network namespace:
// outbound TCP redirected to the capture listener (15001), DNS to the cluster DNS service DNAT'ed
// to the agent's resolver (HOST_IP:18054), IPv6 captured the same way or dropped, and the inbound
// policy (strict: only 15008, the pod's loopback and the node's own connections; permissive:
// plaintext too; per-port overrides of either, Config.StrictPorts and Config.PermissivePorts).
// docs/capture.md explains each rule and how the node Envoy's connections are
// recognised.
//
// Rules are data built by a pure function (Build), rendered for nftables and iptables, and
// applied by a Backend: NFTables (netlink, one transaction, the default) or IPTables
// (iptables-restore, nft or legacy to match the node). Apply, Check and Teardown are idempotent
// and tolerate half-applied state. Every rule carries an aether tag; nothing outside aether's own
// table (inet aether) or chains (AETHER-*) is ever read or changed. It knows nothing of pods,
// CNI or the agent (package cni drives it).
package capture
