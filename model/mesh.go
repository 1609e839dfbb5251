package model

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// Defaults named by DESIGN.md.
const (
	DefaultMeshDomain  = "mesh"
	DefaultTrustDomain = "aether.internal"
	// ClustersetDomain is the MCS DNS zone: <svc>.<ns>.svc.clusterset.local.
	ClustersetDomain = "svc.clusterset.local"
)

// Node is the node an agent runs on.
type Node struct {
	Name   string
	IP     netip.Addr // InternalIP
	Region string
	Zone   string
	// PodCIDRs are the node's pod address ranges (Node spec.podCIDRs, KEP-563), each masked;
	// empty when the cluster allocates none (a CNI with IPAM of its own).
	PodCIDRs []netip.Prefix
}

// Mesh is one immutable version of the mesh model as one node's agent sees it. Builders read it;
// nobody changes it after it is published: a change makes a new Mesh (use New to build one).
type Mesh struct {
	// Version increases with every published model.
	Version uint64
	// Cluster is this agent's cluster name.
	Cluster     string
	MeshDomain  string
	TrustDomain string
	Node        Node
	// Services holds local services and imported ones, sorted by Key.
	Services []*Service
	// Endpoints maps a service to its endpoints in every cluster (remote endpoints only for
	// exported services), each list sorted by cluster, then pod UID.
	Endpoints map[ServiceKey][]Endpoint
	// Pods are the meshed pods on this node, sorted by namespace, then name.
	Pods []*LocalPod
	// Routing is the GAMMA routes bound to the services (ResolveRoutes); nil or empty when there
	// are none.
	Routing *Routing
	// L4Routing is the TCPRoutes and TLSRoutes bound to the services (ResolveL4Routes); nil or
	// empty when there are none.
	L4Routing *L4Routing
	// Gateways are the cluster's accepted edge Gateways with their programmed listeners
	// (ResolveGateways), sorted by key; EdgePods are this node's pods that serve one of them.
	Gateways []*EdgeGateway
	EdgePods []EdgePod
	// Authz maps a local pod's UID to the AuthorizationPolicies that select it (model/authz.go),
	// sorted by namespace, then name; a pod no policy selects has no entry (everything meshed may
	// call it).
	Authz map[string][]*AuthzPolicy
	// Inbound maps a local pod's UID to its inbound mTLS policy (ResolveInbound): the mode and
	// per-port exceptions its capture rules get; a pod that neither a PeerAuthentication nor an
	// authorization policy changes from the mesh default has no entry (the node default applies).
	Inbound map[string]PodInbound

	routeStatuses []RouteStatus
	authz         []AuthzResolved
	imports       *ConfigImports
	byKey         map[ServiceKey]*Service
	byVIP         map[netip.Addr]*Service
	shortOwner    map[string]ServiceKey
	clashes       []ShortNameClash
	skipped       []Skipped
}

// Skipped is a part of a Kubernetes object that Assemble left out of the model because the model
// cannot hold it, or a value it ignored (an unknown protocol: the default applies); the rest of
// the object and every other object are still in the model.
type Skipped struct {
	// Object is the object's kind and namespace/name, e.g. "ServiceImport shop/web".
	Object string
	// Field is the field's path in the object, e.g. "spec.ports[1].port".
	Field string
	// Value is the field's value as written.
	Value string
	// Reason says what was wanted.
	Reason string
}

// String returns "<object>: <field>: value <value>: <reason>".
func (s Skipped) String() string {
	return fmt.Sprintf("%s: %s: value %q: %s", s.Object, s.Field, s.Value, s.Reason)
}

// ShortNameClash reports a service name used in more than one namespace: the short name
// <svc>.<meshDomain> belongs to the oldest Service (Winner); the others only have their
// namespaced names.
type ShortNameClash struct {
	Name   string
	Winner ServiceKey
	Losers []ServiceKey
}

// New builds a Mesh from its parts, sorting them and computing the lookup indexes (by key, by VIP,
// short-name owners). It takes ownership of the slices and map it is given.
func New(version uint64, cluster, meshDomain, trustDomain string, node Node, services []*Service, endpoints map[ServiceKey][]Endpoint, pods []*LocalPod) *Mesh {
	if meshDomain == "" {
		meshDomain = DefaultMeshDomain
	}
	if trustDomain == "" {
		trustDomain = DefaultTrustDomain
	}
	if endpoints == nil {
		endpoints = map[ServiceKey][]Endpoint{}
	}
	slices.SortFunc(services, func(a, b *Service) int { return a.Key.Compare(b.Key) })
	for _, s := range services {
		slices.SortFunc(s.Ports, func(a, b ServicePort) int { return int(a.Port) - int(b.Port) })
	}
	for k, eps := range endpoints {
		endpoints[k] = sortEndpoints(eps)
	}
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
	m := &Mesh{
		Version: version, Cluster: cluster, MeshDomain: meshDomain, TrustDomain: trustDomain,
		Node: node, Services: services, Endpoints: endpoints, Pods: pods,
		byKey: map[ServiceKey]*Service{}, byVIP: map[netip.Addr]*Service{}, shortOwner: map[string]ServiceKey{},
	}
	byName := map[string][]*Service{}
	for _, s := range services {
		m.byKey[s.Key] = s
		for _, ip := range s.AllVIPs() {
			m.byVIP[ip] = s
		}
		if s.Local {
			byName[s.Key.Name] = append(byName[s.Key.Name], s)
		}
	}
	for name, ss := range byName {
		// Oldest wins; ties broken by namespace so the outcome never depends on input order.
		slices.SortStableFunc(ss, func(a, b *Service) int {
			if c := a.Created.Compare(b.Created); c != 0 {
				return c
			}
			return a.Key.Compare(b.Key)
		})
		m.shortOwner[name] = ss[0].Key
		if len(ss) > 1 {
			c := ShortNameClash{Name: name, Winner: ss[0].Key}
			for _, s := range ss[1:] {
				c.Losers = append(c.Losers, s.Key)
			}
			m.clashes = append(m.clashes, c)
		}
	}
	slices.SortFunc(m.clashes, func(a, b ShortNameClash) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return m
}

// Service returns the service with key k, or nil.
func (m *Mesh) Service(k ServiceKey) *Service { return m.byKey[k] }

// ServiceByVIP returns the service whose local or clusterset VIP is ip, or nil.
func (m *Mesh) ServiceByVIP(ip netip.Addr) *Service { return m.byVIP[ip] }

// ShortNameOwner returns the service that owns the short name <name>.<meshDomain>: the only local
// service with that name, or the oldest on a clash.
func (m *Mesh) ShortNameOwner(name string) (ServiceKey, bool) {
	k, ok := m.shortOwner[name]
	return k, ok
}

// ShortNameClashes lists the service names used in more than one namespace, sorted by name.
func (m *Mesh) ShortNameClashes() []ShortNameClash { return m.clashes }

// RouteStatuses returns the status ResolveRoutes computed for each route of the model's sources,
// then the status ResolveL4Routes computed for each L4 route (GRPCRoutes, HTTPRoutes,
// TCPRoutes, TLSRoutes, UDPRoutes, each kind in the order given); nil for a Mesh made with New.
func (m *Mesh) RouteStatuses() []RouteStatus { return m.routeStatuses }

// AuthzResolved returns what ResolveAuthz made of each AuthorizationPolicy of the model's
// sources, sorted by namespace, then name (nil for a Mesh made with New): the inputs of each
// policy's status.
func (m *Mesh) AuthzResolved() []AuthzResolved { return m.authz }

// ConfigImports returns what Assemble did with Sources.Projections (nil for a Mesh made with New).
func (m *Mesh) ConfigImports() *ConfigImports { return m.imports }

// Skipped lists what Assemble left out of this model, in the order of its sources (nil for a
// Mesh made with New).
func (m *Mesh) Skipped() []Skipped { return m.skipped }

// FQDN returns the mesh name <svc>.<ns>.<meshDomain> of k (no trailing dot).
func (m *Mesh) FQDN(k ServiceKey) string { return k.Name + "." + k.Namespace + "." + m.MeshDomain }

// ShortName returns <svc>.<meshDomain> when k owns that short name, else "".
func (m *Mesh) ShortName(k ServiceKey) string {
	if o, ok := m.shortOwner[k.Name]; ok && o == k {
		return k.Name + "." + m.MeshDomain
	}
	return ""
}

// ClustersetName returns <svc>.<ns>.svc.clusterset.local (no trailing dot).
func ClustersetName(k ServiceKey) string { return k.Name + "." + k.Namespace + "." + ClustersetDomain }

// Pod returns the local pod with the given UID, or nil.
func (m *Mesh) Pod(uid string) *LocalPod {
	for _, p := range m.Pods {
		if p.UID == uid {
			return p
		}
	}
	return nil
}

// compareEndpoints orders endpoints by cluster, then pod UID.
func compareEndpoints(a, b *Endpoint) int {
	if c := strings.Compare(a.Cluster, b.Cluster); c != 0 {
		return c
	}
	return strings.Compare(a.PodUID, b.PodUID)
}

// sortEndpoints returns eps ordered by compareEndpoints. Endpoint is a large
// struct: the sort moves 4-byte indices, not endpoints, and the result is one permuting copy
// (eps itself when already sorted).
func sortEndpoints(eps []Endpoint) []Endpoint {
	sorted := true
	for i := 1; i < len(eps) && sorted; i++ {
		sorted = compareEndpoints(&eps[i-1], &eps[i]) <= 0
	}
	if sorted {
		return eps
	}
	idx := make([]int32, len(eps))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int { return compareEndpoints(&eps[a], &eps[b]) })
	out := make([]Endpoint, len(eps))
	for i, j := range idx {
		out[i] = eps[j]
	}
	return out
}
