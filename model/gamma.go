package model

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Groups of the kinds a mesh route refers to.
const (
	groupCore = ""
	groupMCS  = "multicluster.x-k8s.io"
)

// HTTPRouteModel turns an HTTPRoute into a Route, applying the API's defaults (path PathPrefix
// "/", match type Exact, weight 1, redirect 302, the first of repeated header and query names).
// What aether does not serve (the ExtensionRef and ExternalAuth filters, sessionPersistence, a
// backend of another kind) and every value the checks of validate.go refuse (what Envoy would
// refuse, unknown enum values) is listed in the rule's Unsupported, with the field's path and
// the value, or in the backend's Invalid, never dropped silently; a match that cannot be built
// is left out of Matches and sets BadMatches.
func HTTPRouteModel(r *gwv1.HTTPRoute) Route {
	out := Route{
		RouteRef:   RouteRef{Kind: KindHTTPRoute, Namespace: r.Namespace, Name: r.Name},
		Generation: r.Generation, Created: r.CreationTimestamp.Time,
		Parents:        meshParents(r.Namespace, r.Spec.ParentRefs),
		GatewayParents: gatewayParents(r.Namespace, r.Spec.ParentRefs),
		Hostnames:      hostnames(r.Spec.Hostnames),
	}
	for i, rule := range r.Spec.Rules {
		f := fmt.Sprintf("spec.rules[%d]", i)
		mr := RouteRule{Name: sectionName(rule.Name)}
		addMatches(&mr, f, rule.Matches, httpMatch)
		if len(rule.Matches) == 0 {
			mr.Matches = []RouteMatch{{Path: PathMatch{Type: MatchPathPrefix, Value: "/"}}}
		}
		for j, fl := range rule.Filters {
			mf, bad := httpFilter(r.Namespace, fl)
			if bad != "" {
				mr.Unsupported = append(mr.Unsupported, fmt.Sprintf("%s.filters[%d]: %s", f, j, bad))
				mr.FailClosed = mr.FailClosed || mustNotSkip(fl.Type)
				continue
			}
			mr.Filters = append(mr.Filters, mf)
		}
		for j, b := range rule.BackendRefs {
			mr.Backends = append(mr.Backends, backendWithFilters(r.Namespace, fmt.Sprintf("%s.backendRefs[%d]", f, j), b.BackendRef, b.Filters, &mr))
		}
		if t := rule.Timeouts; t != nil {
			mr.Timeouts = ruleTimeouts(f+".timeouts", t, &mr)
		}
		if rt := rule.Retry; rt != nil {
			mr.Retry = ruleRetry(f+".retry", rt, &mr)
		}
		if rule.SessionPersistence != nil {
			mr.Unsupported = append(mr.Unsupported, f+".sessionPersistence: not supported")
		}
		mr.Unsupported = append(mr.Unsupported, incompatibleFilters(f, mr)...)
		out.Rules = append(out.Rules, mr)
	}
	return out
}

// GRPCRouteModel turns a GRPCRoute into a Route, as HTTPRouteModel does (method match type
// Exact by default).
func GRPCRouteModel(r *gwv1.GRPCRoute) Route {
	out := Route{
		RouteRef:   RouteRef{Kind: KindGRPCRoute, Namespace: r.Namespace, Name: r.Name},
		Generation: r.Generation, Created: r.CreationTimestamp.Time,
		Parents:        meshParents(r.Namespace, r.Spec.ParentRefs),
		GatewayParents: gatewayParents(r.Namespace, r.Spec.ParentRefs),
		Hostnames:      hostnames(r.Spec.Hostnames),
	}
	for i, rule := range r.Spec.Rules {
		f := fmt.Sprintf("spec.rules[%d]", i)
		mr := RouteRule{Name: sectionName(rule.Name)}
		addMatches(&mr, f, rule.Matches, grpcMatch)
		if len(rule.Matches) == 0 {
			mr.Matches = []RouteMatch{{}}
		}
		for j, fl := range rule.Filters {
			mf, bad := httpFilter(r.Namespace, grpcFilter(fl))
			if bad != "" {
				mr.Unsupported = append(mr.Unsupported, fmt.Sprintf("%s.filters[%d]: %s", f, j, bad))
				mr.FailClosed = mr.FailClosed || mustNotSkip(gwv1.HTTPRouteFilterType(fl.Type))
				continue
			}
			mr.Filters = append(mr.Filters, mf)
		}
		for j, b := range rule.BackendRefs {
			fs := make([]gwv1.HTTPRouteFilter, len(b.Filters))
			for k, fl := range b.Filters {
				fs[k] = grpcFilter(fl)
			}
			mr.Backends = append(mr.Backends, backendWithFilters(r.Namespace, fmt.Sprintf("%s.backendRefs[%d]", f, j), b.BackendRef, fs, &mr))
		}
		if rule.SessionPersistence != nil {
			mr.Unsupported = append(mr.Unsupported, f+".sessionPersistence: not supported")
		}
		mr.Unsupported = append(mr.Unsupported, incompatibleFilters(f, mr)...)
		out.Rules = append(out.Rules, mr)
	}
	return out
}

// addMatches converts the matches ms of rule field f (spec.rules[i]) into mr.Matches; one that
// cannot be built is listed in mr.Unsupported under its field and sets mr.BadMatches.
func addMatches[M any](mr *RouteRule, f string, ms []M, conv func(M) (RouteMatch, *fieldProblem)) {
	for j, m := range ms {
		mm, bad := conv(m)
		if bad != nil {
			mr.Unsupported = append(mr.Unsupported, bad.under(fmt.Sprintf("%s.matches[%d]", f, j)).unsupported())
			mr.BadMatches = true
			continue
		}
		mr.Matches = append(mr.Matches, mm)
	}
}

// grpcFilter is a GRPCRouteFilter as the HTTPRouteFilter with the same type and fields (the
// GRPCRoute filter types are a subset of HTTPRoute's, with the same names).
func grpcFilter(f gwv1.GRPCRouteFilter) gwv1.HTTPRouteFilter {
	return gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterType(f.Type), RequestHeaderModifier: f.RequestHeaderModifier,
		ResponseHeaderModifier: f.ResponseHeaderModifier, RequestMirror: f.RequestMirror, ExtensionRef: f.ExtensionRef}
}

// backendWithFilters converts backendRef b (the field f) with its filters fs; a filter other than
// the header modifiers is added to mr.Unsupported.
func backendWithFilters(ns, f string, b gwv1.BackendRef, fs []gwv1.HTTPRouteFilter, mr *RouteRule) BackendRef {
	mb := backendRef(ns, b)
	for k, fl := range fs {
		mf, bad := httpFilter(ns, fl)
		if bad == "" && mf.Type != FilterRequestHeaderModifier && mf.Type != FilterResponseHeaderModifier {
			bad = fmt.Sprintf("type %q: a backendRef takes only RequestHeaderModifier and ResponseHeaderModifier", fl.Type)
		}
		if bad != "" {
			mr.Unsupported = append(mr.Unsupported, fmt.Sprintf("%s.filters[%d]: %s", f, k, bad))
			mr.FailClosed = mr.FailClosed || mustNotSkip(fl.Type)
			continue
		}
		mb.Filters = append(mb.Filters, mf)
	}
	return mb
}

// MaxMirrorsPerRule is the most RequestMirror filters a rule may have: HTTPRouteRule.filters
// holds at most 16 filters (the node proxy names one header per mirror, xds.MirrorHeader).
const MaxMirrorsPerRule = 16

// mustNotSkip reports whether an unsupported filter of type t must fail closed rather than be
// left out: a custom filter (ExtensionRef) or external authorization (ExternalAuth), which guard
// what they filter (HTTPRouteFilter.type and ExternalAuth, Gateway API v1.6.3).
func mustNotSkip(t gwv1.HTTPRouteFilterType) bool {
	return t == gwv1.HTTPRouteFilterExtensionRef || t == gwv1.HTTPRouteFilterExternalAuth
}

func sectionName(s *gwv1.SectionName) string {
	if s == nil {
		return ""
	}
	return string(*s)
}

// parentGroupKind is a parentRef's group and kind with the API's defaults
// (gateway.networking.k8s.io, Gateway).
func parentGroupKind(p gwv1.ParentReference) (group, kind string) {
	group, kind = gwv1.GroupName, "Gateway"
	if p.Group != nil {
		group = string(*p.Group)
	}
	if p.Kind != nil {
		kind = string(*p.Kind)
	}
	return group, kind
}

// gatewayParents are the parentRefs of kind Gateway (group gateway.networking.k8s.io, the
// defaults), their namespace defaulting to the route's ns.
func gatewayParents(ns string, refs []gwv1.ParentReference) []GatewayParentRef {
	var out []GatewayParentRef
	for i, p := range refs {
		if group, kind := parentGroupKind(p); group != gwv1.GroupName || kind != "Gateway" {
			continue
		}
		gp := GatewayParentRef{Index: i, Gateway: GatewayKey{Namespace: ns, Name: string(p.Name)}, SectionName: sectionName(p.SectionName)}
		if p.Namespace != nil && *p.Namespace != "" {
			gp.Gateway.Namespace = string(*p.Namespace)
		}
		if p.Port != nil {
			gp.Port = uint32(*p.Port)
		}
		out = append(out, gp)
	}
	return out
}

// hostnames are a route's spec.hostnames in lower case.
func hostnames(hs []gwv1.Hostname) []string {
	var out []string
	for _, h := range hs {
		out = append(out, strings.ToLower(string(h)))
	}
	return out
}

// meshParents are the parentRefs of kind Service (core group) and ServiceImport (group
// multicluster.x-k8s.io); a parentRef's kind defaults to Gateway and is not the mesh's.
func meshParents(ns string, refs []gwv1.ParentReference) []ParentRef {
	var out []ParentRef
	for i, p := range refs {
		group, kind := parentGroupKind(p)
		var pk ParentKind
		switch {
		case group == groupCore && kind == "Service":
			pk = ParentService
		case group == groupMCS && kind == "ServiceImport":
			pk = ParentServiceImport
		default:
			continue
		}
		mp := ParentRef{Index: i, Kind: pk, Service: ServiceKey{Namespace: ns, Name: string(p.Name)}}
		if p.Namespace != nil && *p.Namespace != "" {
			mp.Service.Namespace = string(*p.Namespace)
		}
		if p.Port != nil {
			mp.Port = uint32(*p.Port)
		}
		mp.SectionName = sectionName(p.SectionName)
		out = append(out, mp)
	}
	return out
}

// httpMatch converts an HTTPRouteMatch; bad is what cannot be served, its field relative to the
// match.
func httpMatch(m gwv1.HTTPRouteMatch) (RouteMatch, *fieldProblem) {
	mm := RouteMatch{Path: PathMatch{Type: MatchPathPrefix, Value: "/"}}
	if p := m.Path; p != nil {
		if p.Type != nil {
			mm.Path.Type = MatchType(*p.Type)
		}
		if p.Value != nil {
			mm.Path.Value = *p.Value
		}
	}
	if bad := checkPathMatch(mm.Path.Type, mm.Path.Value); bad != nil {
		return RouteMatch{}, bad.under("path")
	}
	var bad *fieldProblem
	if mm.Headers, bad = headerMatches(m.Headers); bad != nil {
		return RouteMatch{}, bad
	}
	seen := map[string]bool{}
	for i, q := range m.QueryParams {
		f := fmt.Sprintf("queryParams[%d]", i)
		if why := headerNameReason(string(q.Name)); why != "" {
			return RouteMatch{}, &fieldProblem{f + ".name", string(q.Name), "want a query parameter name (an RFC 9110 token of at most 256 bytes)"}
		}
		t := MatchExact
		if q.Type != nil {
			t = MatchType(*q.Type)
		}
		if bad := checkStringMatch(t, q.Value, maxQueryValueLen); bad != nil {
			return RouteMatch{}, bad.under(f)
		}
		if seen[string(q.Name)] {
			continue // the first entry of a name counts (HTTPQueryParamMatch.name)
		}
		seen[string(q.Name)] = true
		mm.Query = append(mm.Query, StringMatch{Type: t, Name: string(q.Name), Value: q.Value})
	}
	if m.Method != nil {
		mm.Method = string(*m.Method)
		if why := methodReason(mm.Method); why != "" {
			return RouteMatch{}, &fieldProblem{"method", mm.Method, why}
		}
	}
	return mm, nil
}

// grpcMatch converts a GRPCRouteMatch as httpMatch does; a method match with neither service
// nor method is refused (GRPCMethodMatch: "At least one of Service and Method MUST be a
// non-empty string"), as is a type aether does not know.
func grpcMatch(m gwv1.GRPCRouteMatch) (RouteMatch, *fieldProblem) {
	var mm RouteMatch
	var bad *fieldProblem
	if mm.Headers, bad = headerMatches(grpcHeaders(m.Headers)); bad != nil {
		return RouteMatch{}, bad
	}
	if m.Method != nil {
		g := &GRPCMethodMatch{Type: MatchExact}
		if m.Method.Type != nil {
			g.Type = MatchType(*m.Method.Type)
		}
		if m.Method.Service != nil {
			g.Service = *m.Method.Service
		}
		if m.Method.Method != nil {
			g.Method = *m.Method.Method
		}
		if bad := checkGRPCMethod(*g); bad != nil {
			return RouteMatch{}, bad.under("method")
		}
		mm.GRPC = g
	}
	return mm, nil
}

func grpcHeaders(hs []gwv1.GRPCHeaderMatch) []gwv1.HTTPHeaderMatch {
	out := make([]gwv1.HTTPHeaderMatch, 0, len(hs))
	for _, h := range hs {
		out = append(out, gwv1.HTTPHeaderMatch{Type: (*gwv1.HeaderMatchType)(h.Type), Name: gwv1.HTTPHeaderName(h.Name), Value: h.Value})
	}
	return out
}

// headerMatches lower-cases names and keeps the first entry of each (HTTPHeaderMatch.name: "only
// the first entry with an equivalent name MUST be considered"); bad is the first entry that
// cannot be served (field "headers[i]...").
func headerMatches(hs []gwv1.HTTPHeaderMatch) ([]StringMatch, *fieldProblem) {
	var out []StringMatch
	seen := map[string]bool{}
	for i, h := range hs {
		f := fmt.Sprintf("headers[%d]", i)
		if why := headerNameReason(string(h.Name)); why != "" {
			return nil, &fieldProblem{f + ".name", string(h.Name), why}
		}
		t := MatchExact
		if h.Type != nil {
			t = MatchType(*h.Type)
		}
		if bad := checkStringMatch(t, h.Value, maxHeaderValueLen); bad != nil {
			return nil, bad.under(f)
		}
		n := strings.ToLower(string(h.Name))
		if seen[n] {
			continue
		}
		seen[n] = true
		out = append(out, StringMatch{Type: t, Name: n, Value: h.Value})
	}
	return out, nil
}

// httpFilter converts one filter; bad says why aether cannot serve it ("" when it can).
func httpFilter(ns string, f gwv1.HTTPRouteFilter) (RouteFilter, string) {
	out := RouteFilter{Type: FilterType(f.Type)}
	switch f.Type {
	case gwv1.HTTPRouteFilterRequestHeaderModifier:
		var bad *fieldProblem
		if out.Headers, bad = headerModifier(f.RequestHeaderModifier); bad != nil {
			return out, bad.under("requestHeaderModifier").unsupported()
		}
	case gwv1.HTTPRouteFilterResponseHeaderModifier:
		var bad *fieldProblem
		if out.Headers, bad = headerModifier(f.ResponseHeaderModifier); bad != nil {
			return out, bad.under("responseHeaderModifier").unsupported()
		}
	case gwv1.HTTPRouteFilterRequestRedirect:
		rr := f.RequestRedirect
		if rr == nil {
			return out, "type RequestRedirect: requestRedirect is not set"
		}
		path, bad := pathModifier(rr.Path)
		if bad != nil {
			return out, bad.under("requestRedirect.path").unsupported()
		}
		d := &Redirect{StatusCode: 302, Path: path}
		if rr.Scheme != nil {
			d.Scheme = *rr.Scheme
		}
		if rr.Hostname != nil {
			d.Hostname = string(*rr.Hostname)
		}
		if rr.Port != nil {
			d.Port = uint32(max(*rr.Port, 0))
			if *rr.Port < 1 || *rr.Port > 65535 {
				return out, (&fieldProblem{"requestRedirect.port", strconv.Itoa(int(*rr.Port)), "want 1-65535"}).unsupported()
			}
		}
		if rr.StatusCode != nil {
			d.StatusCode = *rr.StatusCode
		}
		switch d.StatusCode {
		case 301, 302, 303, 307, 308:
		default:
			return out, fmt.Sprintf("requestRedirect.statusCode: value %d: want 301, 302, 303, 307 or 308", d.StatusCode)
		}
		if why := schemeReason(d.Scheme); why != "" {
			return out, (&fieldProblem{"requestRedirect.scheme", d.Scheme, why}).unsupported()
		}
		if why := hostnameReason(d.Hostname); why != "" {
			return out, (&fieldProblem{"requestRedirect.hostname", d.Hostname, why}).unsupported()
		}
		out.Redirect = d
	case gwv1.HTTPRouteFilterURLRewrite:
		if f.URLRewrite == nil {
			return out, "type URLRewrite: urlRewrite is not set"
		}
		path, bad := pathModifier(f.URLRewrite.Path)
		if bad != nil {
			return out, bad.under("urlRewrite.path").unsupported()
		}
		w := &Rewrite{Path: path}
		if f.URLRewrite.Hostname != nil {
			w.Hostname = string(*f.URLRewrite.Hostname)
		}
		if why := hostnameReason(w.Hostname); why != "" {
			return out, (&fieldProblem{"urlRewrite.hostname", w.Hostname, why}).unsupported()
		}
		out.Rewrite = w
	case gwv1.HTTPRouteFilterRequestMirror:
		rm := f.RequestMirror
		if rm == nil {
			return out, "type RequestMirror: requestMirror is not set"
		}
		mi := &Mirror{Backend: backendRef(ns, gwv1.BackendRef{BackendObjectReference: rm.BackendRef}), Numerator: 100, Denominator: 100}
		switch {
		case rm.Percent != nil:
			mi.Numerator = *rm.Percent
		case rm.Fraction != nil:
			mi.Numerator, mi.Denominator = rm.Fraction.Numerator, 100
			if rm.Fraction.Denominator != nil {
				mi.Denominator = *rm.Fraction.Denominator
			}
		}
		if mi.Denominator <= 0 || mi.Numerator < 0 || mi.Numerator > mi.Denominator {
			return out, fmt.Sprintf("requestMirror: fraction %d/%d: want 0 <= numerator <= denominator, denominator > 0", mi.Numerator, mi.Denominator)
		}
		out.Mirror = mi
	case gwv1.HTTPRouteFilterCORS:
		c := f.CORS
		if c == nil {
			return out, "type CORS: cors is not set"
		}
		mc := &CORS{MaxAge: 5}
		for i, o := range c.AllowOrigins {
			if why := corsOriginReason(string(o)); why != "" {
				return out, fmt.Sprintf("cors.allowOrigins[%d]: %s: %s", i, quoteValue(string(o)), why)
			}
			mc.AllowOrigins = append(mc.AllowOrigins, string(o))
		}
		if c.AllowCredentials != nil {
			mc.AllowCredentials = *c.AllowCredentials
		}
		lists := []struct {
			field string
			in    []string
			out   *[]string
		}{
			{"allowMethods", stringsOf(c.AllowMethods), &mc.AllowMethods},
			{"allowHeaders", stringsOf(c.AllowHeaders), &mc.AllowHeaders},
			{"exposeHeaders", stringsOf(c.ExposeHeaders), &mc.ExposeHeaders},
		}
		for _, l := range lists {
			for i, v := range l.in {
				if !httpToken.MatchString(v) {
					return out, fmt.Sprintf("cors.%s[%d]: %q: want \"*\" or an HTTP token (RFC 9110, section 5.6.2)", l.field, i, v)
				}
			}
			*l.out = l.in
		}
		if c.MaxAge != 0 {
			mc.MaxAge = c.MaxAge
		}
		out.CORS = mc
	default:
		return out, fmt.Sprintf("type %q: not supported (supported: RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect, URLRewrite, RequestMirror, CORS)", f.Type)
	}
	return out, ""
}

// corsOrigin is the shape of a CORSOrigin (Gateway API v1.6.3 shared_types.go): "*", or
// http(s)://<host>[:<port>] whose host is a DNS name that may start with "*." or is "*".
var corsOrigin = regexp.MustCompile(`^(\*|https?://((\*\.)?([a-zA-Z0-9-]+\.)*[a-zA-Z0-9-]+|\*)(:[0-9]{1,5})?)$`)

// httpToken is an RFC 9110 token (a method or header name; "*" is one too).
var httpToken = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// stringsOf converts a slice of a string type to []string.
func stringsOf[S ~string](in []S) []string {
	var out []string
	for _, v := range in {
		out = append(out, string(v))
	}
	return out
}

// headerModifier converts an HTTPHeaderFilter: names in lower case, the first entry of
// equivalent names in a list (HTTPHeader.name: "Subsequent entries with an equivalent header
// name MUST be ignored"); bad is what checkHeaderEdits refuses, at the entry's index as written.
func headerModifier(h *gwv1.HTTPHeaderFilter) (*HeaderModifier, *fieldProblem) {
	out := &HeaderModifier{}
	if h == nil {
		return out, nil
	}
	all := &HeaderModifier{}
	for _, s := range h.Set {
		all.Set = append(all.Set, Header{Name: strings.ToLower(string(s.Name)), Value: s.Value})
	}
	for _, a := range h.Add {
		all.Add = append(all.Add, Header{Name: strings.ToLower(string(a.Name)), Value: a.Value})
	}
	for _, r := range h.Remove {
		all.Remove = append(all.Remove, strings.ToLower(r))
	}
	if bad := checkHeaderEdits(all, true); bad != nil {
		return nil, bad
	}
	first := func(hs []Header) []Header {
		var kept []Header
		for _, e := range hs {
			if !slices.ContainsFunc(kept, func(k Header) bool { return k.Name == e.Name }) {
				kept = append(kept, e)
			}
		}
		return kept
	}
	out.Set, out.Add = first(all.Set), first(all.Add)
	for _, r := range all.Remove {
		if !slices.Contains(out.Remove, r) {
			out.Remove = append(out.Remove, r)
		}
	}
	return out, nil
}

// pathModifier converts an HTTPPathModifier; bad is a type aether does not know or a value
// pathModifierReason refuses (field "type", "replaceFullPath" or "replacePrefixMatch").
func pathModifier(p *gwv1.HTTPPathModifier) (*PathModifier, *fieldProblem) {
	if p == nil {
		return nil, nil
	}
	out := &PathModifier{Type: string(p.Type)}
	field := ""
	switch p.Type {
	case gwv1.FullPathHTTPPathModifier:
		field = "replaceFullPath"
		if p.ReplaceFullPath != nil {
			out.Value = *p.ReplaceFullPath
		}
	case gwv1.PrefixMatchHTTPPathModifier:
		field = "replacePrefixMatch"
		if p.ReplacePrefixMatch != nil {
			out.Value = *p.ReplacePrefixMatch
		}
	default:
		return nil, &fieldProblem{"type", string(p.Type), "want ReplaceFullPath or ReplacePrefixMatch"}
	}
	if why := pathModifierReason(out.Value); why != "" {
		return nil, &fieldProblem{field, out.Value, why}
	}
	return out, nil
}

// backendRef converts a backendRef; a kind other than Service and ServiceImport is Invalid
// (InvalidKind).
func backendRef(ns string, b gwv1.BackendRef) BackendRef {
	group, kind := groupCore, "Service"
	if b.Group != nil {
		group = string(*b.Group)
	}
	if b.Kind != nil {
		kind = string(*b.Kind)
	}
	out := BackendRef{Service: ServiceKey{Namespace: ns, Name: string(b.Name)}, Weight: 1}
	if b.Namespace != nil && *b.Namespace != "" {
		out.Service.Namespace = string(*b.Namespace)
	}
	if b.Port != nil {
		out.Port = uint32(*b.Port)
	}
	if b.Weight != nil {
		out.Weight = *b.Weight
	}
	switch {
	case group == groupCore && kind == "Service":
		out.Kind = BackendService
	case group == groupMCS && kind == "ServiceImport":
		out.Kind = BackendServiceImport
	default:
		out.Kind = BackendKind(kind)
		out.Invalid = &Condition{Reason: string(gwv1.RouteReasonInvalidKind),
			Message: fmt.Sprintf("backendRef %s %q (group %q): want a Service or a ServiceImport (group %s)", kind, b.Name, group, groupMCS)}
	}
	return out
}

// duration parses a Gateway API Duration (parseDuration); nil stays nil. bad is the refusal,
// field f.
func duration(f string, d *gwv1.Duration) (*time.Duration, *fieldProblem) {
	if d == nil {
		return nil, nil
	}
	v, why := parseDuration(string(*d))
	if why != "" {
		return nil, &fieldProblem{f, string(*d), why}
	}
	return &v, nil
}

// ruleTimeouts converts HTTPRouteTimeouts (field f), listing what it refuses in mr.Unsupported:
// a duration not in GEP-2257's format, a backendRequest over request (timeoutsReason).
func ruleTimeouts(f string, t *gwv1.HTTPRouteTimeouts, mr *RouteRule) RouteTimeouts {
	var out RouteTimeouts
	var bad *fieldProblem
	if out.Request, bad = duration(f+".request", t.Request); bad != nil {
		mr.Unsupported = append(mr.Unsupported, bad.unsupported())
	}
	if out.BackendRequest, bad = duration(f+".backendRequest", t.BackendRequest); bad != nil {
		mr.Unsupported = append(mr.Unsupported, bad.unsupported())
	}
	if why := timeoutsReason(out.Request, out.BackendRequest); why != "" {
		mr.Unsupported = append(mr.Unsupported, (&fieldProblem{f + ".backendRequest", string(*t.BackendRequest), why}).unsupported())
		out.BackendRequest = nil
	}
	return out
}

// ruleRetry converts HTTPRouteRetry (field f), listing what checkRetry and duration refuse in
// mr.Unsupported. A backoff of 0s becomes 1 ms (retryBackoff): Envoy refuses a back-off of 0,
// and waiting 1 ms honours a minimum of 0.
func ruleRetry(f string, rt *gwv1.HTTPRouteRetry, mr *RouteRule) *RouteRetry {
	out := &RouteRetry{}
	var attempts *int64
	if rt.Attempts != nil {
		a := int64(*rt.Attempts)
		attempts = &a
	}
	codes := make([]int, len(rt.Codes))
	for i, c := range rt.Codes {
		codes[i] = int(c)
	}
	if bad := checkRetry(attempts, codes); bad != nil {
		mr.Unsupported = append(mr.Unsupported, bad.under(f).unsupported())
		return nil
	}
	out.Attempts = rt.Attempts
	if len(codes) > 0 {
		out.Codes = codes
	}
	var bad *fieldProblem
	if out.Backoff, bad = duration(f+".backoff", rt.Backoff); bad != nil {
		mr.Unsupported = append(mr.Unsupported, bad.unsupported())
	}
	out.Backoff = retryBackoff(out.Backoff)
	return out
}

// incompatibleFilters lists the filter combinations the spec forbids or aether cannot serve in
// rule r (its field f): URLRewrite with RequestRedirect, the same filter twice (RequestMirror and
// only RequestMirror may repeat) and ReplacePrefixMatch under a match that is not PathPrefix.
func incompatibleFilters(f string, r RouteRule) []string {
	var out []string
	count := map[FilterType]int{}
	var order []FilterType
	for _, fl := range r.Filters {
		if count[fl.Type] == 0 {
			order = append(order, fl.Type)
		}
		count[fl.Type]++
	}
	if count[FilterURLRewrite] > 0 && count[FilterRequestRedirect] > 0 {
		out = append(out, f+".filters: URLRewrite and RequestRedirect cannot be combined (HTTPRouteRule.filters)")
	}
	if n := count[FilterRequestMirror]; n > MaxMirrorsPerRule {
		out = append(out, fmt.Sprintf("%s.filters: RequestMirror given %d times: at most %d", f, n, MaxMirrorsPerRule))
	}
	if count[FilterRequestMirror] > 0 && count[FilterRequestRedirect] > 0 {
		// The spec allows it, and asks an implementation that cannot to say so: a redirect is
		// answered by the proxy, so no request goes upstream to be mirrored.
		out = append(out, f+".filters: RequestMirror and RequestRedirect cannot be combined by aether (a redirect sends nothing upstream to mirror)")
	}
	for _, t := range order {
		if n := count[t]; n > 1 && t != FilterRequestMirror {
			out = append(out, fmt.Sprintf("%s.filters: %s given %d times: at most once", f, t, n))
		}
	}
	for _, fl := range r.Filters {
		var p *PathModifier
		switch {
		case fl.Redirect != nil:
			p = fl.Redirect.Path
		case fl.Rewrite != nil:
			p = fl.Rewrite.Path
		}
		if p == nil || p.Type != ReplacePrefixMatch {
			continue
		}
		for _, m := range r.Matches {
			if m.Path.Type != MatchPathPrefix {
				out = append(out, fmt.Sprintf("%s.filters: %s with ReplacePrefixMatch needs PathPrefix matches, not %s", f, fl.Type, m.Path.Type))
				break
			}
		}
	}
	return out
}
