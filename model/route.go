package model

import (
	"cmp"
	"time"
)

// RouteKind is the kind of a Gateway API route object the mesh serves.
type RouteKind string

// The route kinds GAMMA routing serves (docs/routing.md).
const (
	KindHTTPRoute RouteKind = "HTTPRoute"
	KindGRPCRoute RouteKind = "GRPCRoute"
)

// RouteRef names a route object.
type RouteRef struct {
	Kind      RouteKind
	Namespace string
	Name      string
	// Origin is the cluster a route imported from a ServiceConfigProjection comes from
	// (ImportRoutes); "" for this cluster's own routes.
	Origin string `json:",omitempty"`
}

// String returns "<kind> <namespace>/<name>", with " from cluster <origin>" for an imported
// route.
func (r RouteRef) String() string {
	s := string(r.Kind) + " " + r.Namespace + "/" + r.Name
	if r.Origin != "" {
		s += " from cluster " + r.Origin
	}
	return s
}

// Compare orders route references by kind, namespace, name, then origin ("" first).
func (r RouteRef) Compare(o RouteRef) int {
	return cmp.Or(cmp.Compare(r.Kind, o.Kind), cmp.Compare(r.Namespace, o.Namespace), cmp.Compare(r.Name, o.Name), cmp.Compare(r.Origin, o.Origin))
}

// Route is one HTTPRoute or GRPCRoute as the mesh uses it (Gateway API v1.6.3), with its defaults
// applied: a plain value with no Kubernetes types, which the xDS builder consumes and the
// registry's ServiceConfigProjection carries (api/aether/registry/v1 Route). HTTPRouteModel and
// GRPCRouteModel make one from the Kubernetes object; ResolveRoutes binds routes to services.
type Route struct {
	RouteRef
	// Generation is metadata.generation, the observedGeneration of the status written for it.
	Generation int64
	// Created is metadata.creationTimestamp: the older route wins a precedence tie.
	Created time.Time
	// Parents are the route's mesh parentRefs (kind Service or ServiceImport); a parentRef of any
	// other kind (a Gateway) is not the mesh's and is not listed.
	Parents []ParentRef
	// GatewayParents are the route's parentRefs of kind Gateway (edge Gateways,
	// docs/gateway.md); ResolveRoutes ignores them, ResolveGateways binds them.
	GatewayParents []GatewayParentRef
	// Hostnames are spec.hostnames (HTTPRoute, GRPCRoute, TLSRoute), lower case; GAMMA does not
	// interpret them (GEP-1294), Gateway listeners intersect them with their own.
	Hostnames []string
	Rules     []RouteRule
}

// ParentKind is the kind of a mesh parentRef.
type ParentKind string

// The mesh parent kinds (GEP-1294: Service, core group; GEP-1748: ServiceImport, group
// multicluster.x-k8s.io).
const (
	ParentService       ParentKind = "Service"
	ParentServiceImport ParentKind = "ServiceImport"
)

// ParentRef is one mesh parentRef of a route.
type ParentRef struct {
	// Index is the parentRef's index in spec.parentRefs (its status entry echoes that entry).
	Index int
	Kind  ParentKind
	// Service is the parent (its namespace defaults to the route's).
	Service ServiceKey
	// Port is parentRef.port, 0 when unset (every port of the Service).
	Port uint32
	// SectionName is parentRef.sectionName, a Service port name ("" when unset).
	SectionName string
}

// MatchType is how a match compares a value: Gateway API PathMatchType, HeaderMatchType,
// QueryParamMatchType and GRPCMethodMatchType values.
type MatchType string

// Match types.
const (
	MatchExact      MatchType = "Exact"
	MatchPathPrefix MatchType = "PathPrefix"
	MatchRegex      MatchType = "RegularExpression"
)

// RouteRule is one entry of spec.rules.
type RouteRule struct {
	// Name is the rule's name ("" when unset).
	Name string
	// Matches are the rule's matches, any of which selects the rule; never empty (a rule without
	// matches gets the default one: PathPrefix "/" for HTTPRoute, every request for GRPCRoute),
	// except when BadMatches: a match that cannot be built is left out (its reason is in
	// Unsupported).
	Matches []RouteMatch
	// Filters are the rule's filters in order.
	Filters []RouteFilter
	// Backends are the rule's backendRefs (may be empty: a redirect needs none).
	Backends []BackendRef
	Timeouts RouteTimeouts
	// Retry is HTTPRouteRetry; nil when unset.
	Retry *RouteRetry
	// Unsupported lists what the rule asks for that aether does not do, one "<field>: <reason>"
	// each; a rule with any is not served and the route reports it (PartiallyInvalid, or
	// Accepted=False when no rule is left), unless FailClosed.
	Unsupported []string
	// FailClosed is set when the rule (or one of its backendRefs) has a filter aether cannot
	// apply that must not be skipped: an ExtensionRef or ExternalAuth filter
	// (HTTPRouteFilter.type: "the filter MUST NOT be skipped. Instead, requests that would have
	// been processed by that filter MUST receive a HTTP error response"). Such a rule is bound
	// and every request its Matches match is answered with an error (HTTP 500, gRPC
	// UNAVAILABLE) rather than falling through to other rules; a match that could not be built
	// (BadMatches) is not among them.
	FailClosed bool
	// BadMatches is set when a match of the rule cannot be built (its reason is in
	// Unsupported, the match is not in Matches).
	BadMatches bool
}

// Served reports how a rule is served: as written (no Unsupported), as an error response to
// every request its Matches match (FailClosed, with a match left), or not at all.
func (r *RouteRule) Served() (served, asError bool) {
	switch {
	case len(r.Unsupported) == 0:
		return true, false
	case r.FailClosed && len(r.Matches) > 0:
		return true, true
	}
	return false, false
}

// RouteMatch is one HTTPRouteMatch or GRPCRouteMatch; every condition set must hold.
type RouteMatch struct {
	// Path is the HTTPRoute path match (PathPrefix "/" by default); zero for a GRPCRoute.
	Path PathMatch
	// Headers are header matches, names in lower case, the first of each name only (the spec
	// ignores later entries of an equivalent name).
	Headers []StringMatch
	// Query are query parameter matches (names compared exactly), the first of each name only.
	Query []StringMatch
	// Method is the HTTP method, "" for any.
	Method string
	// GRPC is the GRPCRoute method match; nil matches every method.
	GRPC *GRPCMethodMatch
}

// PathMatch is HTTPPathMatch: Exact, PathPrefix (path elements; a trailing "/" is ignored) or
// RegularExpression (RE2).
type PathMatch struct {
	Type  MatchType
	Value string
}

// StringMatch is a header or query parameter match.
type StringMatch struct {
	Type  MatchType
	Name  string
	Value string
}

// GRPCMethodMatch is GRPCMethodMatch: Service and/or Method ("" for any), Exact or
// RegularExpression.
type GRPCMethodMatch struct {
	Type    MatchType
	Service string
	Method  string
}

// FilterType is a Gateway API HTTPRouteFilterType or GRPCRouteFilterType value.
type FilterType string

// Filter types aether serves.
const (
	FilterRequestHeaderModifier  FilterType = "RequestHeaderModifier"
	FilterResponseHeaderModifier FilterType = "ResponseHeaderModifier"
	FilterRequestRedirect        FilterType = "RequestRedirect"
	FilterURLRewrite             FilterType = "URLRewrite"
	FilterRequestMirror          FilterType = "RequestMirror"
	FilterCORS                   FilterType = "CORS"
)

// RouteFilter is one HTTPRouteFilter or GRPCRouteFilter: Type and the one field it uses.
type RouteFilter struct {
	Type FilterType
	// Headers is the RequestHeaderModifier or ResponseHeaderModifier.
	Headers  *HeaderModifier
	Redirect *Redirect
	Rewrite  *Rewrite
	Mirror   *Mirror
	CORS     *CORS
}

// HeaderModifier is HTTPHeaderFilter: header names in lower case.
type HeaderModifier struct {
	Set    []Header
	Add    []Header
	Remove []string
}

// Header is a header name and value.
type Header struct {
	Name  string
	Value string
}

// Path modifier types (HTTPPathModifierType).
const (
	ReplaceFullPath    = "ReplaceFullPath"
	ReplacePrefixMatch = "ReplacePrefixMatch"
)

// PathModifier is HTTPPathModifier.
type PathModifier struct {
	// Type is ReplaceFullPath or ReplacePrefixMatch.
	Type  string
	Value string
}

// Redirect is HTTPRequestRedirectFilter.
type Redirect struct {
	// Scheme is "http", "https" or "" (the request's).
	Scheme string
	// Hostname replaces the Host ("" keeps it).
	Hostname string
	Path     *PathModifier
	// Port is the redirect's port, 0 when unset.
	Port uint32
	// StatusCode is 301, 302, 303, 307 or 308 (default 302).
	StatusCode int
}

// Rewrite is HTTPURLRewriteFilter.
type Rewrite struct {
	// Hostname replaces the Host header ("" keeps it).
	Hostname string
	Path     *PathModifier
}

// Mirror is HTTPRequestMirrorFilter: the share of requests mirrored is Numerator/Denominator
// (from percent or fraction; 100/100 when neither is set).
type Mirror struct {
	Backend     BackendRef
	Numerator   int32
	Denominator int32
}

// CORS is HTTPCORSFilter (GEP-1767).
type CORS struct {
	AllowOrigins     []string
	AllowCredentials bool
	AllowMethods     []string
	AllowHeaders     []string
	ExposeHeaders    []string
	// MaxAge is how long a preflight answer may be cached, in seconds (default 5).
	MaxAge int32
}

// BackendKind is the kind of a backendRef.
type BackendKind string

// Backend kinds: a Service (its endpoints in this cluster) or a ServiceImport (its endpoints in
// every exporting cluster), GEP-1748.
const (
	BackendService       BackendKind = "Service"
	BackendServiceImport BackendKind = "ServiceImport"
)

// BackendRef is one HTTPBackendRef or GRPCBackendRef (or a mirror's backendRef).
type BackendRef struct {
	// Kind is Service or ServiceImport; anything else is in Invalid.
	Kind BackendKind
	// Service is the backend (its namespace defaults to the route's).
	Service ServiceKey
	// Port is the backend Service port (0 when unset: a ServiceImport's only port).
	Port uint32
	// Weight is the relative share of the rule's traffic (default 1; 0 sends none).
	Weight int32
	// Filters are the backendRef's own filters (header modifiers).
	Filters []RouteFilter
	// Invalid says why the backend cannot be used ("" when it can): its reason (a Gateway API
	// ResolvedRefs reason, Reason) and a message. Requests its weight would get receive 500.
	Invalid *Condition
}

// RouteTimeouts is HTTPRouteTimeouts; nil fields are unset (no timeout), a zero duration
// disables the timeout.
type RouteTimeouts struct {
	Request        *time.Duration
	BackendRequest *time.Duration
}

// RouteRetry is HTTPRouteRetry.
type RouteRetry struct {
	// Attempts is the number of retries; nil when unset (Envoy's default, 1).
	Attempts *int
	// Codes are the HTTP status codes retried.
	Codes []int
	// Backoff is the base interval between attempts; nil when unset (Envoy's 25 ms), never below
	// 1 ms (a backoff of 0s is 1 ms: Envoy refuses 0, and 1 ms honours a minimum of 0).
	Backoff *time.Duration
}

// Condition is one status condition ResolveRoutes computes for a route parent: Reason and
// Message as the Gateway API defines them.
type Condition struct {
	Status  bool
	Reason  string
	Message string
}
