package xds

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	xdscore "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	sfsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/set_filter_state/v3"
	sfslistenerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/set_filter_state/v3"
	celv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/formatter/cel/v3"
	netinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// directEntry is one headless endpoint's address and target port, "<pod_ip>:<port>", and the
// capture chain a connection to it takes (directEntries).
type directEntry struct {
	dst   netip.AddrPort
	chain string
}

// directEntries adds what one port of a headless service contributes for connections made
// straight to its pods (clients resolve a headless Service to pod IPs and dial one): for each
// target port its endpoints in this cluster serve, an ORIGINAL_DST cluster (directCluster), and
// for each of those endpoints' address (model.MeshAddr: the one its inbound listener binds) a
// directEntry "<pod_ip>:<port>" -> chain (an entry of the ECDS filter HeadlessFilterName, not of
// the capture filter-chain matcher: see assembleRouting; for HTTP the chain captureHeadlessChain)
// and for HTTP the route "<pod_ip>:<port>" of CaptureHeadlessRouteName, which send the connection
// to it. So a connection to a meshed pod's IP and target port goes over mTLS to that same pod's
// :15008 with SNI "<port>"; a pod that is not an endpoint (not meshed) is still passed through. Other clusters' endpoints
// are left out: their pod IPs are not this cluster's (and may be equal to local ones).
func (b *builder) directEntries(e *svcEntry, sp model.ServicePort) error {
	s := e.svc
	ips := map[uint32][]netip.Addr{}
	for i := range e.eps {
		ep := &e.eps[i]
		if ep.Cluster != b.m.Cluster {
			continue
		}
		// The address the pod's inbound listener binds (and EDS dials); a dual-stack pod's other
		// address is passed through as before.
		ip, hasIP := model.MeshAddr(ep.IPs)
		if p, ok := sp.EndpointPort(ep, b.m.Cluster); ok && hasIP {
			ips[p.Port] = append(ips[p.Port], ip)
		}
	}
	for _, target := range slices.Sorted(maps.Keys(ips)) {
		cn := DirectClusterName(b.m, s.Key, sp.Port, target)
		c, err := b.directCluster(s, sp, target, e.peers)
		if err != nil {
			return err
		}
		e.clusters = append(e.clusters, c)
		chain := captureHeadlessChain
		if !sp.Protocol.IsHTTP() {
			fc, err := newFloorChain(cn)
			if err != nil {
				return err
			}
			e.floors, chain = append(e.floors, fc), fc.name
		}
		route, err := xdsproto.ToAny(routeTo(cn))
		if err != nil {
			return err
		}
		for _, ip := range ips[target] {
			e.direct = append(e.direct, directEntry{dst: netip.AddrPortFrom(ip, uint16(target)), chain: chain})
			if sp.Protocol.IsHTTP() {
				e.directRoutes = append(e.directRoutes, vipRoute{dst: netip.AddrPortFrom(ip, uint16(target)).String(), action: routeAction(route)})
			}
		}
	}
	return nil
}

// directMaps returns the entries' direct entries as one map (a later service wins a clash) and,
// per headless target port, the chains its entries use (the matcher's part for them,
// directMatcher).
func directMaps(entries []*svcEntry) (map[netip.AddrPort]string, map[uint16]map[string]bool) {
	direct := map[netip.AddrPort]string{}
	directChains := map[uint16]map[string]bool{}
	for _, e := range entries {
		for _, d := range e.direct {
			direct[d.dst] = d.chain
			port := d.dst.Port()
			if directChains[port] == nil {
				directChains[port] = map[string]bool{}
			}
			directChains[port][d.chain] = true
		}
	}
	return direct, directChains
}

// assembleDirect sets rt's headless route table and headless filter from the entries' headless
// routes and direct entries, and returns directMaps(entries). The route table is nil without
// headless routes, that is unless some direct entry takes the chain captureHeadlessChain
// (directEntries gives each such entry its route). When the direct entries are too many for the
// filter (directInMatcher), the filter is empty and the caller puts the returned map into the
// matcher.
func (rt *routing) assembleDirect(entries []*svcEntry) (map[netip.AddrPort]string, map[uint16]map[string]bool) {
	direct, directChains := directMaps(entries)
	rt.headlessRoute = nil
	if routes := routeMap(entries, func(e *svcEntry) []vipRoute { return e.directRoutes }); len(routes) > 0 {
		rt.headlessRoute = captureRoute(CaptureHeadlessRouteName, routes)
	}
	rt.directInMatcher = len(direct) > maxHeadlessMap || headlessExprLen(direct) > maxHeadlessExpr
	if rt.directInMatcher {
		rt.headlessFilter = headlessFilter(nil)
	} else {
		rt.headlessFilter = headlessFilter(direct)
	}
	return direct, directChains
}

// withDirect is rt with the headless route table and the headless filter assembled again from
// entries, for a build in which headless Services' endpoint addresses changed and nothing else of
// the routing (sharedRoutingEqual): the matcher, the chains, the capture route and the lane
// route are rt's values, known valid when rt's were, so the pods' capture listeners and the VIP
// route table stay the same values too (nothing of them is sent). The headless route table is
// present in both or in neither (sharedRoutingEqual compares the chains of the target ports). It
// returns nil when the addresses are or become matcher entries (directInMatcher): the matcher
// changes, and the caller assembles the routing whole.
func (rt *routing) withDirect(entries []*svcEntry) *routing {
	if rt.directInMatcher {
		return nil
	}
	n := &routing{captureMatcher: rt.captureMatcher, captureChains: rt.captureChains, captureRoute: rt.captureRoute, laneRoute: rt.laneRoute,
		l4: rt.l4, captureTLS: rt.captureTLS,
		sharedValid: rt.valid || rt.sharedValid, vipRouteValid: rt.valid || rt.vipRouteValid,
		gamma: rt.gamma, consumerNS: rt.consumerNS, localImported: rt.localImported, mirrors: rt.mirrors, lists: rt.lists, warnings: rt.warnings}
	if n.assembleDirect(entries); n.directInMatcher {
		return nil
	}
	return n
}

// maxHeadlessMap is the most entries headlessFilter's CEL map holds. Envoy 1.40 parses the
// expression once per capture listener on every ECDS update and evaluates the map literal per
// connection on the headless target ports, both in time growing with its size
// (docs/node-proxy.md, "Headless Services", has the measurements). Above it, the endpoints'
// addresses are entries of the capture matcher, as before the ECDS filter (every endpoint change
// then updates every pod's capture listener, in place).
const maxHeadlessMap = 1000

// maxHeadlessExpr is the longest headlessFilter expression, in bytes, below the CEL parser's
// default limit of 100,000 code points (cel-cpp parser/options.h, expression_size_codepoint_limit;
// Envoy's CEL formatter parses with the default options): each entry repeats its chain's name,
// which holds the Service's mesh name, so 1000 entries of long Service and namespace names need
// about 180,000 bytes, and Envoy would reject the filter for the whole node. Above it, as above
// maxHeadlessMap, the addresses are matcher entries.
const maxHeadlessExpr = 90_000

// headlessExprLen is an upper bound of the length of headlessExpr(direct)'s maps, without the
// port conditions: each entry's quoted key and value and separators, escaped (celQuote).
func headlessExprLen(direct map[netip.AddrPort]string) int {
	n := 0
	for dst, chain := range direct {
		n += 2*len(dst.String()) + 2*len(chain) + 8
	}
	return n
}

// directMatcher is the capture matcher's part for one target port of headless Services, below the
// VIPs: the filter state DirectFilterStateKey (set by HeadlessFilterName) names the chain, one of
// chains; no match (not a headless endpoint) leaves the default chain.
func directMatcher(chains map[string]bool) *xdsmatcher.Matcher {
	fs, _ := anypb.New(&netinputsv3.FilterStateInput{Key: DirectFilterStateKey})
	m := make(map[string]*xdsmatcher.Matcher_OnMatch, len(chains))
	for c := range chains {
		m[c] = chainAction(c)
	}
	return &xdsmatcher.Matcher{MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
		Input:    &xdscore.TypedExtensionConfig{Name: "direct", TypedConfig: fs},
		TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: m}},
	}}}
}

// headlessFilter is the ECDS resource HeadlessFilterName: a set_filter_state listener filter
// that sets DirectFilterStateKey (envoy.string) to the chain of the restored destination
// "<ip>:<port>" (CEL's destination.address: IPv6 in brackets, as netip.AddrPort writes it),
// looked up in a CEL map literal of the headless endpoints on the destination's port (one map
// per target port, each behind a test of destination.port; CEL evaluates only the chosen branch
// of a conditional, so a connection builds only its own port's map, and one to another port
// costs a comparison per headless target port; sorted, so equal maps give equal resources). A
// destination not in the map fails the lookup, which with omit_empty_values is empty, and
// skip_if_empty sets nothing: the capture matcher then picks no headless chain. Without entries
// the filter sets nothing (no on_accept value), so a node without headless endpoints evaluates
// no CEL per connection; the listeners' reference to the filter stays (headlessRef).
// TestPrivilegedEnvoyFactCELFilterStateMatch checks both forms with Envoy 1.40.
func headlessFilter(direct map[netip.AddrPort]string) *core.TypedExtensionConfig {
	if len(direct) == 0 {
		cfg, _ := anypb.New(&sfslistenerv3.Config{})
		return &core.TypedExtensionConfig{Name: HeadlessFilterName, TypedConfig: cfg}
	}
	cel, _ := anypb.New(&celv3.Cel{})
	cfg, _ := anypb.New(&sfslistenerv3.Config{OnAccept: []*sfsv3.FilterStateValue{{
		Key:         &sfsv3.FilterStateValue_ObjectKey{ObjectKey: DirectFilterStateKey},
		FactoryKey:  "envoy.string",
		SkipIfEmpty: true,
		Value: &sfsv3.FilterStateValue_FormatString{FormatString: &core.SubstitutionFormatString{
			Format:     &core.SubstitutionFormatString_TextFormatSource{TextFormatSource: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: headlessExpr(direct)}}},
			Formatters: []*core.TypedExtensionConfig{{Name: "envoy.formatter.cel", TypedConfig: cel}},
			// A failed lookup is an evaluation error, which the formatter writes as "-" unless
			// empty values are omitted; omitted, it is empty, and skip_if_empty sets nothing.
			OmitEmptyValues: true,
		}},
	}}})
	return &core.TypedExtensionConfig{Name: HeadlessFilterName, TypedConfig: cfg}
}

// headlessExpr is headlessFilter's format string for a non-empty direct (address and port to
// chain): "%CEL(destination.port == P1 ? {'<ip>:<P1>': '<chain>', ...}[destination.address] :
// destination.port == P2 ? ... : <the empty string>)%", one map per port, ports ascending,
// entries in address order, strings escaped (celQuote).
func headlessExpr(direct map[netip.AddrPort]string) string {
	byPort := map[uint16][]netip.AddrPort{}
	for dst := range direct {
		byPort[dst.Port()] = append(byPort[dst.Port()], dst)
	}
	var expr strings.Builder
	expr.WriteString("%CEL(")
	for _, port := range slices.Sorted(maps.Keys(byPort)) {
		dsts := byPort[port]
		slices.SortFunc(dsts, netip.AddrPort.Compare)
		fmt.Fprintf(&expr, "destination.port == %d ? {", port)
		for i, dst := range dsts {
			if i > 0 {
				expr.WriteString(", ")
			}
			fmt.Fprintf(&expr, "'%s': '%s'", celQuote.Replace(dst.String()), celQuote.Replace(direct[dst]))
		}
		expr.WriteString("}[destination.address] : ")
	}
	expr.WriteString("'')%")
	return expr.String()
}

// celQuote escapes a string for a single-quoted CEL string literal (CEL language definition,
// "String and Bytes Values"): a backslash and a quote are escaped. Addresses and chain names
// (DNS names, checked where they enter the model) hold neither; this keeps a name that slipped
// through from ending the literal, which would change the expression or make Envoy reject the
// filter on every capture listener.
var celQuote = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

// headlessRef is the capture listeners' ECDS reference (ListenerFilter.config_discovery over
// ADS) to HeadlessFilterName. It is the same in every build: a listener whose listener filters
// change is replaced and its connections drained, while one whose filter chains or matcher
// alone change is updated in place (ListenerMessageUtil::filterChainOnlyChange).
func headlessRef() *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{
		Name: HeadlessFilterName,
		ConfigType: &listenerv3.ListenerFilter_ConfigDiscovery{ConfigDiscovery: &core.ExtensionConfigSource{
			ConfigSource: xdsproto.ADS(),
			TypeUrls:     []string{"type.googleapis.com/envoy.extensions.filters.listener.set_filter_state.v3.Config"},
		}},
	}
}
