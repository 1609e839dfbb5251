package xds

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// priority orders endpoints of m by cluster, then locality (DESIGN.md, data flow 5; Envoy
// LocalityLbEndpoints.priority, lower first): within this cluster 0 = this node's region and zone,
// 1 = its region, another zone, 2 = another region; other clusters' endpoints likewise at 3, 4
// and 5, so traffic leaves the cluster only when no local endpoint is healthy, and then goes to
// the nearest. loadAssignment numbers the tiers a service actually has 0, 1, ... in this order.
func priority(m *model.Mesh, ep *model.Endpoint) uint32 {
	var p uint32
	switch {
	case ep.Region == m.Node.Region && ep.Zone == m.Node.Zone:
		p = 0
	case ep.Region == m.Node.Region:
		p = 1
	default:
		p = 2
	}
	if ep.Cluster != m.Cluster {
		p += remoteTier
	}
	return p
}

// remoteTier is the priority offset of other clusters' endpoints: they come after every endpoint
// of this cluster, and locality orders them within their tier as it does this cluster's.
const remoteTier = 3

// localityKey groups a service port's endpoints into LocalityLbEndpoints.
type localityKey struct {
	prio                  uint32
	region, zone, cluster string
}

// loadAssignment is the EDS resource of one service port of m: every endpoint serving it (on its
// own target port, model.ServicePort.EndpointPort; one that differs from sp.TargetPort carries the
// metadata that selects its SNI socket) at pod_ip:15008, grouped by (priority, region, zone,
// cluster), unhealthy ones marked so; with viaWaypoint, other clusters' endpoints as one entry
// per remote node at node_ip:15443 instead. The groups are few (a linear search finds them) and
// the endpoints' messages are allocated in one block per kind, since a large mesh's EDS
// resources are most of a cold build. With local, the resource of LocalClusterName: this
// cluster's endpoints only.
func loadAssignment(m *model.Mesh, s *model.Service, sp model.ServicePort, viaWaypoint, local bool) *endpointv3.ClusterLoadAssignment {
	type group struct {
		key localityKey
		lbs []*endpointv3.LbEndpoint
	}
	var groups []group
	find := func(k localityKey) *group {
		for i := range groups {
			if groups[i].key == k {
				return &groups[i]
			}
		}
		groups = append(groups, group{key: k})
		return &groups[len(groups)-1]
	}
	type nodeKey struct {
		localityKey
		node netip.Addr
	}
	waypoints := map[nodeKey]map[uint32]waypointPods{} // per remote node, per target port
	all := m.Endpoints[s.Key]
	// Each endpoint serves sp on its own port (a named targetPort may differ from pod to pod).
	serves := func(ep *model.Endpoint) bool {
		if local && ep.Cluster != m.Cluster {
			return false
		}
		_, ok := sp.EndpointPort(ep, m.Cluster)
		return ok
	}
	n := 0
	for i := range all {
		if serves(&all[i]) {
			n++
		}
	}
	var (
		lbs   = make([]endpointv3.LbEndpoint, n)
		hids  = make([]endpointv3.LbEndpoint_Endpoint, n)
		eps   = make([]endpointv3.Endpoint, n)
		addrs = make([]core.Address, n)
		sas   = make([]core.Address_SocketAddress, n)
		socks = make([]core.SocketAddress, n)
		ports = make([]core.SocketAddress_PortValue, n)
	)
	j := 0
	for i := range all {
		ep := &all[i]
		if !serves(ep) {
			continue
		}
		if viaWaypoint && ep.Cluster != m.Cluster {
			if ep.NodeIP.IsValid() {
				p, _ := sp.EndpointPort(ep, m.Cluster)
				nk := nodeKey{localityKey{priority(m, ep), ep.Region, ep.Zone, ep.Cluster}, ep.NodeIP}
				if waypoints[nk] == nil {
					waypoints[nk] = map[uint32]waypointPods{}
				}
				wp := waypoints[nk][p.Port]
				wp.all++
				if ep.Healthy {
					wp.healthy++
				}
				waypoints[nk][p.Port] = wp
			}
			continue
		}
		ip, ok := model.MeshAddr(ep.IPs)
		if !ok {
			continue
		}
		ports[j].PortValue = InboundPort
		socks[j].Address, socks[j].PortSpecifier = ip.String(), &ports[j]
		sas[j].SocketAddress = &socks[j]
		addrs[j].Address = &sas[j]
		eps[j].Address = &addrs[j]
		hids[j].Endpoint = &eps[j]
		lbs[j].HostIdentifier, lbs[j].HealthStatus = &hids[j], xdsproto.HealthStatus(ep.Healthy)
		if p, _ := sp.EndpointPort(ep, m.Cluster); p.Port != sp.TargetPort {
			// Selects the cluster's socket with SNI "<port>" (outboundCluster, otherTargetPorts).
			lbs[j].Metadata = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
				"envoy.transport_socket_match": {Fields: map[string]*structpb.Value{portMatchKey: structpb.NewStringValue(strconv.FormatUint(uint64(p.Port), 10))}},
			}}
		}
		g := find(localityKey{priority(m, ep), ep.Region, ep.Zone, ep.Cluster})
		g.lbs = append(g.lbs, &lbs[j])
		j++
	}
	nodes := slices.SortedFunc(maps.Keys(waypoints), func(a, c nodeKey) int { return a.node.Compare(c.node) })
	for _, nk := range nodes {
		port := waypointPort(waypoints[nk], sp.TargetPort)
		healthy := waypoints[nk][port].healthy
		hs, weight := core.HealthStatus_HEALTHY, healthy
		if healthy == 0 {
			hs, weight = core.HealthStatus_UNHEALTHY, 1
		}
		match := map[string]*structpb.Value{"waypoint": structpb.NewBoolValue(true)}
		if port != sp.TargetPort {
			// Selects the cluster's "waypoint-<port>" socket (SNI of that port).
			match[portMatchKey] = structpb.NewStringValue(strconv.FormatUint(uint64(port), 10))
		}
		g := find(nk.localityKey)
		g.lbs = append(g.lbs, &endpointv3.LbEndpoint{
			HostIdentifier:      &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: xdsproto.SocketAddress(nk.node.String(), WaypointPort, "")}},
			HealthStatus:        hs,
			LoadBalancingWeight: wrapperspb.UInt32(weight),
			Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
				"envoy.transport_socket_match": {Fields: match},
			}},
		})
	}
	slices.SortFunc(groups, func(a, c group) int {
		return cmp.Or(cmp.Compare(a.key.prio, c.key.prio), cmp.Compare(a.key.cluster, c.key.cluster), cmp.Compare(a.key.region, c.key.region), cmp.Compare(a.key.zone, c.key.zone))
	})
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: ClusterName(m, s.Key, sp.Port)}
	if local {
		cla.ClusterName = LocalClusterName(m, s.Key, sp.Port)
	}
	if len(groups) > 0 {
		cla.Endpoints = make([]*endpointv3.LocalityLbEndpoints, 0, len(groups))
	}
	// Envoy's priorities run from 0 without gaps (LocalityLbEndpoints.priority): the tiers
	// present are numbered in order.
	var prio uint32
	for i, g := range groups {
		if i > 0 && g.key.prio != groups[i-1].key.prio {
			prio++
		}
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:    &core.Locality{Region: g.key.region, Zone: g.key.zone, SubZone: g.key.cluster},
			Priority:    prio,
			LbEndpoints: g.lbs,
		})
	}
	return cla
}

// waypointPods counts one remote node's endpoints of a service port on one target port.
type waypointPods struct{ healthy, all uint32 }

// waypointPort picks the one target port, of those a remote node's pods serve a service port on
// (a named targetPort may differ from pod to pod), that the node's waypoint entry carries: the
// one with the most healthy pods, then the most pods, then target (the service port's
// TargetPort), then the lowest. One entry per node and port is not possible: Envoy keeps only
// the first of several EDS hosts with one address (all node_ip:15443), so the other ports' pods
// on that node get no traffic through the waypoint; no connection is sent with an SNI its pod
// does not serve.
func waypointPort(ports map[uint32]waypointPods, target uint32) uint32 {
	var best uint32
	var bp waypointPods
	for _, p := range slices.Sorted(maps.Keys(ports)) {
		c := ports[p]
		if best == 0 || c.healthy > bp.healthy || c.healthy == bp.healthy && (c.all > bp.all || c.all == bp.all && p == target) {
			best, bp = p, c
		}
	}
	return best
}
