package xds

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"

	xdscore "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	netinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/model"
)

// routing holds what every pod's listeners share and what the shared route tables hold, assembled
// from every service's entry in model order (a later service wins a VIP and port clash).
type routing struct {
	// captureMatcher is nil when no service has a VIP.
	captureMatcher *xdsmatcher.Matcher
	// captureChains are the capture listener's filter chains: the HTTP chain, the headless HTTP
	// chain when headlessRoute is set, then the floor chains; nil with captureMatcher.
	captureChains []*listenerv3.FilterChain
	// captureRoute (CaptureRouteName) holds the VIP routes.
	captureRoute *routev3.RouteConfiguration
	// headlessRoute (CaptureHeadlessRouteName) holds the headless Services' routes
	// "<pod_ip>:<port>"; nil when no headless HTTP port has an endpoint in this cluster.
	headlessRoute *routev3.RouteConfiguration
	laneRoute     *routev3.RouteConfiguration
	// headlessFilter is the ECDS resource HeadlessFilterName; it sets nothing when
	// directInMatcher (more than maxHeadlessMap entries: they are in the matcher instead).
	headlessFilter  *core.TypedExtensionConfig
	directInMatcher bool
	// l4 is the model's L4 routing (TCPRoutes, TLSRoutes) the matcher and chains were built
	// from (l4Overlay); captureTLS is the capture listeners' tls_inspector for the ports with
	// TLSRoutes (tlsInspector), nil when there are none.
	l4         *model.L4Routing
	captureTLS *listenerv3.ListenerFilter
	// gamma is the model's GAMMA routing these tables were built from; lists the route list
	// of each of its frontends that has one for callers on this node.
	gamma *model.Routing
	lists map[model.Frontend]frontendList
	// consumerNS are the namespaces whose GAMMA consumer routes captureRoute holds: those with
	// pods on this node (consumerNamespaces), sorted.
	consumerNS []string
	// localImported are the services that are local and imported (localImported) these route
	// lists were built for.
	localImported []model.ServiceKey
	// mirrors are the clusters captureRoute's GAMMA routes mirror to and for which callers,
	// sorted: each gets a mirror cluster per local identity of those callers (mirrorClusterName).
	mirrors []mirrorTarget
	// warnings say what the route table serves differently from the model (newFrontendList).
	warnings []string
	// valid is set once a build that used this routing passed ValidateAll. The other flags say
	// that a part is the value of an earlier routing that had: sharedValid the matcher, chains
	// and lane route (withDirect), vipRouteValid captureRoute, directValid headlessRoute and
	// headlessFilter.
	valid, sharedValid, vipRouteValid, directValid bool
}

// reuse says which parts of the previous routing assembleRouting may keep: the capture route
// when no service's VIP routes changed (sameVIPRoutes), the headless route table and the
// headless filter when no service's direct entries or headless routes changed (sameDirect).
type reuse struct {
	old                       *routing
	sameVIPRoutes, sameDirect bool
}

// assembleRouting builds the capture filter-chain matcher (a hash map on destination port, then
// destination IP, built once and shared by every pod's capture listener), the capture filter
// chains (shared too: the pod's identity is set by a listener filter) and the shared route
// tables from the services' entries, keeping the parts of keep.old that keep says are unchanged
// (the same values: not sent again, not validated again); the chains' connection managers are
// captureHCM and headlessHCM (sharedConfigs). Port first: services share few ports, so the
// matcher holds one nested IP map per distinct port rather than one nested port map per VIP,
// which makes every pod's capture listener, parsed and built by Envoy per pod, smaller.
//
// Headless Services' endpoints are not in the matcher: on a target port a headless Service's
// endpoints serve, a destination IP that is no VIP falls to a nested matcher on the filter state
// DirectFilterStateKey, mapping the names of that port's headless chains to the chains, and
// anything else to the default chain (passthrough). The filter state is set by the ECDS listener
// filter HeadlessFilterName (headlessFilter), which every capture listener runs and which holds
// the "<pod_ip>:<port>" -> chain map (read only for the headless target ports). An HTTP port's
// endpoints take the chain captureHeadlessChain, whose route table CaptureHeadlessRouteName holds
// only their routes. So an endpoint change of a headless Service changes that one ECDS resource
// (and for HTTP ports the headless route table), not every pod's capture listener, nor the VIP
// route table, which Envoy would otherwise rebuild on every such change (docs/node-proxy.md,
// "Headless Services").
func assembleRouting(b *builder, entries []*svcEntry, keep reuse) (*routing, error) {
	captureHCM, headlessHCM := b.captureHCM, b.headlessHCM
	rt := &routing{gamma: b.m.Routing, l4: b.m.L4Routing}
	var floors []floorChain
	byPort := map[string]map[string]*xdsmatcher.Matcher_OnMatch{}
	lane := &routev3.RouteConfiguration{Name: LaneRouteName}
	for _, e := range entries {
		floors = append(floors, e.floors...)
		for _, c := range e.chains {
			if byPort[c.port] == nil {
				byPort[c.port] = map[string]*xdsmatcher.Matcher_OnMatch{}
			}
			byPort[c.port][c.vip] = c.action
		}
		lane.VirtualHosts = append(lane.VirtualHosts, e.lane...)
	}
	rt.laneRoute = lane
	// TCPRoutes and TLSRoutes: their frontends' VIPs select the routes' chains.
	l4, tlsPorts, err := l4Overlay(b.m, byPort)
	if err != nil {
		return nil, err
	}
	floors = append(floors, l4...)
	if rt.captureTLS, err = tlsInspector(tlsPorts); err != nil {
		return nil, err
	}
	if o := keep.old; o != nil && keep.sameVIPRoutes {
		rt.captureRoute, rt.vipRouteValid = o.captureRoute, o.valid || o.vipRouteValid
		rt.consumerNS, rt.localImported, rt.mirrors, rt.lists, rt.warnings = o.consumerNS, o.localImported, o.mirrors, o.lists, o.warnings
	} else {
		rt.gammaRoutes(b.m, entries, nil, nil)
	}
	var direct map[netip.AddrPort]string
	var directChains map[uint16]map[string]bool
	if o := keep.old; o != nil && keep.sameDirect {
		rt.headlessRoute, rt.headlessFilter, rt.directInMatcher = o.headlessRoute, o.headlessFilter, o.directInMatcher
		rt.directValid = o.valid || o.directValid
		direct, directChains = directMaps(entries)
	} else {
		direct, directChains = rt.assembleDirect(entries)
	}
	if rt.directInMatcher {
		// Too many for the ECDS filter's map: the endpoints' addresses are matcher entries, as
		// VIPs are. A VIP keeps its entry, as it does below the limit (the VIPs are matched
		// before the filter state).
		for dst, chain := range direct {
			port, ip := strconv.FormatUint(uint64(dst.Port()), 10), dst.Addr().String()
			if byPort[port] == nil {
				byPort[port] = map[string]*xdsmatcher.Matcher_OnMatch{}
			}
			if byPort[port][ip] == nil {
				byPort[port][ip] = chainAction(chain)
			}
		}
		directChains = nil
	}
	if len(byPort) == 0 && len(directChains) == 0 {
		return rt, nil
	}
	portInput, _ := anypb.New(&netinputsv3.DestinationPortInput{})
	ipInput, _ := anypb.New(&netinputsv3.DestinationIPInput{})
	portMap := make(map[string]*xdsmatcher.Matcher_OnMatch, len(byPort)+len(directChains))
	for port, vips := range byPort {
		portMap[port] = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: &xdsmatcher.Matcher{
			MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
				Input:    &xdscore.TypedExtensionConfig{Name: "ip", TypedConfig: ipInput},
				TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: vips}},
			}},
		}}}
	}
	for port, chains := range directChains {
		key := strconv.FormatUint(uint64(port), 10)
		m := directMatcher(chains)
		if ip := portMap[key]; ip != nil {
			ip.GetMatcher().OnNoMatch = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: m}}
		} else {
			portMap[key] = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: m}}
		}
	}
	rt.captureMatcher = &xdsmatcher.Matcher{MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
		Input:    &xdscore.TypedExtensionConfig{Name: "port", TypedConfig: portInput},
		TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: portMap}},
	}}}
	rt.captureChains = make([]*listenerv3.FilterChain, 0, 2+len(floors))
	rt.captureChains = append(rt.captureChains, &listenerv3.FilterChain{Name: captureHTTPChain, Filters: []*listenerv3.Filter{captureHCM}})
	if rt.headlessRoute != nil {
		// Only while a headless HTTP port has endpoints: the chain comes and goes with that
		// port's entry in the matcher (directChainSet), so it adds no listener update of its own.
		rt.captureChains = append(rt.captureChains, &listenerv3.FilterChain{Name: captureHeadlessChain, Filters: []*listenerv3.Filter{headlessHCM}})
	}
	for _, fc := range floors {
		rt.captureChains = append(rt.captureChains, &listenerv3.FilterChain{Name: fc.name, Filters: []*listenerv3.Filter{fc.tcp}})
	}
	return rt, nil
}

// gammaRoutes builds the capture route table (CaptureRouteName): the services' VIP routes, and
// for each frontend with GAMMA routes its route list (frontendRouteList) in place of the default
// route. Consumer routes are in that one table, selected by the caller's namespace: a namespace's
// consumer routes coming or going change this table only, never a pod's filter chains (which
// Envoy would drain, closing every captured connection of the namespace's pods).
//
// The route lists of the frontends in keep are those of old (the same routes, for the same
// services and consumer namespaces: gammaDiff), not built again.
func (rt *routing) gammaRoutes(m *model.Mesh, entries []*svcEntry, old *routing, keep map[model.Frontend]bool) {
	table := map[string]*xdsmatcher.Matcher_OnMatch{}
	owner := map[string]model.ServiceKey{} // the service each VIP:port's default route is
	for _, e := range entries {
		for _, r := range e.routes {
			table[r.dst], owner[r.dst] = r.action, e.svc.Key
		}
	}
	rt.consumerNS, rt.localImported, rt.mirrors, rt.lists, rt.warnings = consumerNamespaces(m), localImported(m), nil, nil, nil
	if gm := m.Routing; gm != nil {
		rt.lists = make(map[model.Frontend]frontendList, len(gm.Ports))
		mirrors := map[mirrorTarget]bool{}
		// In a fixed order, so that the table and its warnings are the same for the same model.
		for _, fe := range slices.SortedFunc(maps.Keys(gm.Ports), model.Frontend.Compare) {
			pr := gm.Ports[fe]
			s := m.Service(fe.Service)
			if s == nil {
				continue
			}
			var fl frontendList
			ok := false
			if old != nil && keep[fe] {
				fl, ok = old.lists[fe]
			}
			if !ok {
				fl = newFrontendList(m, fe, pr, rt.consumerNS)
			}
			for _, mt := range fl.mirrors {
				mirrors[mt] = true
			}
			if fl.refused != "" {
				rt.warnings = append(rt.warnings, fmt.Sprintf("GAMMA routes of %s: %s; its requests are answered 500 until the routes change", fe, fl.refused))
			}
			if fl.act == nil {
				continue
			}
			rt.lists[fe] = fl
			vips := s.VIPs
			if fe.Import {
				vips = s.ClustersetVIPs
			}
			for _, vip := range vips {
				// A route list replaces its own service's default route only: a VIP another
				// service holds (a clash, which the later service wins) is not the route's.
				if dst := netip.AddrPortFrom(vip, uint16(fe.Port)).String(); owner[dst] == fe.Service {
					table[dst] = fl.act
				}
			}
		}
		rt.mirrors = slices.SortedFunc(maps.Keys(mirrors), compareMirrorTargets)
	}
	rt.captureRoute = captureRoute(CaptureRouteName, table)
}

// localImported are the services that are local and imported, sorted: their Service backends use
// their local clusters (hasLocalCluster), so a change of this set changes route lists.
func localImported(m *model.Mesh) []model.ServiceKey {
	var out []model.ServiceKey
	for _, s := range m.Services {
		if s.Local && s.Imported {
			out = append(out, s.Key)
		}
	}
	slices.SortFunc(out, model.ServiceKey.Compare)
	return out
}

// frontendList is one frontend's route list as the capture route table's matcher action (nil
// when it has none for callers on this node), with the clusters its routes mirror to and, when
// Envoy's validation refused the list, why (the action then answers 500).
type frontendList struct {
	act     *xdsmatcher.Matcher_OnMatch
	mirrors []mirrorTarget
	refused string
}

// mirrorTarget is a cluster GAMMA routes mirror to, for the callers of namespace ns ("" for
// every caller: a producer route's).
type mirrorTarget struct {
	cluster, ns string
}

func compareMirrorTargets(a, b mirrorTarget) int {
	return cmp.Or(cmp.Compare(a.cluster, b.cluster), cmp.Compare(a.ns, b.ns))
}

// newFrontendList builds the frontendList of frontend fe with routes pr for the consumer
// namespaces nss (frontendRouteList). A list that fails Envoy's validation (the PGV rules, which
// ValidateAll does not reach inside the table's typed actions) is replaced by one that answers
// 500, so one bad route never makes Envoy refuse the node's whole route table.
func newFrontendList(m *model.Mesh, fe model.Frontend, pr *model.PortRoutes, nss []string) frontendList {
	var fl frontendList
	set := map[mirrorTarget]bool{}
	addMirrors(m, set, "", pr.Producer)
	for _, ns := range nss {
		addMirrors(m, set, ns, pr.Consumers[ns])
	}
	fl.mirrors = slices.SortedFunc(maps.Keys(set), compareMirrorTargets)
	rl := frontendRouteList(m, fe, pr, nss)
	if rl == nil {
		return fl
	}
	if err := rl.ValidateAll(); err != nil {
		fl.refused, fl.mirrors = err.Error(), nil
		rl = &routev3.RouteList{Routes: []*routev3.Route{{
			Name:   "refused",
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 500}},
		}}}
	}
	a, _ := anypb.New(rl)
	fl.act = routeAction(a)
	return fl
}

// gammaDiff compares the GAMMA routing old was built from with m's (by value: models are
// rebuilt from scratch): same when the consumer namespaces on this node, the services whose
// Service backends have local clusters and every frontend's routes are equal; keep, the
// frontends whose routes are equal, when the rest is (their route lists can be reused).
func gammaDiff(old *routing, m *model.Mesh) (same bool, keep map[model.Frontend]bool) {
	if old == nil || !slices.Equal(old.consumerNS, consumerNamespaces(m)) || !slices.Equal(old.localImported, localImported(m)) {
		return false, nil
	}
	if old.gamma == m.Routing {
		return true, nil
	}
	var was, is map[model.Frontend]*model.PortRoutes
	if old.gamma != nil {
		was = old.gamma.Ports
	}
	if m.Routing != nil {
		is = m.Routing.Ports
	}
	keep = make(map[model.Frontend]bool, len(is))
	for fe, pr := range is {
		if o, ok := was[fe]; ok && reflect.DeepEqual(o, pr) {
			keep[fe] = true
		}
	}
	return len(keep) == len(is) && len(is) == len(was), keep
}

// addMirrors adds to set the backend clusters the RequestMirror filters of entries send to, for
// the callers of namespace ns; a rule answered with an error or a mirror of no requests sends
// none.
func addMirrors(m *model.Mesh, set map[mirrorTarget]bool, ns string, entries []model.RouteEntry) {
	for _, e := range entries {
		if _, asError := e.Rule.Served(); asError {
			continue
		}
		for _, f := range e.Rule.Filters {
			if mi := f.Mirror; mi != nil && mi.Backend.Invalid == nil && mi.Numerator > 0 {
				set[mirrorTarget{cluster: backendCluster(m, mi.Backend), ns: ns}] = true
			}
		}
	}
}

// frontendRouteList is the Envoy route list of frontend fe with routes pr, nil when it has none
// for callers on this node: first, for each namespace of nss (sorted) that has consumer routes
// for fe, those routes (gammaRouteList) restricted to callers in that namespace
// (callerNamespaceMatch), then a 404 for its callers that match none of them (consumer routes
// replace the producer routes for that namespace, GEP-1294); then the producer routes for every
// other caller, or, when there are none, the frontend's default route (routeTo its cluster).
// Envoy takes the first route that matches.
func frontendRouteList(m *model.Mesh, fe model.Frontend, pr *model.PortRoutes, nss []string) *routev3.RouteList {
	var rl *routev3.RouteList
	for _, ns := range nss {
		es, ok := pr.Consumers[ns]
		if !ok {
			continue
		}
		caller := callerNamespaceMatch(m.TrustDomain, ns)
		if rl == nil {
			rl = &routev3.RouteList{}
		}
		for _, r := range gammaRouteList(m, fe.Port, es).Routes {
			r.Match.FilterState = append(r.Match.FilterState, caller)
			rl.Routes = append(rl.Routes, r)
		}
		rl.Routes = append(rl.Routes, &routev3.Route{
			Name:   "consumer " + ns + ": no match",
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, FilterState: []*matcherv3.FilterStateMatcher{caller}},
			Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 404}},
		})
	}
	switch {
	case len(pr.Producer) > 0:
		if rl == nil {
			return gammaRouteList(m, fe.Port, pr.Producer)
		}
		rl.Routes = append(rl.Routes, gammaRouteList(m, fe.Port, pr.Producer).Routes...)
	case rl != nil:
		rl.Routes = append(rl.Routes, routeTo(ClusterName(m, fe.Service, fe.Port)))
	}
	return rl
}

// callerNamespaceMatch matches requests from pods of namespace ns: the filter state
// CertMapperFilterStateKey, which every capture listener sets to its pod's SPIFFE ID, starts
// with "spiffe://<trustDomain>/ns/<ns>/sa/".
func callerNamespaceMatch(trustDomain, ns string) *matcherv3.FilterStateMatcher {
	prefix := strings.TrimSuffix(model.SPIFFEID(trustDomain, ns, "-"), "-")
	return &matcherv3.FilterStateMatcher{Key: CertMapperFilterStateKey, Matcher: &matcherv3.FilterStateMatcher_StringMatch{
		StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix}}}}
}

// consumerNamespaces are the namespaces with GAMMA consumer routes that have pods on this node.
func consumerNamespaces(m *model.Mesh) []string {
	if m.Routing == nil {
		return nil
	}
	var out []string
	for _, ns := range m.Routing.ConsumerNamespaces {
		if slices.ContainsFunc(m.Pods, func(p *model.LocalPod) bool { return p.Namespace == ns }) {
			out = append(out, ns)
		}
	}
	return out
}

// withGamma is rt with the capture route table rebuilt for the model's GAMMA routing, for a
// build in which nothing else of the routing changed: the route lists of the frontends in keep
// (gammaDiff) are rt's.
func (rt *routing) withGamma(b *builder, entries []*svcEntry, keep map[model.Frontend]bool) *routing {
	n := &routing{captureMatcher: rt.captureMatcher, captureChains: rt.captureChains, laneRoute: rt.laneRoute, l4: rt.l4, captureTLS: rt.captureTLS,
		headlessRoute: rt.headlessRoute, headlessFilter: rt.headlessFilter, directInMatcher: rt.directInMatcher,
		sharedValid: rt.valid || rt.sharedValid, directValid: rt.valid || rt.directValid, gamma: b.m.Routing}
	n.gammaRoutes(b.m, entries, rt, keep)
	return n
}

// routeMap is the capture route table's matcher map of the routes pick gives for each entry
// (a later service wins a clash).
func routeMap(entries []*svcEntry, pick func(*svcEntry) []vipRoute) map[string]*xdsmatcher.Matcher_OnMatch {
	routes := map[string]*xdsmatcher.Matcher_OnMatch{}
	for _, e := range entries {
		for _, r := range pick(e) {
			routes[r.dst] = r.action
		}
	}
	return routes
}

// chainAction is the filter-chain matcher action selecting the chain named name.
func chainAction(name string) *xdsmatcher.Matcher_OnMatch {
	a, _ := anypb.New(wrapperspb.String(name))
	return &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{
		Action: &xdscore.TypedExtensionConfig{Name: name, TypedConfig: a}}}
}

// captureRoute is a route configuration of every pod's capture HTTP chains, named name
// (CaptureRouteName for the VIPs, CaptureHeadlessRouteName for headless Services' pods): one
// virtual host whose matcher maps the original destination "ip:port" (the DstHeader the capture
// HTTP connection manager writes before routing, from %DOWNSTREAM_LOCAL_ADDRESS%) to the
// service port's cluster, whatever Host the client used; without routes, a 404 for every request.
// The lookup is a hash map, so the route table's cost per request does not grow with the number
// of services. The header is removed before the request leaves.
func captureRoute(name string, m map[string]*xdsmatcher.Matcher_OnMatch) *routev3.RouteConfiguration {
	vh := &routev3.VirtualHost{Name: name, Domains: []string{"*"}}
	if len(m) > 0 {
		input, _ := anypb.New(&matcherv3.HttpRequestHeaderMatchInput{HeaderName: DstHeader})
		vh.Matcher = &xdsmatcher.Matcher{MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
			Input:    &xdscore.TypedExtensionConfig{Name: "original-destination", TypedConfig: input},
			TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: m}},
		}}}
	} else {
		vh.Routes = []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 404}},
		}}
	}
	return &routev3.RouteConfiguration{
		Name:                   name,
		VirtualHosts:           []*routev3.VirtualHost{vh},
		RequestHeadersToRemove: []string{DstHeader},
	}
}

// laneVirtualHosts are one service's (of m) virtual hosts in the explicit HTTP lane's route
// configuration (LaneRouteName): one per HTTP port, answering the service's mesh names
// (<svc>.<ns>.<meshDomain>, the short <svc>.<meshDomain> when the service owns it, given as
// short, <svc>.<ns>.svc.clusterset.local when imported), each also with ":<port>"; a name without
// a port goes to the service's first HTTP port.
func laneVirtualHosts(m *model.Mesh, s *model.Service, short string) []*routev3.VirtualHost {
	if !hasClusters(s) {
		return nil // no cluster to route to (hasClusters)
	}
	var vhs []*routev3.VirtualHost
	names := []string{m.FQDN(s.Key)}
	if short != "" {
		names = append(names, short)
	}
	if s.Imported {
		names = append(names, model.ClustersetName(s.Key))
	}
	first := true
	for _, sp := range s.Ports {
		if !sp.Protocol.IsHTTP() {
			continue
		}
		var domains []string
		for _, n := range names {
			if first {
				domains = append(domains, n)
			}
			domains = append(domains, n+":"+strconv.FormatUint(uint64(sp.Port), 10))
		}
		first = false
		cn := ClusterName(m, s.Key, sp.Port)
		vhs = append(vhs, &routev3.VirtualHost{Name: cn, Domains: domains, Routes: []*routev3.Route{routeTo(cn)}})
	}
	return vhs
}

// routeTo is the route of every path prefix to the cluster named cluster, without a
// per-request timeout.
func routeTo(cluster string) *routev3.Route {
	return &routev3.Route{
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			// No per-request timeout: streams and long polls are the application's business.
			Timeout: durationpb.New(0),
		}},
	}
}

// routeAction is the capture route tables' matcher action that takes the route route (routeTo,
// marshalled).
func routeAction(route *anypb.Any) *xdsmatcher.Matcher_OnMatch {
	return &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{
		Action: &xdscore.TypedExtensionConfig{Name: "route", TypedConfig: route}}}
}
