// Package capture builds and applies the traffic-capture rules in a pod's network namespace:
// outbound TCP redirected to the capture listener (15001), DNS to the cluster DNS service DNAT'ed
// to the agent's resolver (HOST_IP:18054), and the inbound policy (strict: only 15008 and the node
// Envoy's own connections; permissive: plaintext too).
//
// Rules are data built by pure functions (nftables first, iptables where the node uses it),
// applied in one transaction, checked and repaired idempotently. Every rule carries an aether tag;
// nothing outside aether's own tables or chains is ever touched.
package capture
