package xds

import (
	"net/netip"
	"slices"
	"strconv"

	xdscore "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	udpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/udp/udp_proxy/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// UDPRoutes in the mesh (docs/routing.md, "L4 routes"). A pod's capture redirects its datagrams
// to a routed frontend's VIP and port to that frontend's local port (model.UDPFrontend), where
// the pod has a UDP listener of the node Envoy (udpPodListener); its udp_proxy sends them on,
// from the node, to the route's backends' pods (udpCluster, shared with the edge's UDP
// listeners).

// udpRouteClusterName is the static cluster of a UDPRoute's backends' pods in the mesh:
// "udproute|<ns>/<name>" (one per route: every frontend it binds has the same backends).
func udpRouteClusterName(r model.RouteRef) string { return l4ChainName(r) }

// udpPodListenerName is pod p's UDP listener of the routed frontend with local port port:
// "udp|<ns>/<name>|<port>" (the port is in the name: Envoy cannot move a listener's address).
func udpPodListenerName(p *model.LocalPod, port uint16) string {
	return "udp|" + p.Namespace + "/" + p.Name + "|" + strconv.Itoa(int(port))
}

// udpServed are the routed UDP frontends the pods' listeners serve: the model's and those
// Options.UDPHeld still holds (a frontend whose redirect may still be installed in some pod
// keeps its listener until the redirect is gone), each local port once, the model's first,
// sorted by local port.
func udpServed(m *model.Mesh, opts Options) []model.UDPFrontend {
	fs := m.UDPFrontends()
	if opts.UDPHeld != nil {
		fs = append(fs, opts.UDPHeld()...)
	}
	seen := map[uint16]bool{}
	out := fs[:0:0]
	for _, f := range fs {
		if !seen[f.LocalPort] {
			seen[f.LocalPort] = true
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b model.UDPFrontend) int { return int(a.LocalPort) - int(b.LocalPort) })
	return out
}

// udpClusters are the clusters of the served UDP frontends' routes (udpCluster), one per route,
// sorted by name: the model's route where a held frontend names the same route.
func udpClusters(m *model.Mesh, fs []model.UDPFrontend, opts Options) []*clusterv3.Cluster {
	byName := map[string]*clusterv3.Cluster{}
	for _, f := range fs {
		name := udpRouteClusterName(f.Route.Route)
		if byName[name] == nil {
			byName[name] = udpCluster(m, name, f.Route.Backends, opts)
		}
	}
	out := make([]*clusterv3.Cluster, 0, len(byName))
	for _, f := range fs {
		if c := byName[udpRouteClusterName(f.Route.Route)]; c != nil && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	sortByName(out, (*clusterv3.Cluster).GetName)
	return out
}

// udpPodListeners are pod p's UDP listeners, one per served frontend (an IPv6 frontend only
// for a pod with an IPv6 address: the capture drops IPv6 in other pods).
func udpPodListeners(p *model.LocalPod, fs []model.UDPFrontend) ([]*listenerv3.Listener, error) {
	v6 := slices.ContainsFunc(p.IPs, func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() })
	var out []*listenerv3.Listener
	for _, f := range fs {
		if f.VIP.Is6() && !v6 {
			continue
		}
		l, err := udpPodListener(p, f)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// udpPodListener is pod p's UDP listener of frontend f on 127.0.0.1:<local port> (::1 for an
// IPv6 VIP) inside the pod's netns, the target of the pod's capture redirect of f's VIP and
// port: udp_proxy to the cluster of f's route. The application's datagrams arrive from its own
// address and port, and each such source is one udp_proxy session (sticking to one backend
// pod until it has been idle for udp_proxy's idle timeout, 60 s); replies come back from the
// local port, which the conntrack entry of the redirect turns back into the VIP and port.
func udpPodListener(p *model.LocalPod, f model.UDPFrontend) (*listenerv3.Listener, error) {
	lo := "127.0.0.1"
	if f.VIP.Is6() {
		lo = "::1"
	}
	up, err := udpProxyFilter("mesh_udp", udpRouteClusterName(f.Route.Route))
	if err != nil {
		return nil, err
	}
	return udpListener(udpPodListenerName(p, f.LocalPort), xdsproto.SocketAddress(lo, uint32(f.LocalPort), p.NetnsPath), up), nil
}

// udpListener is a UDP listener named name on addr (its protocol set to UDP) with the listener
// filter up (udpProxyFilter).
func udpListener(name string, addr *core.Address, up *listenerv3.ListenerFilter) *listenerv3.Listener {
	addr.GetSocketAddress().Protocol = core.SocketAddress_UDP
	return &listenerv3.Listener{
		Name:              name,
		Address:           addr,
		UdpListenerConfig: &listenerv3.UdpListenerConfig{},
		ListenerFilters:   []*listenerv3.ListenerFilter{up},
	}
}

// udpProxyFilter is a udp_proxy listener filter that sends every datagram to cluster: a matcher
// with only its on_no_match action (the route_specifier the deprecated cluster field gives way
// to).
func udpProxyFilter(statPrefix, cluster string) (*listenerv3.ListenerFilter, error) {
	route, err := xdsproto.ToAny(&udpv3.Route{Cluster: cluster})
	if err != nil {
		return nil, err
	}
	up, err := xdsproto.ToAny(&udpv3.UdpProxyConfig{StatPrefix: statPrefix, RouteSpecifier: &udpv3.UdpProxyConfig_Matcher{Matcher: &xdsmatcher.Matcher{
		OnNoMatch: &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{Action: &xdscore.TypedExtensionConfig{Name: "route", TypedConfig: route}}},
	}}})
	if err != nil {
		return nil, err
	}
	return &listenerv3.ListenerFilter{Name: "envoy.filters.udp_listener.udp_proxy",
		ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: up}}, nil
}

// udpCluster is the static cluster name of a UDP route's backends' pods (udp_proxy has no
// weighted clusters): each healthy pod of a valid backend with weight at pod_ip:targetPort,
// weighted by its backend's weight over the backend's pod count (at least 1). UDP is not carried
// over mTLS (there is no mesh UDP transport; the waypoint carries TLS only), so the datagrams go
// in the clear to the pods: only this cluster's pods, and with EastWestWaypoint off (pod IPs
// routable between clusters) every exporting cluster's. The upstream sockets are Envoy's own
// (the node's netns for the node Envoy, the edge pod's for an edge Envoy).
func udpCluster(m *model.Mesh, name string, backends []model.BackendRef, opts Options) *clusterv3.Cluster {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	loc := &endpointv3.LocalityLbEndpoints{}
	for _, bk := range backends {
		s := m.Service(bk.Service)
		if bk.Invalid != nil || bk.Weight <= 0 || s == nil {
			continue
		}
		i := slices.IndexFunc(s.Ports, func(sp model.ServicePort) bool { return sp.Port == bk.Port })
		if i < 0 {
			continue
		}
		type target struct {
			ip   string
			port uint32
		}
		var ts []target
		for _, ep := range m.Endpoints[bk.Service] {
			if !ep.Healthy || (opts.viaWaypoint() && ep.Cluster != m.Cluster) {
				continue
			}
			ip, ok := model.MeshAddr(ep.IPs)
			port, pok := s.Ports[i].EndpointPort(&ep, m.Cluster)
			if ok && pok {
				ts = append(ts, target{ip.String(), port.Port})
			}
		}
		for _, t := range ts {
			a := xdsproto.SocketAddress(t.ip, t.port, "")
			a.GetSocketAddress().Protocol = core.SocketAddress_UDP
			// Weights are per endpoint: a backend's share spread over its pods (at least 1 each).
			w := max(uint32(bk.Weight)*1000/uint32(len(ts)), 1)
			loc.LbEndpoints = append(loc.LbEndpoints, &endpointv3.LbEndpoint{
				HostIdentifier:      &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: a}},
				LoadBalancingWeight: wrapperspb.UInt32(w),
			})
		}
	}
	if len(loc.LbEndpoints) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{loc}
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       xdsproto.ConnectTimeout(opts.ConnectTimeout),
		LoadAssignment:       cla,
	}
}
