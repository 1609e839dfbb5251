package capture

import (
	"fmt"
	"net/netip"
	"slices"
)

// GuardTable is the nftables table (family bridge) in the node's network namespace that holds the
// node source guard. Nothing outside it is touched.
const GuardTable = "aether"

// NodeGuard keeps pods from sending with the node's own addresses.
//
// Strict inbound capture trusts a few node sources (the bridge gateway, HOST_IP) on a pod's
// kubelet probe ports, and the kernel already drops a routed packet whose source is one of the
// host's own addresses (a martian source, net.ipv4.conf.*.accept_local=0). A frame between two
// pods on the same Linux bridge (Flannel's cni0) is switched, not routed, so no such check sees
// it: a pod could write the gateway's address as its source, or announce it in ARP or an IPv6
// neighbour advertisement and take the gateway's traffic from its neighbours. The guard drops,
// at the bridge's prerouting hook (every frame that enters any bridge port), IPv4 and IPv6
// packets whose source is a node address, ARP whose sender address is one, and neighbour
// advertisements whose target is one (RFC 4861 section 4.4). The node's own frames leave
// through the bridge's output hook and are not affected.
type NodeGuard interface {
	// Apply makes the guard drop frames from exactly addrs (idempotent: nothing is written when
	// the live table already matches) and reports whether it changed anything. The write is one
	// nf_tables transaction.
	Apply(addrs []netip.Addr) (changed bool, err error)
	// Check returns nil when the live guard is exactly that of addrs, a *DriftError when not.
	Check(addrs []netip.Addr) error
	// Teardown removes the guard; a missing table is success.
	Teardown() error
}

// guardAddrs splits addrs into sorted, deduplicated IPv4 and IPv6 sets (IPv4-mapped IPv6 counts as
// IPv4). An invalid or unspecified address is an error naming it.
func guardAddrs(addrs []netip.Addr) (v4, v6 []netip.Addr, err error) {
	for _, a := range addrs {
		if !a.IsValid() || a.IsUnspecified() {
			return nil, nil, fmt.Errorf("node source guard: address %q: not a node address", a)
		}
		a = a.Unmap()
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a.WithZone(""))
		}
	}
	slices.SortFunc(v4, netip.Addr.Compare)
	slices.SortFunc(v6, netip.Addr.Compare)
	return slices.Compact(v4), slices.Compact(v6), nil
}
