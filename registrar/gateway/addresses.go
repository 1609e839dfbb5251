package gateway

import (
	"cmp"
	"fmt"
	"maps"
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
	// namespace and name are the Service's (empty for a Node); field is where it has the
	// address ("spec.clusterIPs").
	namespace, name, field string
	// edge is the Gateway whose edge Service this is (provisioned), zero for any other object.
	edge model.GatewayKey
	node bool
}

// describe is u as the refusal of an address to a Gateway in namespace ns names it: a Service of
// ns by name, one of another namespace without (a tenant learns no other namespace's objects
// from its Gateway's status), a node without its name.
func (u addressUser) describe(ns string) string {
	switch {
	case u.node:
		return "the address of a Node: a node's address is never given (as an external IP, kube-proxy would send that node's own traffic on the Gateway's ports, such as the kubelet's or the agent's, to the Gateway)"
	case u.namespace == ns:
		return fmt.Sprintf("in use by Service %s/%s (%s)", u.namespace, u.name, u.field)
	default:
		return "in use by a Service of another namespace"
	}
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
//   - no other Gateway holds one of the edge ports (Ports) it needs on that address: the Gateway
//     whose edge Service has the address now keeps it, and of the others asking the oldest
//     (creationTimestamp, then namespace/name) gets it when it is free, so no Gateway takes an
//     address away from another by being older. A Gateway given an address holds every one of
//     its edge ports there, so two Gateways share an address only on different ports.
//
// A refusal names a Service or Gateway of the asking Gateway's namespace, and only says "of
// another namespace" of others: a Gateway's status tells its tenant nothing of other namespaces.
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
				use(a.Address, addressUser{node: true})
			}
		}
	}
	// current holds, by address, the Gateways of gws whose edge Service has it as an external IP
	// now: an address stays with the Gateway that has it.
	current := map[netip.Addr][]model.GatewayKey{}
	// serving holds the edge ports each such Service serves now.
	serving := map[model.GatewayKey][]EdgePort{}
	for _, s := range sortedBy(services, func(s *corev1.Service) string { return s.Namespace + "/" + s.Name }) {
		var edge model.GatewayKey
		if provisioned(s) {
			edge = model.GatewayKey{Namespace: s.Namespace, Name: s.Labels[gwv1.GatewayNameLabelKey]}
		}
		user := func(field string) addressUser {
			return addressUser{namespace: s.Namespace, name: s.Name, field: field, edge: edge}
		}
		cluster := s.Spec.ClusterIPs
		if len(cluster) == 0 {
			cluster = []string{s.Spec.ClusterIP}
		}
		for _, ip := range cluster {
			use(ip, user("spec.clusterIPs"))
		}
		if assigned[edge] {
			for _, p := range s.Spec.Ports {
				serving[edge] = append(serving[edge], EdgePort{Port: p.Port, Protocol: p.Protocol})
			}
		}
		for _, ip := range s.Spec.ExternalIPs {
			if !assigned[edge] {
				use(ip, user("spec.externalIPs"))
			} else if a, err := netip.ParseAddr(ip); err == nil {
				current[a.Unmap()] = append(current[a.Unmap()], edge)
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
	// claim is one address a Gateway asks for that passed the range and user checks.
	type claim struct {
		gw        *gwv1.Gateway
		age       int // the Gateway's place in oldestFirst
		index     int // in spec.addresses
		ip        netip.Addr
		incumbent bool // its edge Service has the address now
	}
	var claims []claim
	refused := map[model.GatewayKey]map[int]string{}
	refuse := func(key model.GatewayKey, i int, why string) {
		if refused[key] == nil {
			refused[key] = map[int]string{}
		}
		refused[key][i] = why
	}
	for age, gw := range oldestFirst {
		key := gatewayKey(gw)
		var asked []netip.Addr
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
				refuse(key, i, field+"not in the ranges the registrar may give Gateways (--gateway-address-cidrs): an address becomes the edge Service's external IP, which every node answers for")
				continue
			}
			addr := ip.Unmap()
			if slices.Contains(asked, addr) {
				continue
			}
			asked = append(asked, addr)
			if j := slices.IndexFunc(users[addr], func(u addressUser) bool { return u.node || u.edge != key }); j >= 0 {
				refuse(key, i, field+users[addr][j].describe(gw.Namespace))
				continue
			}
			claims = append(claims, claim{gw: gw, age: age, index: i, ip: ip, incumbent: slices.Contains(current[addr], key)})
		}
	}
	// The Gateway that has an address keeps it; the oldest of the others asking get it when it
	// is free. A Gateway cannot take an address away from another by being older.
	slices.SortStableFunc(claims, func(a, b claim) int {
		if a.incumbent != b.incumbent {
			if a.incumbent {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.age, b.age)
	})
	// The ports a Gateway that has an address serves there now, and still needs, are its own
	// before anything is decided: a Gateway that has an address on other ports cannot take
	// them by adding a listener (it would lose, not win, the address).
	holders := map[edgePortOf]model.GatewayKey{}
	for _, c := range claims {
		if !c.incumbent {
			continue
		}
		key, needs := gatewayKey(c.gw), Ports(c.gw)
		for _, p := range serving[key] {
			op := edgePortOf{c.ip.Unmap(), p}
			if _, taken := holders[op]; !taken && slices.Contains(needs, p) {
				holders[op] = key
			}
		}
	}
	given := map[model.GatewayKey][]claim{}
	for _, c := range claims {
		key, addr := gatewayKey(c.gw), c.ip.Unmap()
		var held []string
		for _, p := range Ports(c.gw) {
			h, ok := holders[edgePortOf{addr, p}]
			if !ok || h == key {
				continue
			}
			if h.Namespace == key.Namespace {
				held = append(held, fmt.Sprintf("port %d/%s by Gateway %s", p.Port, p.Protocol, h))
			} else {
				held = append(held, fmt.Sprintf("port %d/%s by a Gateway of another namespace", p.Port, p.Protocol))
			}
		}
		if len(held) > 0 {
			refuse(key, c.index, fmt.Sprintf("spec.addresses[%d]: value %s: held by another Gateway (an address stays with the Gateway that has it; of the others asking, the oldest gets it when it is free): %s",
				c.index, c.ip, strings.Join(held, ", ")))
			continue
		}
		for _, p := range Ports(c.gw) {
			holders[edgePortOf{addr, p}] = key
		}
		given[key] = append(given[key], c)
	}
	out := make(map[model.GatewayKey]AddressAssignment, len(gws))
	for _, gw := range gws {
		key := gatewayKey(gw)
		var as AddressAssignment
		cs := given[key]
		slices.SortFunc(cs, func(a, b claim) int { return cmp.Compare(a.index, b.index) })
		for _, c := range cs {
			as.ExternalIPs = append(as.ExternalIPs, c.ip.String())
		}
		for _, i := range slices.Sorted(maps.Keys(refused[key])) {
			as.Refused = append(as.Refused, refused[key][i])
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
