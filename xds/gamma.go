package xds

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/model"
)

// invalidClusterPrefix names the clusters a route sends an invalid backend's share to: no such
// cluster exists, and the route's cluster_not_found_response_code answers 500, as
// HTTPRouteRule.backendRefs asks for requests that would have gone to an invalid backend.
const invalidClusterPrefix = "invalid|"

// gammaRouteList is the Envoy routes of the GAMMA route entries of a frontend on port, in their
// order (the capture route tables' matcher action for the frontend's "VIP:port" keys): Envoy
// takes the first route that matches, and answers 404 when none does, as HTTPRouteRule.matches
// requires.
func gammaRouteList(m *model.Mesh, port uint32, entries []model.RouteEntry) *routev3.RouteList {
	rl := &routev3.RouteList{Routes: make([]*routev3.Route, 0, len(entries))}
	for _, e := range entries {
		rl.Routes = append(rl.Routes, gammaRoute(m, port, e))
	}
	return rl
}

// gammaRoute is the Envoy route of one entry of a frontend on port: its match, then the rule's
// filters and backends. The route is named "<kind> <ns>/<name> rule <i> match <j>". Where the
// request cannot be served (a rule that fails closed, no backend with weight, an invalid
// backend's share) it is answered 500, or for a GRPCRoute 503, which gRPC clients see as
// UNAVAILABLE (GRPCRouteRule.backendRefs; an HTTP 500 would be UNKNOWN).
func gammaRoute(m *model.Mesh, port uint32, e model.RouteEntry) *routev3.Route {
	r := &routev3.Route{
		Name:  fmt.Sprintf("%s rule %d match %d", e.Route, e.RuleIndex, e.MatchIndex),
		Match: routeMatch(e.Match),
	}
	rule := e.Rule
	errStatus, notFound := uint32(500), routev3.RouteAction_INTERNAL_SERVER_ERROR
	if e.Route.Kind == model.KindGRPCRoute {
		errStatus, notFound = 503, routev3.RouteAction_SERVICE_UNAVAILABLE
	}
	if _, asError := rule.Served(); asError {
		// A filter that must not be skipped cannot be applied (model.RouteRule.FailClosed).
		r.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: errStatus}}
		return r
	}
	var rewrite *model.Rewrite
	var redirect *model.Redirect
	var mirrors []*model.Mirror
	for _, f := range rule.Filters {
		switch f.Type {
		case model.FilterCORS:
			// As for the route lists (gammaRoutes): marshalling a message built here cannot fail.
			p, _ := anypb.New(corsPolicy(f.CORS))
			r.TypedPerFilterConfig = map[string]*anypb.Any{CORSFilterName: p}
		case model.FilterRequestHeaderModifier, model.FilterResponseHeaderModifier:
			h := headerMods{&r.RequestHeadersToAdd, &r.RequestHeadersToRemove, &r.ResponseHeadersToAdd, &r.ResponseHeadersToRemove}
			h.apply(f)
		case model.FilterRequestRedirect:
			redirect = f.Redirect
		case model.FilterURLRewrite:
			rewrite = f.Rewrite
		case model.FilterRequestMirror:
			mirrors = append(mirrors, f.Mirror)
		}
	}
	if redirect != nil {
		// The rule's other filters apply to the redirect answer too (response headers, CORS);
		// the model refuses a mirror or a rewrite beside a redirect (nothing goes upstream).
		r.Action = &routev3.Route_Redirect{Redirect: redirectAction(e.Match.Path, redirect, port)}
		return r
	}
	ra := &routev3.RouteAction{
		// No per-request timeout unless the rule sets one: streams and long polls are the
		// application's business (as for the default route, routeTo).
		Timeout:                     durationpb.New(0),
		ClusterNotFoundResponseCode: notFound,
	}
	var wcs []*routev3.WeightedCluster_ClusterWeight
	for _, b := range rule.Backends {
		if b.Weight <= 0 {
			continue
		}
		cw := &routev3.WeightedCluster_ClusterWeight{Name: backendCluster(m, b), Weight: wrapperspb.UInt32(uint32(b.Weight))}
		h := headerMods{&cw.RequestHeadersToAdd, &cw.RequestHeadersToRemove, &cw.ResponseHeadersToAdd, &cw.ResponseHeadersToRemove}
		for _, f := range b.Filters {
			h.apply(f)
		}
		wcs = append(wcs, cw)
	}
	switch {
	case len(wcs) == 0:
		// No backend, or none with weight: nowhere to send the request (HTTPRouteRule.backendRefs).
		r.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: errStatus}}
		return r
	case len(wcs) == 1 && len(wcs[0].RequestHeadersToAdd)+len(wcs[0].RequestHeadersToRemove)+len(wcs[0].ResponseHeadersToAdd)+len(wcs[0].ResponseHeadersToRemove) == 0:
		ra.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: wcs[0].Name}
	default:
		ra.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: wcs}}
	}
	if rewrite != nil {
		if rewrite.Hostname != "" {
			ra.HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: rewrite.Hostname}
		}
		if rewrite.Path != nil {
			ra.RegexRewrite = pathRewrite(e.Match.Path, rewrite.Path)
		}
	}
	for _, mi := range mirrors {
		if mi.Backend.Invalid != nil {
			continue // reported in ResolvedRefs; nothing to mirror to
		}
		// The mirrored copy goes to the caller's own mirror cluster (mirrorClusterName), named
		// by a header the route sets from the caller's identity, overwriting any the client sent.
		header := MirrorHeader(len(ra.RequestMirrorPolicies))
		r.RequestHeadersToAdd = append(r.RequestHeadersToAdd, &core.HeaderValueOption{
			Header:       &core.HeaderValue{Key: header, Value: mirrorClusterPrefix + "%FILTER_STATE(" + CertMapperFilterStateKey + ":PLAIN)%|" + backendCluster(m, mi.Backend)},
			AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
		ra.RequestMirrorPolicies = append(ra.RequestMirrorPolicies, &routev3.RouteAction_RequestMirrorPolicy{
			ClusterHeader: header,
			RuntimeFraction: &core.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{
				Numerator:   uint32(int64(mi.Numerator) * 1_000_000 / int64(mi.Denominator)),
				Denominator: typev3.FractionalPercent_MILLION,
			}},
		})
	}
	t := rule.Timeouts
	if t.Request != nil {
		ra.Timeout = durationpb.New(*t.Request)
	}
	if rt := rule.Retry; rt != nil {
		rp := &routev3.RetryPolicy{RetryOn: "connect-failure,refused-stream,reset"}
		if len(rt.Codes) > 0 {
			rp.RetryOn += ",retriable-status-codes"
			for _, c := range rt.Codes {
				rp.RetriableStatusCodes = append(rp.RetriableStatusCodes, uint32(c))
			}
		}
		if rt.Attempts != nil {
			rp.NumRetries = wrapperspb.UInt32(uint32(*rt.Attempts))
		}
		if rt.Backoff != nil {
			rp.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(*rt.Backoff)}
		}
		if t.BackendRequest != nil {
			rp.PerTryTimeout = durationpb.New(*t.BackendRequest)
		}
		ra.RetryPolicy = rp
	} else if t.BackendRequest != nil && *t.BackendRequest > 0 && (t.Request == nil || *t.Request == 0 || *t.BackendRequest < *t.Request) {
		// Without retries there is one backend request: its timeout bounds the whole request.
		ra.Timeout = durationpb.New(*t.BackendRequest)
	}
	r.Action = &routev3.Route_Route{Route: ra}
	return r
}

// backendCluster is the cluster a backend's traffic goes to: for a ServiceImport the service
// port's EDS cluster (every exporting cluster's endpoints), for a Service its endpoints in this
// cluster (GEP-1748: LocalClusterName where the service is imported too, else the EDS cluster,
// which then holds only this cluster's), or for an invalid backend a cluster that does not exist
// (invalidClusterPrefix).
func backendCluster(m *model.Mesh, b model.BackendRef) string {
	if b.Invalid != nil {
		return invalidClusterPrefix + string(b.Kind) + "/" + b.Service.String()
	}
	if s := m.Service(b.Service); b.Kind == model.BackendService && s != nil {
		if i := slices.IndexFunc(s.Ports, func(sp model.ServicePort) bool { return sp.Port == b.Port }); i >= 0 && hasLocalCluster(s, s.Ports[i]) {
			return LocalClusterName(m, b.Service, b.Port)
		}
	}
	return ClusterName(m, b.Service, b.Port)
}

// routeMatch is the Envoy match of one route match: the path (PathPrefix as
// path_separated_prefix, so "/abc" matches "/abc" and "/abc/d" but not "/abcd"), or a GRPCRoute's
// method as the path "/<service>/<method>", then headers, :method and query parameters.
func routeMatch(mm model.RouteMatch) *routev3.RouteMatch {
	rm := &routev3.RouteMatch{}
	switch {
	case mm.GRPC != nil:
		g := mm.GRPC
		switch {
		case g.Type == model.MatchExact && g.Service != "" && g.Method != "":
			rm.PathSpecifier = &routev3.RouteMatch_Path{Path: "/" + g.Service + "/" + g.Method}
		case g.Type == model.MatchExact && g.Method == "":
			rm.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: "/" + g.Service + "/"}
		default:
			re, _ := model.GRPCMethodRegex(*g) // the expression the model checks
			rm.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}
		}
	case mm.Path.Type == model.MatchExact:
		rm.PathSpecifier = &routev3.RouteMatch_Path{Path: mm.Path.Value}
	case mm.Path.Type == model.MatchRegex:
		rm.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: mm.Path.Value}}
	default:
		if p := strings.TrimRight(mm.Path.Value, "/"); p != "" {
			rm.PathSpecifier = &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: p}
		} else {
			rm.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: "/"}
		}
	}
	for _, h := range mm.Headers {
		rm.Headers = append(rm.Headers, &routev3.HeaderMatcher{Name: h.Name,
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: stringMatcher(h)}})
	}
	if mm.Method != "" {
		rm.Headers = append(rm.Headers, &routev3.HeaderMatcher{Name: ":method",
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
				MatchPattern: &matcherv3.StringMatcher_Exact{Exact: mm.Method}}}})
	}
	for _, q := range mm.Query {
		rm.QueryParameters = append(rm.QueryParameters, &routev3.QueryParameterMatcher{Name: q.Name,
			QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: stringMatcher(q)}})
	}
	return rm
}

func stringMatcher(s model.StringMatch) *matcherv3.StringMatcher {
	if s.Type == model.MatchRegex {
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: s.Value}}}
	}
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s.Value}}
}

// headerMods are the header fields of an Envoy route or weighted cluster a header modifier
// filter adds to.
type headerMods struct {
	reqAdd    *[]*core.HeaderValueOption
	reqRemove *[]string
	resAdd    *[]*core.HeaderValueOption
	resRemove *[]string
}

// apply adds a RequestHeaderModifier or ResponseHeaderModifier filter f; other filters are
// ignored.
func (h headerMods) apply(f model.RouteFilter) {
	switch f.Type {
	case model.FilterRequestHeaderModifier:
		*h.reqAdd = append(*h.reqAdd, headerOptions(f.Headers)...)
		*h.reqRemove = append(*h.reqRemove, f.Headers.Remove...)
	case model.FilterResponseHeaderModifier:
		*h.resAdd = append(*h.resAdd, headerOptions(f.Headers)...)
		*h.resRemove = append(*h.resRemove, f.Headers.Remove...)
	}
}

// headerOptions are a header modifier's set (overwrite) and add (append) entries. Envoy reads a
// header value to add as a format string (%COMMAND% operators), so each "%" of the route's
// value is doubled: the header carries the value as written, and a "%" never makes Envoy refuse
// the route table (a NACK of every route of the node) nor reads the proxy's state into a header.
func headerOptions(h *model.HeaderModifier) []*core.HeaderValueOption {
	var out []*core.HeaderValueOption
	for _, s := range h.Set {
		out = append(out, &core.HeaderValueOption{Header: &core.HeaderValue{Key: s.Name, Value: literalHeaderValue(s.Value)},
			AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	for _, a := range h.Add {
		out = append(out, &core.HeaderValueOption{Header: &core.HeaderValue{Key: a.Name, Value: literalHeaderValue(a.Value)},
			AppendAction: core.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
	}
	return out
}

// literalHeaderValue escapes v for a HeaderValue that Envoy formats: "%" becomes "%%".
func literalHeaderValue(v string) string { return strings.ReplaceAll(v, "%", "%%") }

// pathRewrite is the regex rewrite of an HTTPPathModifier under path match p: ReplaceFullPath
// replaces the whole path; ReplacePrefixMatch replaces the matched prefix, element-wise as the
// HTTPPathModifier docs show ("/foo" replaced by "/" turns "/foo/bar" into "/bar", not "//bar").
func pathRewrite(p model.PathMatch, pm *model.PathModifier) *matcherv3.RegexMatchAndSubstitute {
	if pm.Type == model.ReplaceFullPath {
		return &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: "^.*$"}, Substitution: literalSubstitution(pm.Value)}
	}
	prefix := strings.TrimRight(p.Value, "/")
	repl := literalSubstitution(strings.TrimRight(pm.Value, "/"))
	switch {
	case prefix == "":
		// Prefix "/": every path; the replacement goes in front of it.
		return &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: "^/"}, Substitution: repl + "/"}
	case repl == "":
		return &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: "^" + regexp.QuoteMeta(prefix) + "/?"}, Substitution: "/"}
	}
	return &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: "^" + regexp.QuoteMeta(prefix)}, Substitution: repl}
}

// literalSubstitution escapes v for a RegexMatchAndSubstitute's substitution, where "\\N"
// inserts a capture group: each backslash is doubled, so the path is inserted as written.
func literalSubstitution(v string) string { return strings.ReplaceAll(v, `\`, `\\`) }

// redirectCodes maps HTTPRequestRedirectFilter.statusCode to Envoy's response codes.
var redirectCodes = map[int]routev3.RedirectAction_RedirectResponseCode{
	301: routev3.RedirectAction_MOVED_PERMANENTLY,
	302: routev3.RedirectAction_FOUND,
	303: routev3.RedirectAction_SEE_OTHER,
	307: routev3.RedirectAction_TEMPORARY_REDIRECT,
	308: routev3.RedirectAction_PERMANENT_REDIRECT,
}

// redirectAction is the Envoy redirect of an HTTPRequestRedirectFilter under path match p, on a
// frontend on port.
func redirectAction(p model.PathMatch, d *model.Redirect, port uint32) *routev3.RedirectAction {
	ra := &routev3.RedirectAction{ResponseCode: redirectCodes[d.StatusCode], HostRedirect: d.Hostname, PortRedirect: redirectPort(d, port)}
	if d.Scheme != "" {
		ra.SchemeRewriteSpecifier = &routev3.RedirectAction_SchemeRedirect{SchemeRedirect: d.Scheme}
	}
	if d.Path != nil {
		if d.Path.Type == model.ReplaceFullPath {
			ra.PathRewriteSpecifier = &routev3.RedirectAction_PathRedirect{PathRedirect: d.Path.Value}
		} else {
			ra.PathRewriteSpecifier = &routev3.RedirectAction_RegexRewrite{RegexRewrite: pathRewrite(p, d.Path)}
		}
	}
	return ra
}

// corsPolicy is the Envoy CorsPolicy (the per-route config of CORSFilterName) of an
// HTTPCORSFilter (GEP-1767, Gateway API v1.6.3):
//   - allowOrigins: one matcher per origin (model.CORSOriginRegex, which the model also bounds); "*" alone allows every origin.
//     Envoy answers with the request's Origin in Access-Control-Allow-Origin, never "*", which
//     the spec requires with allowCredentials and allows without.
//   - allowMethods, allowHeaders: joined with ", "; for "*" Envoy echoes the preflight's
//     Access-Control-Request-Method / -Headers (the spec's "must" with allowCredentials).
//   - exposeHeaders: joined; "*" with allowCredentials is left out (the spec forbids sending it,
//     and a browser reads it as a header literally named "*" then): the other names listed and
//     the CORS-safelisted response headers are exposed.
//   - allowCredentials: Access-Control-Allow-Credentials: true only when set.
//   - maxAge: Access-Control-Max-Age in seconds (default 5, applied by the model).
//
// A preflight from an origin not allowed is answered by Envoy (200, without
// Access-Control-Allow-Origin) rather than forwarded to the backend
// (forward_not_matching_preflights false), as HTTPCORSFilter.allowOrigins describes.
func corsPolicy(c *model.CORS) *corsv3.CorsPolicy {
	p := &corsv3.CorsPolicy{
		AllowMethods:                 strings.Join(c.AllowMethods, ", "),
		AllowHeaders:                 strings.Join(c.AllowHeaders, ", "),
		MaxAge:                       strconv.Itoa(int(c.MaxAge)),
		ForwardNotMatchingPreflights: wrapperspb.Bool(false),
	}
	expose := c.ExposeHeaders
	if c.AllowCredentials {
		expose = slices.DeleteFunc(slices.Clone(expose), func(h string) bool { return h == "*" })
	}
	p.ExposeHeaders = strings.Join(expose, ", ")
	if c.AllowCredentials {
		p.AllowCredentials = wrapperspb.Bool(true)
	}
	for _, o := range c.AllowOrigins {
		if o == "*" {
			p.AllowOriginStringMatch = append(p.AllowOriginStringMatch, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "*"}})
			continue
		}
		p.AllowOriginStringMatch = append(p.AllowOriginStringMatch, &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: model.CORSOriginRegex(o)}}})
	}
	return p
}

// redirectPort is the RedirectAction.port_redirect of redirect d on a frontend on port, which is
// the listener port of HTTPRequestRedirectFilter.port: the Location's port is d.Port, else the
// well-known port of d.Scheme, else the frontend port (the capture path serves plain http).
// Envoy writes a port_redirect into the Location even when it is the scheme's default; without
// one it keeps the Host's port, except that host_redirect replaces it and a switch from http
// drops a Host ":80". So 0 (no port_redirect, no port in the Location) only where the port is
// the scheme's default and the Location gets no other: a hostname is given, or the frontend port
// is 80. Elsewhere the port is explicit, even 80 or 443 (Envoy cannot drop a Host ":8080").
func redirectPort(d *model.Redirect, port uint32) uint32 {
	scheme := cmp.Or(d.Scheme, "http")
	p := d.Port
	switch {
	case p != 0:
	case d.Scheme != "":
		p = wellKnownPorts[scheme]
	default:
		p = port
	}
	if p == wellKnownPorts[scheme] && (d.Hostname != "" || port == 80) {
		return 0
	}
	return p
}

// wellKnownPorts are the ports of the redirect schemes (HTTPRequestRedirectFilter.port).
var wellKnownPorts = map[string]uint32{"http": 80, "https": 443}
