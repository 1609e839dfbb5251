package xds

import (
	"cmp"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	xdscore "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	netinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// TLSInspectTimeout is how long a capture listener that inspects TLS (some TLSRoute is bound in
// the mesh) waits for a connection's first bytes on a port where a TLSRoute is bound, before it
// goes on without them (Listener.listener_filters_timeout, continue_on_listener_filters_timeout):
// a TLS client sends its ClientHello at once, so the wait only delays a server-first protocol
// (one whose client waits for the server to speak) on a destination with the same port number,
// by this much once per connection; a TLS client that waited longer is routed as if it sent no
// SNI (the Service's own floor chain).
const TLSInspectTimeout = time.Second

// l4ChainName is the capture filter chain of an L4 route: "tcproute|<ns>/<name>" or
// "tlsroute|<ns>/<name>". A route has the same backends on every frontend it binds, so one
// chain serves them all.
func l4ChainName(r model.RouteRef) string {
	return strings.ToLower(string(r.Kind)) + "|" + r.Namespace + "/" + r.Name
}

// l4Overlay applies the model's L4 routing to the capture matcher's entries byPort (port, then
// VIP, to the chain action; changed in place) and returns the routes' chains, sorted by name,
// and the ports on which a TLSRoute is bound, sorted. A frontend's VIP whose entry is its own
// Service port's floor chain (a VIP another service holds on that port, a clash the later
// service wins, is not the route's) selects instead:
//   - for a TCPRoute, the route's chain (l4Chain);
//   - for TLSRoutes, a nested matcher (sniAction): TLS connections by SNI to the routes'
//     chains, anything else to the floor chain.
func l4Overlay(m *model.Mesh, byPort map[string]map[string]*xdsmatcher.Matcher_OnMatch) ([]floorChain, []uint32, error) {
	if m.L4Routing == nil || len(m.L4Routing.Ports) == 0 {
		return nil, nil, nil
	}
	chains := map[string]floorChain{}
	tls := map[uint32]bool{}
	for _, fe := range slices.SortedFunc(maps.Keys(m.L4Routing.Ports), model.Frontend.Compare) {
		routes := m.L4Routing.Ports[fe].Routes
		s := m.Service(fe.Service)
		if s == nil || len(routes) == 0 {
			continue
		}
		for _, r := range routes {
			name := l4ChainName(r.Route)
			if _, ok := chains[name]; ok {
				continue
			}
			f, err := l4TCPProxy(m, r.Backends)
			if err != nil {
				return nil, nil, err
			}
			chains[name] = floorChain{name: name, tcp: f}
		}
		port := strconv.FormatUint(uint64(fe.Port), 10)
		floor := floorChainName(ClusterName(m, fe.Service, fe.Port))
		vips := s.VIPs
		if fe.Import {
			vips = s.ClustersetVIPs
		}
		for _, vip := range vips {
			cur := byPort[port][vip.String()]
			if cur.GetAction().GetName() != floor {
				continue
			}
			if routes[0].Route.Kind == model.KindTCPRoute {
				byPort[port][vip.String()] = chainAction(l4ChainName(routes[0].Route))
				continue
			}
			byPort[port][vip.String()] = sniAction(routes, cur)
			tls[fe.Port] = true
		}
	}
	out := make([]floorChain, 0, len(chains))
	for _, name := range slices.Sorted(maps.Keys(chains)) {
		out = append(out, chains[name])
	}
	return out, slices.Sorted(maps.Keys(tls)), nil
}

// l4TCPProxy is the tcp_proxy of an L4 route's chain: connections spread over the backends'
// clusters by weight (weighted_clusters; the mesh's EDS clusters, mTLS, as for GAMMA backends:
// backendCluster). The share of an invalid backend goes to a cluster that does not exist, and a
// route without a backend with weight to one whole: Envoy closes those connections.
func l4TCPProxy(m *model.Mesh, backends []model.BackendRef) (*listenerv3.Filter, error) {
	var wcs []*tcpv3.TcpProxy_WeightedCluster_ClusterWeight
	for _, b := range backends {
		if b.Weight > 0 {
			wcs = append(wcs, &tcpv3.TcpProxy_WeightedCluster_ClusterWeight{Name: backendCluster(m, b), Weight: uint32(b.Weight)})
		}
	}
	tp := &tcpv3.TcpProxy{StatPrefix: "outbound_tcp"}
	if len(wcs) > 1 {
		tp.ClusterSpecifier = &tcpv3.TcpProxy_WeightedClusters{WeightedClusters: &tcpv3.TcpProxy_WeightedCluster{Clusters: wcs}}
	} else {
		cluster := invalidClusterPrefix + "no-backend"
		if len(wcs) == 1 {
			cluster = wcs[0].Name
		}
		tp.ClusterSpecifier = &tcpv3.TcpProxy_Cluster{Cluster: cluster}
	}
	return xdsproto.NetworkFilter("envoy.filters.network.tcp_proxy", tp)
}

// sniAction is the capture matcher action of a frontend with TLSRoutes routes (in precedence
// order), floor being the frontend's own action (its Service port's floor chain): a connection
// that tls_inspector found to be TLS (TransportProtocolInput "tls") goes by its SNI
// (ServerNameInput) to the chain of the route naming it exactly, else of the route with the
// longest wildcard suffix matching it ("*.example.com" matches one or more labels in front of
// example.com, the Gateway API's wildcard), else of the route without hostnames
// (model.AnySNI), else to floor; a connection that is not TLS goes to floor. The client's TLS is
// not terminated: the chain carries its bytes inside the mesh mTLS connection.
func sniAction(routes []model.L4Route, floor *xdsmatcher.Matcher_OnMatch) *xdsmatcher.Matcher_OnMatch {
	exact := map[string]*xdsmatcher.Matcher_OnMatch{}
	type wildcard struct {
		suffix string
		act    *xdsmatcher.Matcher_OnMatch
	}
	var wild []wildcard
	rest := floor
	for _, r := range routes {
		act := chainAction(l4ChainName(r.Route))
		for _, h := range r.Hostnames {
			switch {
			case h == model.AnySNI:
				rest = act
			case strings.HasPrefix(h, "*."):
				wild = append(wild, wildcard{h[1:], act})
			default:
				exact[h] = act
			}
		}
	}
	sni, _ := anypb.New(&netinputsv3.ServerNameInput{})
	input := &xdscore.TypedExtensionConfig{Name: "sni", TypedConfig: sni}
	byName := rest
	if len(wild) > 0 {
		// The longest suffix first: the most specific wildcard wins.
		slices.SortStableFunc(wild, func(a, b wildcard) int { return cmp.Compare(len(b.suffix), len(a.suffix)) })
		list := &xdsmatcher.Matcher_MatcherList{}
		for _, w := range wild {
			list.Matchers = append(list.Matchers, &xdsmatcher.Matcher_MatcherList_FieldMatcher{
				Predicate: &xdsmatcher.Matcher_MatcherList_Predicate{MatchType: &xdsmatcher.Matcher_MatcherList_Predicate_SinglePredicate_{
					SinglePredicate: &xdsmatcher.Matcher_MatcherList_Predicate_SinglePredicate{
						Input: input,
						Matcher: &xdsmatcher.Matcher_MatcherList_Predicate_SinglePredicate_ValueMatch{ValueMatch: &xdsmatcher.StringMatcher{
							MatchPattern: &xdsmatcher.StringMatcher_Suffix{Suffix: w.suffix}, IgnoreCase: true}},
					}}},
				OnMatch: w.act,
			})
		}
		byName = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: &xdsmatcher.Matcher{
			MatcherType: &xdsmatcher.Matcher_MatcherList_{MatcherList: list}, OnNoMatch: rest}}}
	}
	if len(exact) > 0 {
		byName = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: &xdsmatcher.Matcher{
			MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
				Input:    input,
				TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: exact}},
			}},
			OnNoMatch: byName,
		}}}
	}
	tp, _ := anypb.New(&netinputsv3.TransportProtocolInput{})
	return &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: &xdsmatcher.Matcher{
		MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
			Input:    &xdscore.TypedExtensionConfig{Name: "transport", TypedConfig: tp},
			TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: map[string]*xdsmatcher.Matcher_OnMatch{"tls": byName}}},
		}},
		OnNoMatch: floor,
	}}}
}

// tlsInspector is the capture listeners' tls_inspector listener filter for the ports on which a
// TLSRoute is bound (sorted), disabled on every other destination port (filter_disabled), so
// that only connections to those ports wait for their first bytes (TLSInspectTimeout); nil
// without ports. A change of the ports changes the capture listeners' listener filters, which
// Envoy does not update in place: it replaces every capture listener and drains its
// connections (docs/node-proxy.md), so only the set of TLS-routed port numbers does that, not a
// route change on a port that already has one.
func tlsInspector(ports []uint32) (*listenerv3.ListenerFilter, error) {
	if len(ports) == 0 {
		return nil, nil
	}
	ti, err := xdsproto.TLSInspector()
	if err != nil {
		return nil, err
	}
	// Consecutive ports in one range [start, end).
	var rules []*listenerv3.ListenerFilterChainMatchPredicate
	for i := 0; i < len(ports); {
		j := i + 1
		for j < len(ports) && ports[j] == ports[j-1]+1 {
			j++
		}
		rules = append(rules, &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_DestinationPortRange{
			DestinationPortRange: &typev3.Int32Range{Start: int32(ports[i]), End: int32(ports[j-1]) + 1}}})
		i = j
	}
	on := rules[0]
	if len(rules) > 1 {
		on = &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_OrMatch{
			OrMatch: &listenerv3.ListenerFilterChainMatchPredicate_MatchSet{Rules: rules}}}
	}
	ti.FilterDisabled = &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_NotMatch{NotMatch: on}}
	return ti, nil
}

// l4Same reports whether the L4 routing old was built from (nil: none) is m's, by value (models
// are rebuilt from scratch); no routing and an empty one are the same.
func l4Same(old *routing, m *model.Mesh) bool {
	if old == nil {
		return false
	}
	a, b := old.l4, m.L4Routing
	if a == b || (len(l4Ports(a)) == 0 && len(l4Ports(b)) == 0) {
		return true
	}
	return reflect.DeepEqual(l4Ports(a), l4Ports(b))
}

func l4Ports(r *model.L4Routing) map[model.Frontend]*model.L4Port {
	if r == nil {
		return nil
	}
	return r.Ports
}
