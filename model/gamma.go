package model

import (
	"fmt"
	"regexp"
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
// "/", match type Exact, weight 1, redirect 302). What aether does not serve (the ExtensionRef and
// ExternalAuth filters, sessionPersistence, a backend of another kind) is listed in the rule's
// Unsupported or the backend's Invalid with the field's path, never dropped silently.
func HTTPRouteModel(r *gwv1.HTTPRoute) Route {
	out := Route{
		RouteRef:   RouteRef{Kind: KindHTTPRoute, Namespace: r.Namespace, Name: r.Name},
		Generation: r.Generation, Created: r.CreationTimestamp.Time,
		Parents: meshParents(r.Namespace, r.Spec.ParentRefs),
	}
	for i, rule := range r.Spec.Rules {
		f := fmt.Sprintf("spec.rules[%d]", i)
		mr := RouteRule{Name: sectionName(rule.Name)}
		for _, m := range rule.Matches {
			mr.Matches = append(mr.Matches, httpMatch(m))
		}
		if len(mr.Matches) == 0 {
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
			var bad string
			mr.Timeouts.Request, bad = duration(t.Request)
			if bad != "" {
				mr.Unsupported = append(mr.Unsupported, f+".timeouts.request: "+bad)
			}
			mr.Timeouts.BackendRequest, bad = duration(t.BackendRequest)
			if bad != "" {
				mr.Unsupported = append(mr.Unsupported, f+".timeouts.backendRequest: "+bad)
			}
		}
		if rt := rule.Retry; rt != nil {
			mrt := &RouteRetry{Attempts: rt.Attempts}
			for _, c := range rt.Codes {
				mrt.Codes = append(mrt.Codes, int(c))
			}
			var bad string
			mrt.Backoff, bad = duration(rt.Backoff)
			if bad != "" {
				mr.Unsupported = append(mr.Unsupported, f+".retry.backoff: "+bad)
			}
			mr.Retry = mrt
		}
		if rule.SessionPersistence != nil {
			mr.Unsupported = append(mr.Unsupported, f+".sessionPersistence: not supported")
		}
		mr.Unsupported = append(mr.Unsupported, incompatibleFilters(f, mr)...)
		out.Rules = append(out.Rules, mr)
	}
	return out
}

// GRPCRouteModel turns a GRPCRoute into a Route, as HTTPRouteModel does.
func GRPCRouteModel(r *gwv1.GRPCRoute) Route {
	out := Route{
		RouteRef:   RouteRef{Kind: KindGRPCRoute, Namespace: r.Namespace, Name: r.Name},
		Generation: r.Generation, Created: r.CreationTimestamp.Time,
		Parents: meshParents(r.Namespace, r.Spec.ParentRefs),
	}
	for i, rule := range r.Spec.Rules {
		f := fmt.Sprintf("spec.rules[%d]", i)
		mr := RouteRule{Name: sectionName(rule.Name)}
		for _, m := range rule.Matches {
			mm := RouteMatch{Headers: headerMatches(grpcHeaders(m.Headers))}
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
				if g.Service != "" || g.Method != "" {
					mm.GRPC = g
				}
			}
			mr.Matches = append(mr.Matches, mm)
		}
		if len(mr.Matches) == 0 {
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

// meshParents are the parentRefs of kind Service (core group) and ServiceImport (group
// multicluster.x-k8s.io); a parentRef's kind defaults to Gateway and is not the mesh's.
func meshParents(ns string, refs []gwv1.ParentReference) []ParentRef {
	var out []ParentRef
	for i, p := range refs {
		group, kind := "gateway.networking.k8s.io", "Gateway"
		if p.Group != nil {
			group = string(*p.Group)
		}
		if p.Kind != nil {
			kind = string(*p.Kind)
		}
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

func httpMatch(m gwv1.HTTPRouteMatch) RouteMatch {
	mm := RouteMatch{Path: PathMatch{Type: MatchPathPrefix, Value: "/"}}
	if p := m.Path; p != nil {
		if p.Type != nil {
			mm.Path.Type = MatchType(*p.Type)
		}
		if p.Value != nil {
			mm.Path.Value = *p.Value
		}
	}
	mm.Headers = headerMatches(m.Headers)
	seen := map[string]bool{}
	for _, q := range m.QueryParams {
		if seen[string(q.Name)] {
			continue // the first entry of a name counts (HTTPQueryParamMatch.name)
		}
		seen[string(q.Name)] = true
		t := MatchExact
		if q.Type != nil {
			t = MatchType(*q.Type)
		}
		mm.Query = append(mm.Query, StringMatch{Type: t, Name: string(q.Name), Value: q.Value})
	}
	if m.Method != nil {
		mm.Method = string(*m.Method)
	}
	return mm
}

func grpcHeaders(hs []gwv1.GRPCHeaderMatch) []gwv1.HTTPHeaderMatch {
	out := make([]gwv1.HTTPHeaderMatch, 0, len(hs))
	for _, h := range hs {
		out = append(out, gwv1.HTTPHeaderMatch{Type: (*gwv1.HeaderMatchType)(h.Type), Name: gwv1.HTTPHeaderName(h.Name), Value: h.Value})
	}
	return out
}

// headerMatches lower-cases names and keeps the first entry of each (HTTPHeaderMatch.name: "only
// the first entry with an equivalent name MUST be considered").
func headerMatches(hs []gwv1.HTTPHeaderMatch) []StringMatch {
	var out []StringMatch
	seen := map[string]bool{}
	for _, h := range hs {
		n := strings.ToLower(string(h.Name))
		if seen[n] {
			continue
		}
		seen[n] = true
		t := MatchExact
		if h.Type != nil {
			t = MatchType(*h.Type)
		}
		out = append(out, StringMatch{Type: t, Name: n, Value: h.Value})
	}
	return out
}

// httpFilter converts one filter; bad says why aether cannot serve it ("" when it can).
func httpFilter(ns string, f gwv1.HTTPRouteFilter) (RouteFilter, string) {
	out := RouteFilter{Type: FilterType(f.Type)}
	switch f.Type {
	case gwv1.HTTPRouteFilterRequestHeaderModifier:
		out.Headers = headerModifier(f.RequestHeaderModifier)
	case gwv1.HTTPRouteFilterResponseHeaderModifier:
		out.Headers = headerModifier(f.ResponseHeaderModifier)
	case gwv1.HTTPRouteFilterRequestRedirect:
		rr := f.RequestRedirect
		if rr == nil {
			return out, "type RequestRedirect: requestRedirect is not set"
		}
		d := &Redirect{StatusCode: 302, Path: pathModifier(rr.Path)}
		if rr.Scheme != nil {
			d.Scheme = *rr.Scheme
		}
		if rr.Hostname != nil {
			d.Hostname = string(*rr.Hostname)
		}
		if rr.Port != nil {
			d.Port = uint32(*rr.Port)
		}
		if rr.StatusCode != nil {
			d.StatusCode = *rr.StatusCode
		}
		switch d.StatusCode {
		case 301, 302, 303, 307, 308:
		default:
			return out, fmt.Sprintf("requestRedirect.statusCode: value %d: want 301, 302, 303, 307 or 308", d.StatusCode)
		}
		out.Redirect = d
	case gwv1.HTTPRouteFilterURLRewrite:
		if f.URLRewrite == nil {
			return out, "type URLRewrite: urlRewrite is not set"
		}
		w := &Rewrite{Path: pathModifier(f.URLRewrite.Path)}
		if f.URLRewrite.Hostname != nil {
			w.Hostname = string(*f.URLRewrite.Hostname)
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
			if !corsOrigin.MatchString(string(o)) {
				return out, fmt.Sprintf("cors.allowOrigins[%d]: %q: want \"*\" or <scheme>://<host>[:<port>] with scheme http or https and a host that may start with \"*.\" or be \"*\"", i, o)
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

func headerModifier(h *gwv1.HTTPHeaderFilter) *HeaderModifier {
	out := &HeaderModifier{}
	if h == nil {
		return out
	}
	for _, s := range h.Set {
		out.Set = append(out.Set, Header{Name: strings.ToLower(string(s.Name)), Value: s.Value})
	}
	for _, a := range h.Add {
		out.Add = append(out.Add, Header{Name: strings.ToLower(string(a.Name)), Value: a.Value})
	}
	for _, r := range h.Remove {
		out.Remove = append(out.Remove, strings.ToLower(r))
	}
	return out
}

func pathModifier(p *gwv1.HTTPPathModifier) *PathModifier {
	if p == nil {
		return nil
	}
	out := &PathModifier{Type: string(p.Type)}
	switch p.Type {
	case gwv1.FullPathHTTPPathModifier:
		if p.ReplaceFullPath != nil {
			out.Value = *p.ReplaceFullPath
		}
	case gwv1.PrefixMatchHTTPPathModifier:
		if p.ReplacePrefixMatch != nil {
			out.Value = *p.ReplacePrefixMatch
		}
	}
	return out
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

// duration parses a Gateway API Duration (GEP-2257); nil stays nil.
func duration(d *gwv1.Duration) (*time.Duration, string) {
	if d == nil {
		return nil, ""
	}
	v, err := time.ParseDuration(string(*d))
	if err != nil || v < 0 {
		return nil, fmt.Sprintf("value %q: want a Gateway API duration such as 500ms or 1h30m (GEP-2257)", *d)
	}
	return &v, ""
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
