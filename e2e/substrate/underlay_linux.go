//go:build linux

package substrate

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os/exec"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Link names. The underlay namespace holds one bridge per cluster (br-c<i>) and one veth end per
// node (n<i>-<j>); every node namespace holds eth0 (its underlay link), flannel.1 (Flannel's vxlan
// device) and, once a pod runs, cni0 (the bridge plugin's bridge). The kube-dns VIP sits on the
// node's lo (the kernel here has no dummy driver; kube-proxy's IPVS mode uses a dummy device).
const (
	nodeUplink = "eth0"
	vxlanName  = "flannel.1"
)

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, bits))}
}

// setupUnderlay makes the underlay namespace a router: forwarding on, and one bridge per cluster
// carrying the cluster's gateway address. It holds no route to any pod CIDR, so pod subnets
// never cross clusters while node IPs do.
func setupUnderlay(ul *testenv.Netns, plan *Plan) error {
	if err := sysctlIn(ul, "net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	h, err := ul.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	for _, c := range plan.Clusters {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("br-c%d", c.Index)}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("add underlay bridge for %s: %w", c.Name, err)
		}
		if err := h.AddrAdd(br, addr(c.Gateway, c.UnderlaySubnet.Bits())); err != nil {
			return fmt.Errorf("address underlay bridge for %s: %w", c.Name, err)
		}
		if err := h.LinkSetUp(br); err != nil {
			return fmt.Errorf("up underlay bridge for %s: %w", c.Name, err)
		}
	}
	return nil
}

// announceGatewayPools routes, in the underlay namespace, each cluster's GatewayAddressPool to
// its first node's IP: what a load balancer announcing the Gateways' addresses (BGP, or a node
// answering ARP for them) sets up. Clients outside the cluster (the underlay, other clusters'
// nodes and pods) reach a Gateway's address there, where kube-proxy serves it as the edge
// Service's external IP; the cluster's own pods and nodes have kube-proxy serve it locally.
func announceGatewayPools(ul *testenv.Netns, plan *Plan) error {
	h, err := ul.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	for _, c := range plan.Clusters {
		if len(c.Nodes) == 0 {
			continue
		}
		if err := h.RouteAdd(&netlink.Route{Dst: ipNet(c.GatewayAddressPool), Gw: net.IP(c.Nodes[0].IP.AsSlice())}); err != nil {
			return fmt.Errorf("route Gateway address pool %s of %s via %s: %w", c.GatewayAddressPool, c.Name, c.Nodes[0].Name, err)
		}
	}
	return nil
}

// setupNode wires one node namespace: a veth to its cluster's underlay bridge (eth0 with the node
// IP and a default route via the gateway), forwarding on, the kube-dns VIP on lo,
// Flannel's vxlan device flannel.1 (VNI 1, UDP 8472, no learning, the node's subnet .0/32 on it,
// MTU 1450), and Flannel's masquerade rules (pod traffic leaving the cluster network is SNATed
// to the node IP).
func setupNode(ul, node *testenv.Netns, c ClusterPlan, n NodePlan) error {
	uh, err := ul.Netlink()
	if err != nil {
		return err
	}
	defer uh.Close()
	nsh, err := netns.GetFromPath(node.Path)
	if err != nil {
		return fmt.Errorf("open %s: %w", node.Path, err)
	}
	defer nsh.Close()
	ulEnd := fmt.Sprintf("n%d-%d", c.Index, n.Index)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ulEnd, MTU: 1500}, PeerName: nodeUplink, PeerNamespace: netlink.NsFd(int(nsh))}
	if err := uh.LinkAdd(veth); err != nil {
		return fmt.Errorf("add underlay veth for %s: %w", n.Name, err)
	}
	br, err := uh.LinkByName(fmt.Sprintf("br-c%d", c.Index))
	if err != nil {
		return fmt.Errorf("find underlay bridge: %w", err)
	}
	ule, err := uh.LinkByName(ulEnd)
	if err != nil {
		return fmt.Errorf("find %s: %w", ulEnd, err)
	}
	if err := uh.LinkSetMaster(ule, br); err != nil {
		return fmt.Errorf("attach %s: %w", ulEnd, err)
	}
	if err := uh.LinkSetUp(ule); err != nil {
		return fmt.Errorf("up %s: %w", ulEnd, err)
	}

	if err := sysctlIn(node, "net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	h, err := node.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	eth, err := h.LinkByName(nodeUplink)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", nodeUplink, n.Name, err)
	}
	if err := h.AddrAdd(eth, addr(n.IP, c.UnderlaySubnet.Bits())); err != nil {
		return fmt.Errorf("address %s: %w", n.Name, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("up eth0 of %s: %w", n.Name, err)
	}
	if err := h.RouteAdd(&netlink.Route{Gw: net.IP(c.Gateway.AsSlice())}); err != nil {
		return fmt.Errorf("default route of %s: %w", n.Name, err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", n.Name, err)
	}
	if err := h.AddrAdd(lo, addr(c.DNSIP, 32)); err != nil {
		return fmt.Errorf("address kube-dns VIP on lo of %s: %w", n.Name, err)
	}
	vx := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: vxlanName, MTU: FlannelMTU, HardwareAddr: net.HardwareAddr(n.VtepMAC)},
		VxlanId:      FlannelVNI,
		VtepDevIndex: eth.Attrs().Index,
		SrcAddr:      net.IP(n.IP.AsSlice()),
		Port:         FlannelPort,
		Learning:     false,
	}
	if err := h.LinkAdd(vx); err != nil {
		return fmt.Errorf("add %s to %s: %w", vxlanName, n.Name, err)
	}
	if err := h.AddrAdd(vx, addr(n.PodSubnet.Addr(), 32)); err != nil {
		return fmt.Errorf("address %s of %s: %w", vxlanName, n.Name, err)
	}
	if err := h.LinkSetUp(vx); err != nil {
		return fmt.Errorf("up %s of %s: %w", vxlanName, n.Name, err)
	}
	return nftIn(node, masqRules(c.PodCIDR))
}

// masqRules are Flannel's ip-masq rules as one nftables table: traffic inside the cluster
// network is left alone; pod traffic to anything else but multicast is masqueraded.
func masqRules(podCIDR netip.Prefix) string {
	return fmt.Sprintf(`table ip aesub-flannel {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %[1]s ip daddr %[1]s return
		ip saddr %[1]s ip daddr != 224.0.0.0/4 masquerade
	}
}
`, podCIDR)
}

// nftIn loads an nftables ruleset inside ns with the nft binary.
func nftIn(ns *testenv.Netns, rules string) error {
	cmd := exec.Command("nsenter", "--net="+ns.Path, "--", "nft", "-f", "-")
	cmd.Stdin = bytes.NewBufferString(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("load nftables rules in %s: %w: %s", ns.Name, err, out)
	}
	return nil
}

// routePeer programs, in node's namespace, what flanneld's vxlan backend programs for a peer node
// of the same cluster: a route to the peer's subnet via the peer's subnet .0 on flannel.1
// (onlink), a permanent ARP entry mapping that address to the peer's VTEP MAC, and an FDB entry
// sending that MAC to the peer's node IP.
func routePeer(node *testenv.Netns, peer NodePlan) error {
	h, err := node.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	vx, err := h.LinkByName(vxlanName)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", vxlanName, node.Name, err)
	}
	idx := vx.Attrs().Index
	gw := net.IP(peer.PodSubnet.Addr().AsSlice())
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, Type: unix.RTN_UNICAST, IP: gw, HardwareAddr: net.HardwareAddr(peer.VtepMAC)}); err != nil {
		return fmt.Errorf("add ARP entry for %s in %s: %w", peer.Name, node.Name, err)
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, IP: net.IP(peer.IP.AsSlice()), HardwareAddr: net.HardwareAddr(peer.VtepMAC)}); err != nil {
		return fmt.Errorf("add FDB entry for %s in %s: %w", peer.Name, node.Name, err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: ipNet(peer.PodSubnet), Gw: gw, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
		return fmt.Errorf("route %s to %s in %s: %w", peer.PodSubnet, peer.Name, node.Name, err)
	}
	return nil
}
