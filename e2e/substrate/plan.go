package substrate

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
)

// Prefix starts the name of everything the substrate creates outside its own namespaces: the run
// directory (<TMPDIR>/aesub-<id>) and nothing else. Clean finds leftovers of a crashed run by it.
const Prefix = "aesub-"

// Defaults of the address plan. All of these addresses live only inside namespaces the substrate
// creates; the root network namespace never sees them.
const (
	// DefaultClusterDomain is the DNS domain of every cluster (kube-dns's cluster.local).
	DefaultClusterDomain = "cluster.local"
	// DefaultServiceCIDR is each cluster's --service-cluster-ip-range.
	DefaultServiceCIDR = "10.96.0.0/16"
	// FlannelMTU is the pod MTU Flannel's vxlan backend writes to subnet.env (1500 minus the
	// 50-byte VXLAN/UDP/IP overhead).
	FlannelMTU = 1450
	// FlannelVNI and FlannelPort are Flannel's vxlan defaults (device flannel.1, UDP 8472).
	FlannelVNI  = 1
	FlannelPort = 8472
	// APIServerPort and RegistryPort are the ports on each cluster's underlay gateway address
	// where node processes reach their cluster's kube-apiserver and the shared registry etcd.
	APIServerPort = 6443
	RegistryPort  = 2379
	// KubeletPort is where a real node's kubelet serves (exec, logs, port-forward) on its node IP.
	KubeletPort = 10250
)

// ClusterSpec describes one cluster of the substrate.
type ClusterSpec struct {
	// Name is a DNS-1123 label of at most 12 characters ("alpha").
	Name string
	// PodCIDR is the cluster's pod network (Flannel's Network), an IPv4 prefix of length 8 to 23;
	// each node gets the next /24 of it, as Flannel's kube subnet manager hands out node.spec.podCIDR.
	// Two clusters may use the same PodCIDR.
	PodCIDR string
	// ServiceCIDR is the cluster's service range (default 10.96.0.0/16); its tenth address is the
	// kube-dns VIP (10.96.0.10).
	ServiceCIDR string
	// Nodes is the number of nodes (default 2, at most 200).
	Nodes int
}

// Plan is the address plan of a substrate: pure data computed from the specs by NewPlan.
type Plan struct {
	ClusterDomain string
	Clusters      []ClusterPlan
}

// ClusterPlan is one cluster's addresses.
type ClusterPlan struct {
	Name        string
	Index       int // 1-based
	PodCIDR     netip.Prefix
	ServiceCIDR netip.Prefix
	// DNSIP is the kube-dns VIP (the service range's tenth address).
	DNSIP netip.Addr
	// UnderlaySubnet is the cluster's underlay segment 172.30.<index>.0/24; Gateway is its .1
	// in the underlay namespace (the router between clusters, and where node processes reach the
	// API server and the registry).
	UnderlaySubnet netip.Prefix
	Gateway        netip.Addr
	// GatewayAddressPool is the range the cluster's Gateways take spec.addresses from (the
	// registrar's --gateway-address-cidrs), 172.31.<index>.0/24: outside every underlay, pod and
	// service range. The underlay routes it to the cluster's first node, as a load balancer's
	// announcement (BGP, or one node answering ARP) would; kube-proxy there serves an address given
	// to a Gateway as its edge Service's external IP (and on every other node of the cluster, for
	// the cluster's own pods).
	GatewayAddressPool netip.Prefix
	Nodes              []NodePlan
}

// NodePlan is one node's addresses.
type NodePlan struct {
	Name  string // <cluster>-node<n>
	Index int    // 1-based within the cluster
	// IP is the node's InternalIP on the underlay, 172.30.<cluster>.<10+index>.
	IP netip.Addr
	// PodSubnet is the node's Flannel subnet (node.spec.podCIDR), a /24 of the cluster's PodCIDR.
	PodSubnet netip.Prefix
	// VtepMAC is the MAC of the node's flannel.1 device (Flannel's VtepMAC backend data).
	VtepMAC MAC
}

// MAC is a hardware address that marshals as text ("02:ae:5b:00:01:02").
type MAC net.HardwareAddr

// String formats the MAC like net.HardwareAddr.
func (m MAC) String() string { return net.HardwareAddr(m).String() }

// MarshalText implements encoding.TextMarshaler.
func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// substrateRange holds every underlay segment (172.30.<i>.0/24) and Gateway address pool
// (172.31.<i>.0/24); no pod or service range may overlap it.
var substrateRange = netip.MustParsePrefix("172.30.0.0/15")

var labelRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,10}[a-z0-9])?$`)

// DefaultClusters is two clusters of two nodes with the given pod CIDRs ("alpha" and "beta").
func DefaultClusters(podCIDRA, podCIDRB string) []ClusterSpec {
	return []ClusterSpec{
		{Name: "alpha", PodCIDR: podCIDRA, Nodes: 2},
		{Name: "beta", PodCIDR: podCIDRB, Nodes: 2},
	}
}

// NewPlan validates the specs and computes the address plan. Errors name the field and value.
func NewPlan(specs []ClusterSpec, clusterDomain string) (*Plan, error) {
	if clusterDomain == "" {
		clusterDomain = DefaultClusterDomain
	}
	if len(specs) == 0 || len(specs) > 9 {
		return nil, fmt.Errorf("plan substrate: want 1 to 9 clusters, got %d", len(specs))
	}
	p := &Plan{ClusterDomain: clusterDomain}
	seen := map[string]bool{}
	for i, s := range specs {
		if !labelRE.MatchString(s.Name) {
			return nil, fmt.Errorf("plan substrate: clusters[%d].Name %q: want a DNS label of at most 12 characters", i, s.Name)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("plan substrate: clusters[%d].Name %q: used twice", i, s.Name)
		}
		seen[s.Name] = true
		pod, err := netip.ParsePrefix(s.PodCIDR)
		if err != nil || !pod.Addr().Is4() || pod.Bits() < 8 || pod.Bits() > 23 || pod.Masked() != pod {
			return nil, fmt.Errorf("plan substrate: clusters[%d].PodCIDR %q: want a masked IPv4 prefix of length 8 to 23", i, s.PodCIDR)
		}
		if s.ServiceCIDR == "" {
			s.ServiceCIDR = DefaultServiceCIDR
		}
		svc, err := netip.ParsePrefix(s.ServiceCIDR)
		if err != nil || !svc.Addr().Is4() || svc.Bits() > 24 || svc.Masked() != svc {
			return nil, fmt.Errorf("plan substrate: clusters[%d].ServiceCIDR %q: want a masked IPv4 prefix of length at most 24", i, s.ServiceCIDR)
		}
		if svc.Overlaps(pod) {
			return nil, fmt.Errorf("plan substrate: clusters[%d].ServiceCIDR %q overlaps PodCIDR %q", i, s.ServiceCIDR, s.PodCIDR)
		}
		for _, r := range []struct {
			field string
			p     netip.Prefix
		}{{"PodCIDR", pod}, {"ServiceCIDR", svc}} {
			if r.p.Overlaps(substrateRange) {
				return nil, fmt.Errorf("plan substrate: clusters[%d].%s %q overlaps the underlay and Gateway address pools %s", i, r.field, r.p, substrateRange)
			}
		}
		if s.Nodes == 0 {
			s.Nodes = 2
		}
		if s.Nodes < 0 || s.Nodes > 200 || s.Nodes > 1<<(24-pod.Bits()) {
			return nil, fmt.Errorf("plan substrate: clusters[%d].Nodes %d: want 1 to 200 and at most one per /24 of %s", i, s.Nodes, s.PodCIDR)
		}
		ci := i + 1
		c := ClusterPlan{
			Name: s.Name, Index: ci, PodCIDR: pod, ServiceCIDR: svc,
			DNSIP:              addOffset(svc.Addr(), 10),
			UnderlaySubnet:     netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 30, byte(ci), 0}), 24),
			Gateway:            netip.AddrFrom4([4]byte{172, 30, byte(ci), 1}),
			GatewayAddressPool: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 31, byte(ci), 0}), 24),
		}
		for n := 1; n <= s.Nodes; n++ {
			c.Nodes = append(c.Nodes, NodePlan{
				Name:      fmt.Sprintf("%s-node%d", s.Name, n),
				Index:     n,
				IP:        netip.AddrFrom4([4]byte{172, 30, byte(ci), byte(10 + n)}),
				PodSubnet: netip.PrefixFrom(addOffset(pod.Addr(), uint32(n-1)<<8), 24),
				VtepMAC:   MAC{0x02, 0xae, 0x5b, 0x00, byte(ci), byte(n)},
			})
		}
		p.Clusters = append(p.Clusters, c)
	}
	return p, nil
}

// addOffset returns the IPv4 address off positions after a.
func addOffset(a netip.Addr, off uint32) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += off
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// BridgeGateway is the address of a node's cni0 bridge: the first host of its pod subnet, which
// the bridge plugin (isGateway) assigns and pods use as default gateway.
func (n NodePlan) BridgeGateway() netip.Addr { return n.PodSubnet.Addr().Next() }
