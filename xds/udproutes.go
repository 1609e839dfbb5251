package xds

import (
	"net/netip"
	"slices"

	xdscore "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	udpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/udp/udp_proxy/v3"
	netinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// UDPRoutes in the mesh (docs/routing.md, "L4 routes"). A pod's capture DNATs its datagrams to
// a routed frontend's VIP and port to the node's address and that frontend's local port
// (model.UDPFrontend, capture.UDPRedirect), where the node Envoy has one UDP listener per
// frontend (udpNodeListener); its udp_proxy sends them on, from the node, to the route's
// backends' pods (udpCluster, shared with the edge's UDP listeners).

// udpRouteClusterName is the static cluster of a UDPRoute's backends' pods in the mesh:
// "udproute|<ns>/<name>" (one per route: every frontend it binds has the same backends).
func udpRouteClusterName(r model.RouteRef) string { return l4ChainName(r) }

// udpNodeListenerName is the node's UDP listener of a routed frontend on addr:
// "udp|<host>:<local port>" (the address is in the name: Envoy cannot move a listener).
func udpNodeListenerName(addr netip.AddrPort) string { return "udp|" + addr.String() }

// UDPFrontends are the model's routed UDP frontends (model.Mesh.UDPFrontends) the node can
// serve: those of a family with a host address (HostIP, HostIPv6). The agent redirects exactly
// these in the pods' capture.
func (o Options) UDPFrontends(m *model.Mesh) []model.UDPFrontend {
	return slices.DeleteFunc(m.UDPFrontends(), func(f model.UDPFrontend) bool { return !o.udpHost(f.VIP).IsValid() })
}

// udpHost is the node address of frontends of vip's family (invalid when there is none).
func (o Options) udpHost(vip netip.Addr) netip.Addr {
	if vip.Is6() && !vip.Is4In6() {
		return o.HostIPv6
	}
	return o.HostIP
}

// udpServed are the routed UDP frontends the node's listeners serve, sorted by local port: those
// Options.UDPHeld still holds (a frontend whose redirect may still be installed in some pod keeps
// its listener, to its route, until the redirect is gone) and the servable ones of the model
// (Options.UDPFrontends) on the other local ports. A model frontend whose local port a held
// frontend of another VIP or port still has waits for it (the agent installs its redirect only
// after that), so a pod's datagrams never reach another frontend's route. A held frontend without
// a route (a redirect a previous agent left, agent's udpCapture.hold) is not served.
func udpServed(m *model.Mesh, opts Options) []model.UDPFrontend {
	var fs []model.UDPFrontend
	if opts.UDPHeld != nil {
		for _, f := range opts.UDPHeld() {
			if opts.udpHost(f.VIP).IsValid() {
				fs = append(fs, f)
			}
		}
	}
	for _, f := range opts.UDPFrontends(m) {
		if i := slices.IndexFunc(fs, func(h model.UDPFrontend) bool { return h.LocalPort == f.LocalPort }); i >= 0 {
			if fs[i].VIP == f.VIP && fs[i].Port == f.Port {
				fs[i] = f // the model's route for it: its backends as they are now
			}
			continue
		}
		fs = append(fs, f)
	}
	seen := map[uint16]bool{}
	out := fs[:0:0]
	for _, f := range fs {
		// A held frontend without a route (a previous agent's redirect) only keeps its port.
		if !seen[f.LocalPort] && f.Route.Route != (model.RouteRef{}) {
			out = append(out, f)
		}
		seen[f.LocalPort] = true
	}
	slices.SortFunc(out, func(a, b model.UDPFrontend) int { return int(a.LocalPort) - int(b.LocalPort) })
	return out
}

// udpClusters are the clusters of the served UDP frontends' routes (udpCluster), one per route,
// sorted by name, each with the backends of the model's route where the model still has it (a
// held frontend carries its route as it was).
func udpClusters(m *model.Mesh, fs []model.UDPFrontend, opts Options) []*clusterv3.Cluster {
	byName := map[string]*clusterv3.Cluster{}
	for _, f := range slices.Concat(opts.UDPFrontends(m), fs) {
		name := udpRouteClusterName(f.Route.Route)
		if byName[name] == nil && slices.ContainsFunc(fs, func(s model.UDPFrontend) bool { return s.Route.Route == f.Route.Route }) {
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

// udpSources are the source ranges the node's UDP listeners relay: the node's pod CIDRs and each
// local pod address outside them (a CNI without node pod CIDRs: then every pod added or removed
// changes the listeners), sorted. Nothing else reaches a route's backends through the node:
// not another node, not a host outside the cluster, which could otherwise send datagrams to
// HOST_IP and have them relayed from the node's address.
func udpSources(m *model.Mesh) []netip.Prefix {
	out := slices.Clone(m.Node.PodCIDRs)
	for _, p := range m.Pods {
		for _, a := range p.IPs {
			a = a.Unmap()
			if !slices.ContainsFunc(out, func(c netip.Prefix) bool { return c.Contains(a) }) {
				out = append(out, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}

// udpNodeListeners are the node's UDP listeners, one per served frontend (udpNodeListener); none
// while there is no source to relay (no pod CIDRs and no local pod: a listener then would have
// no range to match, and nothing of the node's would send to it).
func udpNodeListeners(m *model.Mesh, fs []model.UDPFrontend, opts Options) ([]*listenerv3.Listener, error) {
	sources := udpSources(m)
	if len(sources) == 0 {
		return nil, nil
	}
	out := make([]*listenerv3.Listener, 0, len(fs))
	for _, f := range fs {
		l, err := udpNodeListener(f, sources, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// udpNodeListener is the node's UDP listener of frontend f on <host>:<local port> (HostIP, or
// HostIPv6 for an IPv6 VIP) in the node's netns, the target of the pods' capture DNAT of f's VIP
// and port: udp_proxy to the cluster of f's route for datagrams from sources (udpSources), the
// rest dropped (udp_proxy's downstream_sess_no_route). The application's datagrams arrive from
// its own address and port, and each such source is one udp_proxy session (sticking to one
// backend pod until it has been idle for udp_proxy's idle timeout, 60 s); replies go back from
// the local port, which the conntrack entry of the pod's DNAT turns back into the VIP and port.
// The listener binds with IP_FREEBIND, as the tunnel listener does: a host address not (yet) on
// the host does not make Envoy refuse the whole LDS update.
func udpNodeListener(f model.UDPFrontend, sources []netip.Prefix, opts Options) (*listenerv3.Listener, error) {
	host := netip.AddrPortFrom(opts.udpHost(f.VIP), f.LocalPort)
	up, err := udpProxyFilterFrom("mesh_udp", udpRouteClusterName(f.Route.Route), sources)
	if err != nil {
		return nil, err
	}
	l := udpListener(udpNodeListenerName(host), xdsproto.SocketAddress(host.Addr().String(), uint32(host.Port()), opts.UpstreamNetns), up)
	l.Freebind = wrapperspb.Bool(true)
	return l, nil
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
	return udpProxyFilterFrom(statPrefix, cluster, nil)
}

// udpProxyFilterFrom is udpProxyFilter for datagrams from sources only (nil: from anywhere, the
// edge's listeners): a matcher tree on the source address (envoy.matching.inputs.source_ip)
// with an IP range matcher (xds.type.matcher.v3.IPMatcher) whose one range matcher holds
// sources; a datagram from elsewhere matches no route and is dropped. Non-nil empty sources
// drop everything.
func udpProxyFilterFrom(statPrefix, cluster string, sources []netip.Prefix) (*listenerv3.ListenerFilter, error) {
	route, err := xdsproto.ToAny(&udpv3.Route{Cluster: cluster})
	if err != nil {
		return nil, err
	}
	action := &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{Action: &xdscore.TypedExtensionConfig{Name: "route", TypedConfig: route}}}
	matcher := &xdsmatcher.Matcher{OnNoMatch: action}
	if sources != nil {
		src, err := xdsproto.ToAny(&netinputsv3.SourceIPInput{})
		if err != nil {
			return nil, err
		}
		ranges := make([]*xdscore.CidrRange, 0, len(sources))
		for _, p := range sources {
			ranges = append(ranges, &xdscore.CidrRange{AddressPrefix: p.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(p.Bits()))})
		}
		ipm := &xdsmatcher.IPMatcher{}
		if len(ranges) > 0 {
			ipm.RangeMatchers = []*xdsmatcher.IPMatcher_IPRangeMatcher{{Ranges: ranges, OnMatch: action}}
		}
		ipAny, err := xdsproto.ToAny(ipm)
		if err != nil {
			return nil, err
		}
		matcher = &xdsmatcher.Matcher{MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
			Input: &xdscore.TypedExtensionConfig{Name: "source-ip", TypedConfig: src},
			TreeType: &xdsmatcher.Matcher_MatcherTree_CustomMatch{CustomMatch: &xdscore.TypedExtensionConfig{
				Name: "envoy.matching.custom_matchers.trie_matcher", TypedConfig: ipAny}},
		}}}
	}
	up, err := xdsproto.ToAny(&udpv3.UdpProxyConfig{StatPrefix: statPrefix, RouteSpecifier: &udpv3.UdpProxyConfig_Matcher{Matcher: matcher}})
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
