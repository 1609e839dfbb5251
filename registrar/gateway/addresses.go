package gateway

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/model"
)

// AddressAssignment is what one Gateway gets of the IP addresses its spec.addresses asks for
// (AssignAddresses).
type AddressAssignment struct {
	// ExternalIPs are the addresses given to the Gateway, in the order spec.addresses names
	// them, each once: its edge Service's spec.externalIPs.
	ExternalIPs []string
	// Refused says, one entry per address not given, which and why:
	// "spec.addresses[<i>]: value <ip>: <reason>".
	Refused []string
}

// addressUser is an object that already uses an address a Gateway may ask for.
type addressUser struct {
	// what names the object and the field: "Service shop/db (spec.clusterIPs)".
	what string
	// edge is the Gateway whose edge Service this is (provisioned), zero for any other object.
	edge model.GatewayKey
	node bool
}

// edgePortOf is one edge port of one address: what one Gateway holds (AssignAddresses).
type edgePortOf struct {
	addr netip.Addr
	port EdgePort
}

// AssignAddresses decides which of the IP addresses (type IPAddress, the type's default) each of
// gws asks for in spec.addresses becomes its edge Service's external IP. kube-proxy answers an
// external IP on every node, before local delivery, so an address is given only when all of
// these hold, and refused (with the reason, AddressAssignment.Refused) otherwise:
//   - it is inside one of allowed (--gateway-address-cidrs; none by default): otherwise a
//     Gateway could take traffic meant for any address (the Service externalIPs interception of
//     CVE-2020-8554, with the registrar's rights);
//   - it is no InternalIP or ExternalIP of any of nodes: as an external IP it would take that
//     node's own traffic on the Gateway's ports (the kubelet's 10250, the agent's DNS 18054, the
//     waypoint's 15443, its UDP local ports), from every client;
//   - no Service of services other than this Gateway's own edge Service (provisioned) uses it as
//     a spec.clusterIPs, spec.externalIPs or status.loadBalancer.ingress IP, whatever the
//     ports. The external IPs of the edge Services of gws are left out of this check: they are
//     what this assignment decides (an edge Service of a Gateway not in gws counts, until it is
//     deleted);
//   - no Gateway older than it (creationTimestamp, then namespace/name) holds one of the edge
//     ports (Ports) it needs on that address. A Gateway given an address holds every one of its
//     edge ports there, so two Gateways share an address only on different ports.
//
// gws are the Gateways to provision (each key once); the result has an entry for each. It is a
// pure function of its inputs: the same objects in any order give the same assignment. Addresses
// of other types, and values that are no IP address, are model.ResolveGateways' to refuse.
func AssignAddresses(gws []*gwv1.Gateway, allowed []netip.Prefix, services []corev1.Service, nodes []corev1.Node) map[model.GatewayKey]AddressAssignment {
	inRange := func(a netip.Addr) bool {
		return slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	assigned := map[model.GatewayKey]bool{}
	for _, gw := range gws {
		assigned[gatewayKey(gw)] = true
	}
	users := map[netip.Addr][]addressUser{}
	use := func(v string, u addressUser) {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return
		}
		if a = a.Unmap(); inRange(a) && !slices.Contains(users[a], u) {
			users[a] = append(users[a], u)
		}
	}
	for _, n := range sortedBy(nodes, func(n *corev1.Node) string { return n.Name }) {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				use(a.Address, addressUser{what: fmt.Sprintf("the %s of Node %s", a.Type, n.Name), node: true})
			}
		}
	}
	for _, s := range sortedBy(services, func(s *corev1.Service) string { return s.Namespace + "/" + s.Name }) {
		var edge model.GatewayKey
		if provisioned(s) {
			edge = model.GatewayKey{Namespace: s.Namespace, Name: s.Labels[gwv1.GatewayNameLabelKey]}
		}
		user := func(field string) addressUser {
			return addressUser{what: fmt.Sprintf("in use by Service %s/%s (%s)", s.Namespace, s.Name, field), edge: edge}
		}
		cluster := s.Spec.ClusterIPs
		if len(cluster) == 0 {
			cluster = []string{s.Spec.ClusterIP}
		}
		for _, ip := range cluster {
			use(ip, user("spec.clusterIPs"))
		}
		if !assigned[edge] {
			for _, ip := range s.Spec.ExternalIPs {
				use(ip, user("spec.externalIPs"))
			}
		}
		for _, in := range s.Status.LoadBalancer.Ingress {
			use(in.IP, user("status.loadBalancer.ingress"))
		}
	}

	oldestFirst := slices.Clone(gws)
	slices.SortFunc(oldestFirst, func(a, b *gwv1.Gateway) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	holders := map[edgePortOf]model.GatewayKey{}
	out := make(map[model.GatewayKey]AddressAssignment, len(gws))
	for _, gw := range oldestFirst {
		key, ports := gatewayKey(gw), Ports(gw)
		var as AddressAssignment
		for i, a := range gw.Spec.Addresses {
			if a.Type != nil && *a.Type != gwv1.IPAddressType {
				continue
			}
			ip, err := netip.ParseAddr(a.Value)
			if err != nil {
				continue
			}
			field := fmt.Sprintf("spec.addresses[%d]: value %s: ", i, ip)
			if !inRange(ip) {
				as.Refused = append(as.Refused, field+"not in the ranges the registrar may give Gateways (--gateway-address-cidrs): an address becomes the edge Service's external IP, which every node answers for")
				continue
			}
			if slices.Contains(as.ExternalIPs, ip.String()) {
				continue
			}
			addr := ip.Unmap()
			if i := slices.IndexFunc(users[addr], func(u addressUser) bool { return u.node || u.edge != key }); i >= 0 {
				u := users[addr][i]
				why := field + u.what
				if u.node {
					why += ": a node's address is never given (as an external IP, kube-proxy would send that node's own traffic on the Gateway's ports, such as the kubelet's or the agent's, to the Gateway)"
				}
				as.Refused = append(as.Refused, why)
				continue
			}
			var held []string
			for _, p := range ports {
				if h, ok := holders[edgePortOf{addr, p}]; ok && h != key {
					held = append(held, fmt.Sprintf("port %d/%s by Gateway %s", p.Port, p.Protocol, h))
				}
			}
			if len(held) > 0 {
				as.Refused = append(as.Refused, field+"held by an older Gateway (the oldest Gateway asking for an address keeps the ports it needs there): "+strings.Join(held, ", "))
				continue
			}
			for _, p := range ports {
				holders[edgePortOf{addr, p}] = key
			}
			as.ExternalIPs = append(as.ExternalIPs, ip.String())
		}
		out[key] = as
	}
	return out
}

// asksForAllowedAddress reports whether gw asks, in spec.addresses, for an IP address inside
// one of allowed: only then does AssignAddresses need the cluster's Services and Nodes.
func asksForAllowedAddress(gw *gwv1.Gateway, allowed []netip.Prefix) bool {
	return slices.ContainsFunc(gw.Spec.Addresses, func(a gwv1.GatewaySpecAddress) bool {
		ip, err := netip.ParseAddr(a.Value)
		return (a.Type == nil || *a.Type == gwv1.IPAddressType) && err == nil &&
			slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(ip) })
	})
}

// usesAddressIn reports whether one of ips (Service or Node addresses as the API writes them)
// is inside one of allowed.
func usesAddressIn(ips []string, allowed []netip.Prefix) bool {
	return slices.ContainsFunc(ips, func(v string) bool {
		ip, err := netip.ParseAddr(v)
		return err == nil && slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(ip.Unmap()) })
	})
}

// serviceAddresses are every address Service s uses: spec.clusterIP(s), spec.externalIPs and
// status.loadBalancer.ingress[].ip.
func serviceAddresses(s *corev1.Service) []string {
	out := append([]string{s.Spec.ClusterIP}, s.Spec.ClusterIPs...)
	out = append(out, s.Spec.ExternalIPs...)
	for _, in := range s.Status.LoadBalancer.Ingress {
		out = append(out, in.IP)
	}
	return out
}

// nodeAddresses are Node n's InternalIP and ExternalIP addresses.
func nodeAddresses(n *corev1.Node) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			out = append(out, a.Address)
		}
	}
	return out
}

func gatewayKey(gw *gwv1.Gateway) model.GatewayKey {
	return model.GatewayKey{Namespace: gw.Namespace, Name: gw.Name}
}

// sortedBy returns pointers to the items, sorted by key.
func sortedBy[T any](items []T, key func(*T) string) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	slices.SortFunc(out, func(a, b *T) int { return cmp.Compare(key(a), key(b)) })
	return out
}
