package model

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

// RouteFieldError is a field of a registryv1.Route that RouteFromProto refuses.
type RouteFieldError struct {
	// Field is the field's path in the record, in the .proto's field names
	// ("rules[2].filters[0].request_redirect.status_code").
	Field string
	// Value is the refused value as text ("" for a missing one, "17 items" for a list too long).
	Value string
	// Reason says what is wanted.
	Reason string
}

// Error returns "<field>: invalid value <value>: <reason>".
func (e *RouteFieldError) Error() string {
	return fmt.Sprintf("%s: invalid value %q: %s", e.Field, e.Value, e.Reason)
}

func routeFieldErr(field, value, reason string) *RouteFieldError {
	return &RouteFieldError{Field: field, Value: value, Reason: reason}
}

// Limits RouteFromProto enforces: the Gateway API v1.6.3 CRDs' (MaxItems, MaxLength, minimums),
// so that every route Kubernetes accepts passes and no record makes a reader hold more.
const (
	maxParentRefs     = 32  // CommonRouteSpec.parentRefs
	maxRules          = 16  // HTTPRouteSpec.rules, GRPCRouteSpec.rules
	maxMatches        = 64  // HTTPRouteRule.matches, GRPCRouteRule.matches
	maxRouteMatches   = 127 // "the total number of matches across all rules in a route must be less than 128"
	maxFilters        = 16  // HTTPRouteRule.filters, HTTPBackendRef.filters
	maxBackends       = 16  // HTTPRouteRule.backendRefs
	maxMatchConds     = 16  // HTTPRouteMatch.headers, .queryParams; GRPCRouteMatch.headers
	maxHeaderEdits    = 16  // HTTPHeaderFilter.set, .add, .remove
	maxCORSList       = 64  // HTTPCORSFilter.allowOrigins, .allowHeaders, .exposeHeaders
	maxCORSMethods    = 9   // HTTPCORSFilter.allowMethods
	maxRetryCodes     = 200 // HTTPRouteRetry.codes: a set of 400-599
	maxPathLen        = 1024
	maxHeaderValueLen = 4096
	maxQueryValueLen  = 1024
	maxWeight         = 1000000
	// maxUnsupported is what conversion can list for one rule: one per match (64), per filter of
	// the rule (16) and of its backendRefs (16 x 16), three for timeouts (each and the pair), three
	// for retry (attempts, codes, backoff), one for sessionPersistence and 22 for filter
	// combinations (incompatibleFilters).
	maxUnsupported = 64 + 16 + 16*16 + 3 + 3 + 1 + 22
	// maxMessageLen caps an unsupported entry and an invalid backend's message.
	maxMessageLen = 1024
	// maxDurationMs is the longest duration time.Duration holds, in milliseconds.
	maxDurationMs = math.MaxInt64 / int64(time.Millisecond)
)

var (
	// kindName is Gateway API Kind.
	kindName = regexp.MustCompile(`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`)
	// grpcService and grpcMethod are what an Exact GRPCMethodMatch may hold.
	grpcService = regexp.MustCompile(`^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$`)
	grpcMethod  = regexp.MustCompile(`^[A-Za-z_][A-Za-z_0-9]*$`)
)

// validHeaderName reports whether s is a Gateway API HeaderName (header and query parameter
// names): an HTTP token (httpToken) of at most 256 bytes.
func validHeaderName(s string) bool { return len(s) <= 256 && httpToken.MatchString(s) }

// httpMethods are Gateway API HTTPMethod values.
var httpMethods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}

var (
	routeKinds = map[RouteKind]registryv1.Route_Kind{
		KindHTTPRoute: registryv1.Route_KIND_HTTP, KindGRPCRoute: registryv1.Route_KIND_GRPC}
	parentKinds = map[ParentKind]registryv1.ParentRef_Kind{
		ParentService: registryv1.ParentRef_KIND_SERVICE, ParentServiceImport: registryv1.ParentRef_KIND_SERVICE_IMPORT}
	pathTypes = map[MatchType]registryv1.PathMatch_Type{
		MatchExact: registryv1.PathMatch_TYPE_EXACT, MatchPathPrefix: registryv1.PathMatch_TYPE_PATH_PREFIX,
		MatchRegex: registryv1.PathMatch_TYPE_REGULAR_EXPRESSION}
	stringMatchTypes = map[MatchType]registryv1.StringMatchType{
		MatchExact: registryv1.StringMatchType_STRING_MATCH_TYPE_EXACT,
		MatchRegex: registryv1.StringMatchType_STRING_MATCH_TYPE_REGULAR_EXPRESSION}
	pathModifierTypes = map[string]registryv1.PathModifier_Type{
		ReplaceFullPath:    registryv1.PathModifier_TYPE_REPLACE_FULL_PATH,
		ReplacePrefixMatch: registryv1.PathModifier_TYPE_REPLACE_PREFIX_MATCH}
)

// reverse returns m with keys and values swapped.
func reverse[K, V comparable](m map[K]V) map[V]K {
	out := make(map[V]K, len(m))
	for k, v := range m {
		out[v] = k
	}
	return out
}

var (
	routeKindsBack         = reverse(routeKinds)
	parentKindsBack        = reverse(parentKinds)
	pathTypesBack          = reverse(pathTypes)
	stringMatchTypesBack   = reverse(stringMatchTypes)
	pathModifierTypesBack  = reverse(pathModifierTypes)
	reasonInvalidKind      = string(gwv1.RouteReasonInvalidKind)
	redirectStatusCodes    = []uint32{301, 302, 303, 307, 308}
	redirectStatusCodeText = "want 301, 302, 303, 307 or 308"
)

// RouteToProto returns r as the registry's Route record (api/aether/registry/v1), the shape a
// ServiceConfigProjection carries: every field of r, with these choices:
//   - Created travels as RFC 3339 with nanoseconds in UTC ("" for the zero time);
//   - durations travel in milliseconds, a fraction of a millisecond rounded up (Gateway API
//     durations have millisecond resolution, GEP-2257), nil ones as absent;
//   - a backend's Invalid travels only when conversion found it (reason InvalidKind: another kind,
//     or Service / ServiceImport of another group), as KIND_OTHER; any other Invalid is
//     ResolveRoutes' verdict against one cluster's services, which every reader reaches for
//     itself, so route r should be the converted route, not ResolveRoutes' resolved copy.
//
// RouteToProto does not validate: a value outside what conversion makes (an unknown kind, a
// negative duration, an int out of the field's range) is carried as a value RouteFromProto
// refuses, never as a different valid one. For a route HTTPRouteModel or GRPCRouteModel made,
// RouteFromProto(RouteToProto(r)) equals r, with empty lists as nil and Created in UTC.
func RouteToProto(r Route) *registryv1.Route {
	p := &registryv1.Route{
		Kind: routeKinds[r.Kind], Namespace: r.Namespace, Name: r.Name, Generation: r.Generation,
	}
	if !r.Created.IsZero() {
		p.CreateTime = r.Created.UTC().Format(time.RFC3339Nano)
	}
	for _, pr := range r.Parents {
		p.ParentRefs = append(p.ParentRefs, &registryv1.ParentRef{
			Index: toInt32(pr.Index), Kind: parentKinds[pr.Kind], Service: serviceRefToProto(pr.Service),
			Port: pr.Port, SectionName: pr.SectionName,
		})
	}
	for _, rule := range r.Rules {
		p.Rules = append(p.Rules, ruleToProto(rule))
	}
	return p
}

// toInt32 is v, or -1 (which every int32 field refuses) when v does not fit.
func toInt32(v int) int32 {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return -1
	}
	return int32(v)
}

// toUint32 is v, or 0 (which every uint32 field it is used for refuses) when v does not fit.
func toUint32(v int) uint32 {
	if v < 0 || uint64(v) > math.MaxUint32 {
		return 0
	}
	return uint32(v)
}

// msCeil is d in milliseconds, rounded up; nil stays nil.
func msCeil(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	ms := int64(*d / time.Millisecond)
	if *d%time.Millisecond > 0 {
		ms++
	}
	return &ms
}

func serviceRefToProto(k ServiceKey) *registryv1.ServiceRef {
	return &registryv1.ServiceRef{Namespace: k.Namespace, Name: k.Name}
}

func ruleToProto(r RouteRule) *registryv1.RouteRule {
	p := &registryv1.RouteRule{Name: r.Name, Unsupported: slices.Clone(r.Unsupported), FailClosed: r.FailClosed, BadMatches: r.BadMatches}
	for _, m := range r.Matches {
		p.Matches = append(p.Matches, matchToProto(m))
	}
	for _, f := range r.Filters {
		p.Filters = append(p.Filters, filterToProto(f))
	}
	for _, b := range r.Backends {
		p.Backends = append(p.Backends, backendToProto(b))
	}
	if r.Timeouts.Request != nil || r.Timeouts.BackendRequest != nil {
		p.Timeouts = &registryv1.RouteTimeouts{RequestMs: msCeil(r.Timeouts.Request), BackendRequestMs: msCeil(r.Timeouts.BackendRequest)}
	}
	if rt := r.Retry; rt != nil {
		p.Retry = &registryv1.RetryPolicy{BackoffMs: msCeil(rt.Backoff)}
		if rt.Attempts != nil {
			a := int64(*rt.Attempts)
			p.Retry.Attempts = &a
		}
		for _, c := range rt.Codes {
			p.Retry.Codes = append(p.Retry.Codes, toUint32(c))
		}
	}
	return p
}

func matchToProto(m RouteMatch) *registryv1.RouteMatch {
	p := &registryv1.RouteMatch{Method: m.Method}
	if m.Path != (PathMatch{}) {
		p.Path = &registryv1.PathMatch{Type: pathTypes[m.Path.Type], Value: m.Path.Value}
	}
	for _, h := range m.Headers {
		p.Headers = append(p.Headers, &registryv1.HeaderMatch{Type: stringMatchTypes[h.Type], Name: h.Name, Value: h.Value})
	}
	for _, q := range m.Query {
		p.QueryParams = append(p.QueryParams, &registryv1.QueryParamMatch{Type: stringMatchTypes[q.Type], Name: q.Name, Value: q.Value})
	}
	if g := m.GRPC; g != nil {
		p.GrpcMethod = &registryv1.GRPCMethodMatch{Type: stringMatchTypes[g.Type], Service: g.Service, Method: g.Method}
	}
	return p
}

// filterToProto converts f by its Type; a filter whose Type is unknown or whose field for it is
// nil becomes an empty RouteFilter (refused by RouteFromProto).
func filterToProto(f RouteFilter) *registryv1.RouteFilter {
	p := &registryv1.RouteFilter{}
	switch {
	case f.Type == FilterRequestHeaderModifier && f.Headers != nil:
		p.Filter = &registryv1.RouteFilter_RequestHeaderModifier{RequestHeaderModifier: headerModifierToProto(f.Headers)}
	case f.Type == FilterResponseHeaderModifier && f.Headers != nil:
		p.Filter = &registryv1.RouteFilter_ResponseHeaderModifier{ResponseHeaderModifier: headerModifierToProto(f.Headers)}
	case f.Type == FilterRequestRedirect && f.Redirect != nil:
		d := f.Redirect
		p.Filter = &registryv1.RouteFilter_RequestRedirect{RequestRedirect: &registryv1.RequestRedirect{
			Scheme: d.Scheme, Hostname: d.Hostname, Path: pathModifierToProto(d.Path), Port: d.Port,
			StatusCode: toUint32(d.StatusCode),
		}}
	case f.Type == FilterURLRewrite && f.Rewrite != nil:
		p.Filter = &registryv1.RouteFilter_UrlRewrite{UrlRewrite: &registryv1.URLRewrite{
			Hostname: f.Rewrite.Hostname, Path: pathModifierToProto(f.Rewrite.Path)}}
	case f.Type == FilterRequestMirror && f.Mirror != nil:
		p.Filter = &registryv1.RouteFilter_RequestMirror{RequestMirror: &registryv1.RequestMirror{
			Backend: backendToProto(f.Mirror.Backend), Numerator: f.Mirror.Numerator, Denominator: f.Mirror.Denominator}}
	case f.Type == FilterCORS && f.CORS != nil:
		c := f.CORS
		p.Filter = &registryv1.RouteFilter_Cors{Cors: &registryv1.CORS{
			AllowOrigins: slices.Clone(c.AllowOrigins), AllowCredentials: c.AllowCredentials,
			AllowMethods: slices.Clone(c.AllowMethods), AllowHeaders: slices.Clone(c.AllowHeaders),
			ExposeHeaders: slices.Clone(c.ExposeHeaders), MaxAgeSeconds: c.MaxAge,
		}}
	}
	return p
}

func headerModifierToProto(h *HeaderModifier) *registryv1.HeaderModifier {
	p := &registryv1.HeaderModifier{Remove: slices.Clone(h.Remove)}
	for _, s := range h.Set {
		p.Set = append(p.Set, &registryv1.Header{Name: s.Name, Value: s.Value})
	}
	for _, a := range h.Add {
		p.Add = append(p.Add, &registryv1.Header{Name: a.Name, Value: a.Value})
	}
	return p
}

func pathModifierToProto(m *PathModifier) *registryv1.PathModifier {
	if m == nil {
		return nil
	}
	return &registryv1.PathModifier{Type: pathModifierTypes[m.Type], Value: m.Value}
}

// backendToProto converts b. A backend the conversion found unusable (Invalid with reason
// InvalidKind: another kind, or Service / ServiceImport of another group) becomes KIND_OTHER with
// its kind as written and that verdict; any other Invalid is ResolveRoutes' and is left out.
func backendToProto(b BackendRef) *registryv1.BackendRef {
	p := &registryv1.BackendRef{Service: serviceRefToProto(b.Service), Port: b.Port, Weight: b.Weight}
	switch {
	case b.Invalid != nil && b.Invalid.Reason == reasonInvalidKind,
		b.Kind != "" && b.Kind != BackendService && b.Kind != BackendServiceImport:
		p.Kind, p.OtherKind = registryv1.BackendRef_KIND_OTHER, string(b.Kind)
		if b.Invalid != nil {
			p.Invalid = &registryv1.BackendInvalid{Reason: b.Invalid.Reason, Message: b.Invalid.Message}
		}
	case b.Kind == BackendService:
		p.Kind = registryv1.BackendRef_KIND_SERVICE
	case b.Kind == BackendServiceImport:
		p.Kind = registryv1.BackendRef_KIND_SERVICE_IMPORT
	}
	for _, f := range b.Filters {
		p.Filters = append(p.Filters, filterToProto(f))
	}
	return p
}

// RouteFromProto turns a registry Route record back into a Route, checking every field: the
// kinds and enum values it knows (UNSPECIFIED and unknown numbers are refused), names (namespace
// an RFC 1123 label, name a subdomain; parent and backend names 1-253 characters without '/',
// spaces or control characters), ports 0-65535, weights 0-1000000, redirect codes 301, 302, 303,
// 307 and 308, mirror fractions 0 <= numerator <= denominator with denominator > 0, and every
// value the checks HTTPRouteModel applies refuse (validate.go: paths, regular expressions as
// Envoy's RE2 takes them and their program size, gRPC method matches, header names and values,
// header modifiers with each name once and neither host nor a pseudo-header, path modifiers,
// redirect schemes, CORS origins, backend_request_ms <= request_ms unless that is 0, retry
// attempts and codes), a header or query name matched once per match, durations >= 0, the
// Gateway API's list lengths, what each route kind allows (no path, query or method on a
// GRPCRoute, no gRPC method on an HTTPRoute, only header modifiers and mirrors on a GRPCRoute
// rule, only header modifiers on a backendRef), at least one match per rule unless bad_matches,
// and a backend's invalid set exactly on KIND_OTHER with reason InvalidKind. A retry backoff of
// 0 reads as 1 ms, as HTTPRouteModel makes it.
//
// The error is a *RouteFieldError naming the first refused field by its path in the record and
// its value (`rules[2].filters[0].request_redirect.status_code: invalid value "305": want 301,
// 302, 303, 307 or 308`); nothing is returned half-converted (the Route is zero on error).
// Empty lists come back nil, create_time in UTC.
func RouteFromProto(p *registryv1.Route) (Route, error) {
	if p == nil {
		return Route{}, routeFieldErr("route", "", "required")
	}
	kind, ok := routeKindsBack[p.GetKind()]
	if !ok {
		return Route{}, routeFieldErr("kind", p.GetKind().String(), "want KIND_HTTP or KIND_GRPC")
	}
	grpc := kind == KindGRPCRoute
	r := Route{RouteRef: RouteRef{Kind: kind, Namespace: p.GetNamespace(), Name: p.GetName()}, Generation: p.GetGeneration()}
	if err := validDNSLabel("namespace", r.Namespace); err != nil {
		return Route{}, err
	}
	if len(validation.IsDNS1123Subdomain(r.Name)) > 0 {
		return Route{}, routeFieldErr("name", r.Name, "want an RFC 1123 DNS subdomain (the route's metadata.name)")
	}
	if r.Generation < 0 {
		return Route{}, routeFieldErr("generation", strconv.FormatInt(r.Generation, 10), "want >= 0")
	}
	if s := p.GetCreateTime(); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return Route{}, routeFieldErr("create_time", s, "want an RFC 3339 time, e.g. 2026-01-02T15:04:05.123456789Z, or empty")
		}
		r.Created = t.UTC()
	}
	if n := len(p.GetParentRefs()); n > maxParentRefs {
		return Route{}, routeTooMany("parent_refs", n, maxParentRefs)
	}
	for i, pp := range p.GetParentRefs() {
		f := fmt.Sprintf("parent_refs[%d]", i)
		pr, err := parentFromProto(pp, f)
		if err != nil {
			return Route{}, err
		}
		if i > 0 && pr.Index <= r.Parents[i-1].Index {
			return Route{}, routeFieldErr(f+".index", strconv.Itoa(pr.Index), "want indexes strictly increasing (spec.parentRefs order)")
		}
		r.Parents = append(r.Parents, pr)
	}
	if n := len(p.GetRules()); n > maxRules {
		return Route{}, routeTooMany("rules", n, maxRules)
	}
	total := 0
	for i, pr := range p.GetRules() {
		rule, err := ruleFromProto(pr, fmt.Sprintf("rules[%d]", i), grpc)
		if err != nil {
			return Route{}, err
		}
		if total += len(rule.Matches); total > maxRouteMatches {
			return Route{}, routeFieldErr(fmt.Sprintf("rules[%d].matches", i), strconv.Itoa(total)+" matches in the route",
				fmt.Sprintf("want at most %d across all rules (Gateway API)", maxRouteMatches))
		}
		r.Rules = append(r.Rules, rule)
	}
	return r, nil
}

func routeTooMany(field string, n, limit int) *RouteFieldError {
	return routeFieldErr(field, strconv.Itoa(n)+" items", fmt.Sprintf("want at most %d (Gateway API)", limit))
}

func validDNSLabel(field, s string) error {
	if len(validation.IsDNS1123Label(s)) > 0 {
		return routeFieldErr(field, s, "want an RFC 1123 DNS label (a-z, 0-9, '-', at most 63 characters)")
	}
	return nil
}

// validObjectName checks a Gateway API ObjectName (1-253 characters); '/', spaces and control
// characters, which no Kubernetes object name holds, are refused too.
func validObjectName(field, s string) error {
	if s == "" || len(s) > 253 || strings.ContainsFunc(s, func(c rune) bool { return c <= ' ' || c == 0x7f || c == '/' }) {
		return routeFieldErr(field, s, "want an object name: 1-253 characters, no '/', spaces or control characters")
	}
	return nil
}

func serviceRefFromProto(p *registryv1.ServiceRef, f string) (ServiceKey, error) {
	if p == nil {
		return ServiceKey{}, routeFieldErr(f, "", "required")
	}
	if err := validDNSLabel(f+".namespace", p.GetNamespace()); err != nil {
		return ServiceKey{}, err
	}
	if err := validObjectName(f+".name", p.GetName()); err != nil {
		return ServiceKey{}, err
	}
	return ServiceKey{Namespace: p.GetNamespace(), Name: p.GetName()}, nil
}

func validPort(field string, p uint32) error {
	if p > 65535 {
		return routeFieldErr(field, strconv.FormatUint(uint64(p), 10), "want 1-65535, or 0 when unset")
	}
	return nil
}

// validSectionName checks a Gateway API SectionName or rule name (a DNS subdomain), "" when unset.
func validSectionName(field, s string) error {
	if s != "" && len(validation.IsDNS1123Subdomain(s)) > 0 {
		return routeFieldErr(field, s, "want an RFC 1123 DNS subdomain, or empty")
	}
	return nil
}

func parentFromProto(p *registryv1.ParentRef, f string) (ParentRef, error) {
	kind, ok := parentKindsBack[p.GetKind()]
	if !ok {
		return ParentRef{}, routeFieldErr(f+".kind", p.GetKind().String(), "want KIND_SERVICE or KIND_SERVICE_IMPORT")
	}
	if i := p.GetIndex(); i < 0 || i >= maxParentRefs {
		return ParentRef{}, routeFieldErr(f+".index", strconv.Itoa(int(i)), fmt.Sprintf("want 0-%d (a spec.parentRefs index)", maxParentRefs-1))
	}
	svc, err := serviceRefFromProto(p.GetService(), f+".service")
	if err != nil {
		return ParentRef{}, err
	}
	if err := validPort(f+".port", p.GetPort()); err != nil {
		return ParentRef{}, err
	}
	if err := validSectionName(f+".section_name", p.GetSectionName()); err != nil {
		return ParentRef{}, err
	}
	return ParentRef{Index: int(p.GetIndex()), Kind: kind, Service: svc, Port: p.GetPort(), SectionName: p.GetSectionName()}, nil
}

func ruleFromProto(p *registryv1.RouteRule, f string, grpc bool) (RouteRule, error) {
	r := RouteRule{Name: p.GetName()}
	if err := validSectionName(f+".name", r.Name); err != nil {
		return RouteRule{}, err
	}
	switch n := len(p.GetMatches()); {
	case n == 0 && !p.GetBadMatches():
		return RouteRule{}, routeFieldErr(f+".matches", "0 items", "want at least one (the default match is written out), unless bad_matches")
	case n > maxMatches:
		return RouteRule{}, routeTooMany(f+".matches", n, maxMatches)
	}
	for i, pm := range p.GetMatches() {
		m, err := matchFromProto(pm, fmt.Sprintf("%s.matches[%d]", f, i), grpc)
		if err != nil {
			return RouteRule{}, err
		}
		r.Matches = append(r.Matches, m)
	}
	allowed := ruleFilters
	if grpc {
		allowed = grpcRuleFilters
	}
	var err error
	if r.Filters, err = filtersFromProto(p.GetFilters(), f+".filters", allowed); err != nil {
		return RouteRule{}, err
	}
	if n := len(p.GetBackends()); n > maxBackends {
		return RouteRule{}, routeTooMany(f+".backends", n, maxBackends)
	}
	for i, pb := range p.GetBackends() {
		b, err := backendFromProto(pb, fmt.Sprintf("%s.backends[%d]", f, i), true)
		if err != nil {
			return RouteRule{}, err
		}
		r.Backends = append(r.Backends, b)
	}
	if t := p.GetTimeouts(); t != nil {
		if r.Timeouts.Request, err = durationFromProto(t.RequestMs, f+".timeouts.request_ms"); err != nil {
			return RouteRule{}, err
		}
		if r.Timeouts.BackendRequest, err = durationFromProto(t.BackendRequestMs, f+".timeouts.backend_request_ms"); err != nil {
			return RouteRule{}, err
		}
		if why := timeoutsReason(r.Timeouts.Request, r.Timeouts.BackendRequest); why != "" {
			return RouteRule{}, routeFieldErr(f+".timeouts.backend_request_ms", strconv.FormatInt(t.GetBackendRequestMs(), 10), why)
		}
	}
	if rt := p.GetRetry(); rt != nil {
		if r.Retry, err = retryFromProto(rt, f+".retry"); err != nil {
			return RouteRule{}, err
		}
	}
	if n := len(p.GetUnsupported()); n > maxUnsupported {
		return RouteRule{}, routeTooMany(f+".unsupported", n, maxUnsupported)
	}
	for i, u := range p.GetUnsupported() {
		if err := validMessage(fmt.Sprintf("%s.unsupported[%d]", f, i), u); err != nil {
			return RouteRule{}, err
		}
	}
	r.Unsupported = slices.Clone(p.GetUnsupported())
	r.FailClosed, r.BadMatches = p.GetFailClosed(), p.GetBadMatches()
	return r, nil
}

// validMessage checks a human-readable text carried from the origin: 1-1024 bytes, no control
// characters.
func validMessage(field, s string) error {
	if s == "" || len(s) > maxMessageLen || strings.ContainsFunc(s, func(c rune) bool { return c < ' ' || c == 0x7f }) {
		return routeFieldErr(field, s, "want 1-1024 bytes of text without control characters")
	}
	return nil
}

func durationFromProto(ms *int64, f string) (*time.Duration, error) {
	if ms == nil {
		return nil, nil
	}
	if *ms < 0 || *ms > maxDurationMs {
		return nil, routeFieldErr(f, strconv.FormatInt(*ms, 10), fmt.Sprintf("want 0-%d milliseconds", maxDurationMs))
	}
	d := time.Duration(*ms) * time.Millisecond
	return &d, nil
}

// retryFromProto converts a retry policy; a backoff of 0 becomes minRetryBackoff, as
// HTTPRouteModel makes it.
func retryFromProto(p *registryv1.RetryPolicy, f string) (*RouteRetry, error) {
	rt := &RouteRetry{}
	codes := make([]int, len(p.GetCodes()))
	for i, c := range p.GetCodes() {
		codes[i] = int(min(c, math.MaxInt32))
	}
	if bad := checkRetry(p.Attempts, codes); bad != nil {
		return nil, bad.under(f).err()
	}
	if p.Attempts != nil {
		n := int(p.GetAttempts())
		rt.Attempts = &n
	}
	if len(codes) > 0 {
		rt.Codes = codes
	}
	var err error
	if rt.Backoff, err = durationFromProto(p.BackoffMs, f+".backoff_ms"); err != nil {
		return nil, err
	}
	rt.Backoff = retryBackoff(rt.Backoff)
	return rt, nil
}

func matchFromProto(p *registryv1.RouteMatch, f string, grpc bool) (RouteMatch, error) {
	var m RouteMatch
	switch pp := p.GetPath(); {
	case grpc && pp != nil:
		return RouteMatch{}, routeFieldErr(f+".path", pp.GetValue(), "a GRPCRoute match has no path (it matches grpc_method)")
	case !grpc && pp == nil:
		return RouteMatch{}, routeFieldErr(f+".path", "", "required on an HTTPRoute match (the default PathPrefix / is written out)")
	case pp != nil:
		t, ok := pathTypesBack[pp.GetType()]
		if !ok {
			return RouteMatch{}, routeFieldErr(f+".path.type", pp.GetType().String(), "want TYPE_EXACT, TYPE_PATH_PREFIX or TYPE_REGULAR_EXPRESSION")
		}
		if bad := checkPathMatch(t, pp.GetValue()); bad != nil {
			return RouteMatch{}, bad.under(f + ".path").err()
		}
		m.Path = PathMatch{Type: t, Value: pp.GetValue()}
	}
	if n := len(p.GetHeaders()); n > maxMatchConds {
		return RouteMatch{}, routeTooMany(f+".headers", n, maxMatchConds)
	}
	for i, h := range p.GetHeaders() {
		hf := fmt.Sprintf("%s.headers[%d]", f, i)
		sm, err := stringMatchFromProto(h.GetType(), h.GetName(), h.GetValue(), hf, true, maxHeaderValueLen)
		if err != nil {
			return RouteMatch{}, err
		}
		if slices.ContainsFunc(m.Headers, func(o StringMatch) bool { return o.Name == sm.Name }) {
			return RouteMatch{}, routeFieldErr(hf+".name", sm.Name, "given twice: each name once (the first of equivalent names counts)")
		}
		m.Headers = append(m.Headers, sm)
	}
	if n := len(p.GetQueryParams()); n > maxMatchConds {
		return RouteMatch{}, routeTooMany(f+".query_params", n, maxMatchConds)
	}
	for i, q := range p.GetQueryParams() {
		qf := fmt.Sprintf("%s.query_params[%d]", f, i)
		if grpc {
			return RouteMatch{}, routeFieldErr(qf+".name", q.GetName(), "a GRPCRoute match has no query parameters")
		}
		sm, err := stringMatchFromProto(q.GetType(), q.GetName(), q.GetValue(), qf, false, maxQueryValueLen)
		if err != nil {
			return RouteMatch{}, err
		}
		if slices.ContainsFunc(m.Query, func(o StringMatch) bool { return o.Name == sm.Name }) {
			return RouteMatch{}, routeFieldErr(qf+".name", sm.Name, "given twice: each name once (the first counts)")
		}
		m.Query = append(m.Query, sm)
	}
	if m.Method = p.GetMethod(); m.Method != "" && (grpc || methodReason(m.Method) != "") {
		return RouteMatch{}, routeFieldErr(f+".method", m.Method, "want GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE or PATCH, on an HTTPRoute only")
	}
	if g := p.GetGrpcMethod(); g != nil {
		gm, err := grpcMatchFromProto(g, f+".grpc_method", grpc)
		if err != nil {
			return RouteMatch{}, err
		}
		m.GRPC = gm
	}
	return m, nil
}

// validLowerHeaderName checks a header name the model keeps in lower case.
func validLowerHeaderName(f, n string) error {
	if !validHeaderName(n) || strings.ToLower(n) != n {
		return routeFieldErr(f, n, "want an HTTP header name in lower case")
	}
	return nil
}

func stringMatchFromProto(t registryv1.StringMatchType, name, value, f string, lower bool, maxLen int) (StringMatch, error) {
	mt, ok := stringMatchTypesBack[t]
	if !ok {
		return StringMatch{}, routeFieldErr(f+".type", t.String(), "want STRING_MATCH_TYPE_EXACT or STRING_MATCH_TYPE_REGULAR_EXPRESSION")
	}
	if lower {
		if err := validLowerHeaderName(f+".name", name); err != nil {
			return StringMatch{}, err
		}
	} else if !validHeaderName(name) {
		return StringMatch{}, routeFieldErr(f+".name", name, "want a query parameter name (Gateway API HeaderName)")
	}
	if bad := checkStringMatch(mt, value, maxLen); bad != nil {
		return StringMatch{}, bad.under(f).err()
	}
	return StringMatch{Type: mt, Name: name, Value: value}, nil
}

func grpcMatchFromProto(p *registryv1.GRPCMethodMatch, f string, grpc bool) (*GRPCMethodMatch, error) {
	if !grpc {
		return nil, routeFieldErr(f, p.GetService()+"/"+p.GetMethod(), "only a GRPCRoute matches grpc_method")
	}
	mt, ok := stringMatchTypesBack[p.GetType()]
	if !ok {
		return nil, routeFieldErr(f+".type", p.GetType().String(), "want STRING_MATCH_TYPE_EXACT or STRING_MATCH_TYPE_REGULAR_EXPRESSION")
	}
	g := &GRPCMethodMatch{Type: mt, Service: p.GetService(), Method: p.GetMethod()}
	if bad := checkGRPCMethod(*g); bad != nil {
		return nil, bad.under(f).err()
	}
	return g, nil
}

// The filter types a rule, a GRPCRoute rule and a backendRef take.
var (
	ruleFilters     = []FilterType{FilterRequestHeaderModifier, FilterResponseHeaderModifier, FilterRequestRedirect, FilterURLRewrite, FilterRequestMirror, FilterCORS}
	grpcRuleFilters = []FilterType{FilterRequestHeaderModifier, FilterResponseHeaderModifier, FilterRequestMirror}
	backendFilters  = []FilterType{FilterRequestHeaderModifier, FilterResponseHeaderModifier}
)

func filtersFromProto(ps []*registryv1.RouteFilter, f string, allowed []FilterType) ([]RouteFilter, error) {
	if len(ps) > maxFilters {
		return nil, routeTooMany(f, len(ps), maxFilters)
	}
	var out []RouteFilter
	for i, p := range ps {
		fl, err := filterFromProto(p, fmt.Sprintf("%s[%d]", f, i), allowed)
		if err != nil {
			return nil, err
		}
		out = append(out, fl)
	}
	return out, nil
}

// filterFromProto converts one filter whose type is in allowed. The type is checked before the
// filter's settings, so a mirror's backendRef (which allows none) ends any nesting.
func filterFromProto(p *registryv1.RouteFilter, f string, allowed []FilterType) (RouteFilter, error) {
	var t FilterType
	var field string
	switch p.GetFilter().(type) {
	case *registryv1.RouteFilter_RequestHeaderModifier:
		t, field = FilterRequestHeaderModifier, f+".request_header_modifier"
	case *registryv1.RouteFilter_ResponseHeaderModifier:
		t, field = FilterResponseHeaderModifier, f+".response_header_modifier"
	case *registryv1.RouteFilter_RequestRedirect:
		t, field = FilterRequestRedirect, f+".request_redirect"
	case *registryv1.RouteFilter_UrlRewrite:
		t, field = FilterURLRewrite, f+".url_rewrite"
	case *registryv1.RouteFilter_RequestMirror:
		t, field = FilterRequestMirror, f+".request_mirror"
	case *registryv1.RouteFilter_Cors:
		t, field = FilterCORS, f+".cors"
	default:
		return RouteFilter{}, routeFieldErr(f, "", "want exactly one filter")
	}
	switch {
	case len(allowed) == 0:
		return RouteFilter{}, routeFieldErr(field, string(t), "a mirror's backendRef has no filters")
	case !slices.Contains(allowed, t):
		return RouteFilter{}, routeFieldErr(field, string(t), fmt.Sprintf("not allowed here (allowed: %v)", allowed))
	}
	out := RouteFilter{Type: t}
	var err error
	switch t {
	case FilterRequestHeaderModifier:
		out.Headers, err = headerModifierFromProto(p.GetRequestHeaderModifier(), field)
	case FilterResponseHeaderModifier:
		out.Headers, err = headerModifierFromProto(p.GetResponseHeaderModifier(), field)
	case FilterRequestRedirect:
		out.Redirect, err = redirectFromProto(p.GetRequestRedirect(), field)
	case FilterURLRewrite:
		out.Rewrite, err = rewriteFromProto(p.GetUrlRewrite(), field)
	case FilterRequestMirror:
		out.Mirror, err = mirrorFromProto(p.GetRequestMirror(), field)
	case FilterCORS:
		out.CORS, err = corsFromProto(p.GetCors(), field)
	}
	if err != nil {
		return RouteFilter{}, err
	}
	return out, nil
}

// headerModifierFromProto converts a header modifier, checked as checkHeaderEdits says (each
// name once).
func headerModifierFromProto(p *registryv1.HeaderModifier, f string) (*HeaderModifier, error) {
	out := &HeaderModifier{Remove: slices.Clone(p.GetRemove())}
	for _, h := range p.GetSet() {
		out.Set = append(out.Set, Header{Name: h.GetName(), Value: h.GetValue()})
	}
	for _, h := range p.GetAdd() {
		out.Add = append(out.Add, Header{Name: h.GetName(), Value: h.GetValue()})
	}
	if bad := checkHeaderEdits(out, false); bad != nil {
		return nil, bad.under(f).err()
	}
	return out, nil
}

func pathModifierFromProto(p *registryv1.PathModifier, f string) (*PathModifier, error) {
	if p == nil {
		return nil, nil
	}
	t, ok := pathModifierTypesBack[p.GetType()]
	if !ok {
		return nil, routeFieldErr(f+".type", p.GetType().String(), "want TYPE_REPLACE_FULL_PATH or TYPE_REPLACE_PREFIX_MATCH")
	}
	v := p.GetValue()
	if why := pathModifierReason(v); why != "" {
		return nil, routeFieldErr(f+".value", v, why)
	}
	return &PathModifier{Type: t, Value: v}, nil
}

func redirectFromProto(p *registryv1.RequestRedirect, f string) (*Redirect, error) {
	if why := schemeReason(p.GetScheme()); why != "" {
		return nil, routeFieldErr(f+".scheme", p.GetScheme(), why+", or empty")
	}
	if why := hostnameReason(p.GetHostname()); why != "" {
		return nil, routeFieldErr(f+".hostname", p.GetHostname(), why)
	}
	path, err := pathModifierFromProto(p.GetPath(), f+".path")
	if err != nil {
		return nil, err
	}
	if err := validPort(f+".port", p.GetPort()); err != nil {
		return nil, err
	}
	if c := p.GetStatusCode(); !slices.Contains(redirectStatusCodes, c) {
		return nil, routeFieldErr(f+".status_code", strconv.FormatUint(uint64(c), 10), redirectStatusCodeText)
	}
	return &Redirect{Scheme: p.GetScheme(), Hostname: p.GetHostname(), Path: path, Port: p.GetPort(), StatusCode: int(p.GetStatusCode())}, nil
}

func rewriteFromProto(p *registryv1.URLRewrite, f string) (*Rewrite, error) {
	if why := hostnameReason(p.GetHostname()); why != "" {
		return nil, routeFieldErr(f+".hostname", p.GetHostname(), why)
	}
	path, err := pathModifierFromProto(p.GetPath(), f+".path")
	if err != nil {
		return nil, err
	}
	return &Rewrite{Hostname: p.GetHostname(), Path: path}, nil
}

func mirrorFromProto(p *registryv1.RequestMirror, f string) (*Mirror, error) {
	if p.GetBackend() == nil {
		return nil, routeFieldErr(f+".backend", "", "required")
	}
	b, err := backendFromProto(p.GetBackend(), f+".backend", false)
	if err != nil {
		return nil, err
	}
	n, d := p.GetNumerator(), p.GetDenominator()
	if d <= 0 {
		return nil, routeFieldErr(f+".denominator", strconv.Itoa(int(d)), "want > 0")
	}
	if n < 0 || n > d {
		return nil, routeFieldErr(f+".numerator", strconv.Itoa(int(n)), fmt.Sprintf("want 0-%d (at most the denominator)", d))
	}
	return &Mirror{Backend: b, Numerator: n, Denominator: d}, nil
}

func corsFromProto(p *registryv1.CORS, f string) (*CORS, error) {
	c := &CORS{AllowCredentials: p.GetAllowCredentials(), MaxAge: p.GetMaxAgeSeconds()}
	for _, l := range []struct {
		name  string
		vs    []string
		max   int
		valid func(string) bool
		to    *[]string
	}{
		{"allow_origins", p.GetAllowOrigins(), maxCORSList, func(s string) bool { return corsOriginReason(s) == "" }, &c.AllowOrigins},
		{"allow_methods", p.GetAllowMethods(), maxCORSMethods, func(s string) bool { return s == "*" || (s != "" && methodReason(s) == "") }, &c.AllowMethods},
		{"allow_headers", p.GetAllowHeaders(), maxCORSList, validHeaderName, &c.AllowHeaders},
		{"expose_headers", p.GetExposeHeaders(), maxCORSList, validHeaderName, &c.ExposeHeaders},
	} {
		if len(l.vs) > l.max {
			return nil, routeTooMany(f+"."+l.name, len(l.vs), l.max)
		}
		for i, v := range l.vs {
			if !l.valid(v) {
				why := "want a value HTTPCORSFilter allows (GEP-1767)"
				if l.name == "allow_origins" {
					why = corsOriginReason(v)
				}
				return nil, routeFieldErr(fmt.Sprintf("%s.%s[%d]", f, l.name, i), v, why)
			}
			if v == "*" && len(l.vs) > 1 && l.name != "expose_headers" {
				return nil, routeFieldErr(fmt.Sprintf("%s.%s[%d]", f, l.name, i), v, "'*' must be the only entry")
			}
		}
		*l.to = slices.Clone(l.vs)
	}
	if c.MaxAge < 1 {
		return nil, routeFieldErr(f+".max_age_seconds", strconv.Itoa(int(c.MaxAge)), "want >= 1 (the default 5 is written out)")
	}
	return c, nil
}

// backendFromProto converts a backendRef; withFilters is false for a mirror's, which has none.
func backendFromProto(p *registryv1.BackendRef, f string, withFilters bool) (BackendRef, error) {
	var b BackendRef
	switch p.GetKind() {
	case registryv1.BackendRef_KIND_SERVICE:
		b.Kind = BackendService
	case registryv1.BackendRef_KIND_SERVICE_IMPORT:
		b.Kind = BackendServiceImport
	case registryv1.BackendRef_KIND_OTHER:
		if !kindName.MatchString(p.GetOtherKind()) || len(p.GetOtherKind()) > 63 {
			return BackendRef{}, routeFieldErr(f+".other_kind", p.GetOtherKind(), "want a Kubernetes kind name (Gateway API Kind)")
		}
		b.Kind = BackendKind(p.GetOtherKind())
	default:
		return BackendRef{}, routeFieldErr(f+".kind", p.GetKind().String(), "want KIND_SERVICE, KIND_SERVICE_IMPORT or KIND_OTHER")
	}
	other := p.GetKind() == registryv1.BackendRef_KIND_OTHER
	if !other && p.GetOtherKind() != "" {
		return BackendRef{}, routeFieldErr(f+".other_kind", p.GetOtherKind(), "only with KIND_OTHER")
	}
	switch inv := p.GetInvalid(); {
	case other && inv == nil:
		return BackendRef{}, routeFieldErr(f+".invalid", "", "required with KIND_OTHER")
	case !other && inv != nil:
		return BackendRef{}, routeFieldErr(f+".invalid", inv.GetReason(), "only with KIND_OTHER (resolution against a cluster's services is each reader's own)")
	case other:
		if inv.GetReason() != reasonInvalidKind {
			return BackendRef{}, routeFieldErr(f+".invalid.reason", inv.GetReason(), "want "+reasonInvalidKind)
		}
		if err := validMessage(f+".invalid.message", inv.GetMessage()); err != nil {
			return BackendRef{}, err
		}
		b.Invalid = &Condition{Reason: inv.GetReason(), Message: inv.GetMessage()}
	}
	var err error
	if b.Service, err = serviceRefFromProto(p.GetService(), f+".service"); err != nil {
		return BackendRef{}, err
	}
	if err := validPort(f+".port", p.GetPort()); err != nil {
		return BackendRef{}, err
	}
	b.Port = p.GetPort()
	if w := p.GetWeight(); w < 0 || w > maxWeight {
		return BackendRef{}, routeFieldErr(f+".weight", strconv.Itoa(int(w)), "want 0-1000000 (Gateway API)")
	}
	b.Weight = p.GetWeight()
	allowed := backendFilters
	if !withFilters {
		allowed = nil
	}
	if b.Filters, err = filtersFromProto(p.GetFilters(), f+".filters", allowed); err != nil {
		return BackendRef{}, err
	}
	return b, nil
}
