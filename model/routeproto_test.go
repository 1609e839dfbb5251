package model

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

// roundTrip encodes r, marshals the record to bytes and back (so presence survives the wire, not
// just the Go struct) and decodes it.
func roundTrip(t testing.TB, r Route) (Route, *registryv1.Route) {
	t.Helper()
	p := RouteToProto(r)
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var q registryv1.Route
	if err := proto.Unmarshal(b, &q); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	got, err := RouteFromProto(&q)
	if err != nil {
		t.Fatalf("RouteFromProto(RouteToProto(r)): %v\nrecord: %v", err, p)
	}
	return got, &q
}

// sameRoute compares routes as RouteFromProto promises: empty lists equal nil ones, times by
// instant (time.Time.Equal, which cmp uses), and the edge-only fields (routeEdgeFields) are not
// compared.
func sameRoute(t testing.TB, want, got Route) {
	t.Helper()
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(Route{}, "GatewayParents", "Hostnames")); d != "" {
		t.Fatalf("route changed in the round trip (-want +got):\n%s", d)
	}
}

func dur(d time.Duration) *time.Duration { return &d }

// fullRoute is an HTTPRoute using every field of the model.
func fullRoute() Route {
	web := ServiceKey{"shop", "web"}
	return Route{
		RouteRef:   RouteRef{Kind: KindHTTPRoute, Namespace: "shop", Name: "web-canary"},
		Generation: 7,
		Created:    time.Date(2026, 3, 4, 5, 6, 7, 890123456, time.FixedZone("CET", 3600)),
		Parents: []ParentRef{
			{Index: 0, Kind: ParentService, Service: web, Port: 80},
			{Index: 2, Kind: ParentServiceImport, Service: web, SectionName: "http"},
		},
		Rules: []RouteRule{{
			Name: "main",
			Matches: []RouteMatch{{
				Path:    PathMatch{Type: MatchPathPrefix, Value: "/api/"},
				Headers: []StringMatch{{Type: MatchExact, Name: "x-env", Value: "prod"}, {Type: MatchRegex, Name: "x-user", Value: "^u[0-9]+$"}},
				Query:   []StringMatch{{Type: MatchExact, Name: "Debug", Value: "1"}, {Type: MatchRegex, Name: "v", Value: "2|3"}},
				Method:  "POST",
			}, {
				Path: PathMatch{Type: MatchExact, Value: "/healthz"},
			}, {
				Path: PathMatch{Type: MatchRegex, Value: `^/v[0-9]+/.*`},
			}},
			Filters: []RouteFilter{
				{Type: FilterRequestHeaderModifier, Headers: &HeaderModifier{
					Set: []Header{{"x-a", "1"}}, Add: []Header{{"x-b", "2"}, {"x-d", "3"}}, Remove: []string{"x-c"}}},
				{Type: FilterResponseHeaderModifier, Headers: &HeaderModifier{Set: []Header{{"x-served-by", "canary"}}}},
				{Type: FilterURLRewrite, Rewrite: &Rewrite{Hostname: "web.internal", Path: &PathModifier{Type: ReplacePrefixMatch, Value: "/v2"}}},
				{Type: FilterRequestMirror, Mirror: &Mirror{
					Backend: BackendRef{Kind: BackendService, Service: ServiceKey{"other", "mirror"}, Port: 80, Weight: 1}, Numerator: 25, Denominator: 100}},
				{Type: FilterRequestMirror, Mirror: &Mirror{
					Backend: BackendRef{Kind: BackendServiceImport, Service: ServiceKey{"other", "mirror"}, Weight: 1}, Numerator: 1, Denominator: 3}},
				{Type: FilterCORS, CORS: &CORS{
					AllowOrigins: []string{"https://a.example", "http://*.b.example:8080"}, AllowCredentials: true,
					AllowMethods: []string{"GET", "POST"}, AllowHeaders: []string{"X-Requested-With"},
					ExposeHeaders: []string{"*"}, MaxAge: 600}},
			},
			Backends: []BackendRef{
				{Kind: BackendService, Service: web, Port: 80, Weight: 90},
				{Kind: BackendService, Service: ServiceKey{"shop", "web-v2"}, Port: 8080, Weight: 0, Filters: []RouteFilter{
					{Type: FilterRequestHeaderModifier, Headers: &HeaderModifier{Set: []Header{{"x-v", "2"}}}},
					{Type: FilterResponseHeaderModifier, Headers: &HeaderModifier{Remove: []string{"server"}}},
				}},
				{Kind: BackendServiceImport, Service: web, Weight: 1000000},
				{Kind: "Bucket", Service: ServiceKey{"shop", "b"}, Weight: 1, Invalid: &Condition{
					Reason: "InvalidKind", Message: `backendRef Bucket "b" (group "example.com"): want a Service or a ServiceImport (group multicluster.x-k8s.io)`}},
			},
			Timeouts: RouteTimeouts{Request: dur(2 * time.Second), BackendRequest: dur(500 * time.Millisecond)},
			Retry:    &RouteRetry{Attempts: ptr(3), Codes: []int{500, 503, 429}, Backoff: dur(100 * time.Millisecond)},
		}, {
			Matches: []RouteMatch{{Path: PathMatch{Type: MatchPathPrefix, Value: "/"}}},
			Filters: []RouteFilter{{Type: FilterRequestRedirect, Redirect: &Redirect{
				Scheme: "https", Hostname: "web.example", Port: 8443, StatusCode: 308,
				Path: &PathModifier{Type: ReplaceFullPath, Value: "/new"}}}},
		}, {
			Matches:     []RouteMatch{{Path: PathMatch{Type: MatchPathPrefix, Value: "/x"}}},
			Unsupported: []string{`spec.rules[2].filters[0]: type "ExtensionRef": not supported`, "spec.rules[2].sessionPersistence: not supported"},
		}},
	}
}

// grpcRoute is a GRPCRoute using every field a GRPCRoute has.
func grpcRoute() Route {
	rpc := ServiceKey{"shop", "rpc"}
	return Route{
		RouteRef: RouteRef{Kind: KindGRPCRoute, Namespace: "shop", Name: "rpc"},
		Parents:  []ParentRef{{Index: 31, Kind: ParentService, Service: rpc, Port: 9000}},
		Rules: []RouteRule{{
			Matches: []RouteMatch{
				{GRPC: &GRPCMethodMatch{Type: MatchExact, Service: "shop.Cart", Method: "Checkout"}, Headers: []StringMatch{{Type: MatchExact, Name: "x-tenant", Value: "a"}}},
				{GRPC: &GRPCMethodMatch{Type: MatchExact, Service: "shop.Cart"}},
				{GRPC: &GRPCMethodMatch{Type: MatchRegex, Method: "Get.*"}},
				{},
			},
			Filters: []RouteFilter{
				{Type: FilterRequestHeaderModifier, Headers: &HeaderModifier{}},
				{Type: FilterRequestMirror, Mirror: &Mirror{Backend: BackendRef{Kind: BackendService, Service: rpc, Port: 9001, Weight: 1}, Numerator: 0, Denominator: 1}},
			},
			Backends: []BackendRef{{Kind: BackendService, Service: rpc, Port: 9000, Weight: 1}},
		}},
	}
}

// TestRouteProtoRoundTrip: hand-built routes covering every field, and the cases where unset and
// zero differ, come back equal from the wire.
func TestRouteProtoRoundTrip(t *testing.T) {
	withRule := func(mod func(*RouteRule)) Route {
		r := Route{RouteRef: RouteRef{Kind: KindHTTPRoute, Namespace: "a", Name: "r"},
			Rules: []RouteRule{{Matches: []RouteMatch{{Path: PathMatch{Type: MatchPathPrefix, Value: "/"}}}}}}
		mod(&r.Rules[0])
		return r
	}
	for _, tc := range []struct {
		name string
		r    Route
		// check looks at the record for what the equality alone would not show.
		check func(*registryv1.Route) string
	}{
		{"every HTTPRoute field", fullRoute(), func(p *registryv1.Route) string {
			if p.CreateTime != "2026-03-04T04:06:07.890123456Z" {
				return "create_time " + p.CreateTime + ", want UTC with nanoseconds"
			}
			if b := p.Rules[0].Backends[0]; b.Invalid != nil || b.OtherKind != "" {
				return "a Service backend carries invalid or other_kind"
			}
			if b := p.Rules[0].Backends[3]; b.Kind != registryv1.BackendRef_KIND_OTHER || b.OtherKind != "Bucket" || b.Invalid.GetReason() != "InvalidKind" {
				return fmt.Sprintf("backend of another kind = %v", b)
			}
			return ""
		}},
		{"every GRPCRoute field", grpcRoute(), func(p *registryv1.Route) string {
			if m := p.Rules[0].Matches[3]; m.Path != nil || m.GrpcMethod != nil {
				return fmt.Sprintf("empty gRPC match = %v, want no path and no grpc_method", m)
			}
			return ""
		}},
		{"minimal route", Route{RouteRef: RouteRef{Kind: KindGRPCRoute, Namespace: "a", Name: "r"}}, func(p *registryv1.Route) string {
			if p.CreateTime != "" {
				return "zero Created written as " + p.CreateTime
			}
			return ""
		}},
		{"timeouts unset", withRule(func(r *RouteRule) {}), func(p *registryv1.Route) string {
			if p.Rules[0].Timeouts != nil {
				return "timeouts written for a rule without any"
			}
			return ""
		}},
		{"timeouts zero (disabled)", withRule(func(r *RouteRule) { r.Timeouts = RouteTimeouts{Request: dur(0), BackendRequest: dur(0)} }), func(p *registryv1.Route) string {
			if tm := p.Rules[0].Timeouts; tm.RequestMs == nil || *tm.RequestMs != 0 || tm.BackendRequestMs == nil || *tm.BackendRequestMs != 0 {
				return fmt.Sprintf("timeouts = %v, want both present and 0", tm)
			}
			return ""
		}},
		{"request timeout 0 with a backend timeout", withRule(func(r *RouteRule) {
			r.Timeouts = RouteTimeouts{Request: dur(0), BackendRequest: dur(time.Hour)}
		}), nil},
		{"only the backend timeout", withRule(func(r *RouteRule) { r.Timeouts.BackendRequest = dur(time.Millisecond) }), func(p *registryv1.Route) string {
			if p.Rules[0].Timeouts.RequestMs != nil {
				return "request_ms present though unset"
			}
			return ""
		}},
		{"retry with nothing set", withRule(func(r *RouteRule) { r.Retry = &RouteRetry{} }), func(p *registryv1.Route) string {
			if rt := p.Rules[0].Retry; rt == nil || rt.Attempts != nil || rt.BackoffMs != nil {
				return fmt.Sprintf("retry = %v, want present with attempts and backoff absent", rt)
			}
			return ""
		}},
		{"retry backoff at its minimum", withRule(func(r *RouteRule) { r.Retry = &RouteRetry{Backoff: dur(minRetryBackoff), Codes: []int{}} }), nil},
		{"a rule whose every match is bad has none", withRule(func(r *RouteRule) {
			r.Matches, r.BadMatches = nil, true
			r.Unsupported = []string{`spec.rules[0].matches[0].path.value: invalid value "(": not an RE2 expression: missing closing ): "("`}
		}), func(p *registryv1.Route) string {
			if len(p.Rules[0].Matches) != 0 || !p.Rules[0].BadMatches {
				return fmt.Sprintf("rule = %v, want no matches and bad_matches", p.Rules[0])
			}
			return ""
		}},
		{"retry attempts one", withRule(func(r *RouteRule) { r.Retry = &RouteRetry{Attempts: ptr(1)} }), nil},
		{"weights at the edges", withRule(func(r *RouteRule) {
			r.Backends = []BackendRef{{Kind: BackendService, Service: ServiceKey{"a", "x"}, Port: 65535, Weight: 0},
				{Kind: BackendService, Service: ServiceKey{"a", "y"}, Port: 1, Weight: 1000000}}
		}), nil},
		{"each redirect code", withRule(func(r *RouteRule) {
			for _, c := range []int{301, 302, 303, 307, 308} {
				r.Filters = append(r.Filters, RouteFilter{Type: FilterRequestRedirect, Redirect: &Redirect{StatusCode: c}})
			}
			r.Unsupported = []string{"spec.rules[0].filters: RequestRedirect given 5 times: at most once"}
		}), nil},
		{"mirror of nothing and of everything", withRule(func(r *RouteRule) {
			b := BackendRef{Kind: BackendService, Service: ServiceKey{"a", "m"}, Port: 80, Weight: 1}
			r.Filters = []RouteFilter{{Type: FilterRequestMirror, Mirror: &Mirror{Backend: b, Numerator: 0, Denominator: 1000000}},
				{Type: FilterRequestMirror, Mirror: &Mirror{Backend: b, Numerator: 7, Denominator: 7}}}
		}), nil},
		{"CORS with defaults only", withRule(func(r *RouteRule) {
			r.Filters = []RouteFilter{{Type: FilterCORS, CORS: &CORS{MaxAge: 5, AllowOrigins: []string{"*"}, AllowMethods: []string{"*"}}}}
		}), nil},
		{"path modifiers with empty and relative values", withRule(func(r *RouteRule) {
			r.Filters = []RouteFilter{{Type: FilterURLRewrite, Rewrite: &Rewrite{Path: &PathModifier{Type: ReplacePrefixMatch, Value: "v2"}}},
				{Type: FilterRequestRedirect, Redirect: &Redirect{StatusCode: 302, Path: &PathModifier{Type: ReplaceFullPath}}}}
			r.Unsupported = []string{"spec.rules[0].filters: URLRewrite and RequestRedirect cannot be combined (HTTPRouteRule.filters)"}
		}), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, p := roundTrip(t, tc.r)
			sameRoute(t, tc.r, got)
			if tc.check != nil {
				if msg := tc.check(p); msg != "" {
					t.Error(msg)
				}
			}
		})
	}
}

// TestRouteProtoFromKubernetes: routes converted from Kubernetes objects by HTTPRouteModel and
// GRPCRouteModel (the shapes the model tests build, defaults applied, unsupported parts listed,
// a backend of another kind) come back equal.
func TestRouteProtoFromKubernetes(t *testing.T) {
	parent := "  parentRefs:\n  - {group: \"\", kind: Service, name: web}\n"
	in := routeSources(t,
		route("HTTPRoute", "shop", "defaults-and-filters", 0, webParent+`  - {name: gw, kind: Gateway}
  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web, namespace: shop, port: 80, sectionName: http}
  rules:
`+everyFieldRules+`  - timeouts: {request: 0s}
    retry: {backoff: 0s}
`),
		route("HTTPRoute", "shop", "unsupported", 0, parent+`  rules:
  - backendRefs: [{group: example.com, kind: Bucket, name: b}, {group: example.com, kind: Service, name: s, port: 80}, {kind: ServiceImport, name: i}]
  - filters: [{type: ExtensionRef, extensionRef: {group: x.io, kind: F, name: f}}]
  - sessionPersistence: {sessionName: s}
  - filters: [{type: URLRewrite, urlRewrite: {hostname: h}}, {type: RequestRedirect, requestRedirect: {hostname: h}}]
  - matches: [{path: {type: Exact, value: /a}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]
  - filters: [{type: RequestRedirect, requestRedirect: {statusCode: 305}}]
  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web-v2, port: 80}, fraction: {numerator: 3, denominator: 2}}}]
  - backendRefs: [{name: web, port: 80, filters: [{type: URLRewrite, urlRewrite: {hostname: h}}]}]
`),
		route("GRPCRoute", "shop", "grpc", -5, "  parentRefs:\n  - {group: \"\", kind: Service, name: rpc, port: 9000}\n"+`  rules:
  - matches: [{method: {service: shop.Cart, method: Checkout}, headers: [{name: X-Tenant, value: a}]}, {method: {type: RegularExpression, method: "Get.*"}}]
    filters: [{type: RequestMirror, requestMirror: {backendRef: {name: rpc, port: 9000}}}]
    backendRefs: [{name: rpc, port: 9000, weight: 3}, {group: multicluster.x-k8s.io, kind: ServiceImport, name: rpc}]
  - {}
`),
	)
	var routes []Route
	for _, r := range in.HTTPRoutes {
		routes = append(routes, HTTPRouteModel(r))
	}
	for _, r := range in.GRPCRoutes {
		routes = append(routes, GRPCRouteModel(r))
	}
	for _, r := range routes {
		t.Run(r.Name, func(t *testing.T) {
			got, _ := roundTrip(t, r)
			sameRoute(t, r, got)
		})
	}
	if u := routes[1]; len(u.Rules) != 8 || len(u.Rules[1].Unsupported) == 0 || len(u.Rules[7].Unsupported) == 0 {
		t.Errorf("fixture %s lost its point: %+v", u.Name, u.Rules)
	}
	// A Service of another group (and a ServiceImport of the core group) is InvalidKind: it must
	// stay invalid in the record, not become a usable Service backend.
	for i, b := range routes[1].Rules[0].Backends {
		got, _ := roundTrip(t, routes[1])
		if b.Invalid == nil || got.Rules[0].Backends[i].Invalid == nil || got.Rules[0].Backends[i].Invalid.Reason != "InvalidKind" {
			t.Errorf("backend %d (%s) = %+v after the round trip, want it InvalidKind", i, b.Kind, got.Rules[0].Backends[i])
		}
	}
}

// TestRouteFromProtoZeroBackoff: a record's retry backoff of 0 reads as the model's minimum, as
// HTTPRouteModel makes a backoff of 0s (Envoy refuses a retry back-off of 0).
func TestRouteFromProtoZeroBackoff(t *testing.T) {
	p := RouteToProto(fullRoute())
	p.Rules[0].Retry.BackoffMs = proto.Int64(0)
	r, err := RouteFromProto(p)
	if err != nil {
		t.Fatal(err)
	}
	if b := r.Rules[0].Retry.Backoff; b == nil || *b != time.Millisecond {
		t.Errorf("backoff = %v, want 1ms", b)
	}
}

// TestRouteToProtoResolvedAndFinerDurations: what RouteToProto leaves out or rounds, by design.
func TestRouteToProtoResolvedAndFinerDurations(t *testing.T) {
	r := Route{RouteRef: RouteRef{Kind: KindHTTPRoute, Namespace: "a", Name: "r"}, Rules: []RouteRule{{
		Matches: []RouteMatch{{Path: PathMatch{Type: MatchPathPrefix, Value: "/"}}},
		Backends: []BackendRef{
			{Kind: BackendService, Service: ServiceKey{"a", "gone"}, Port: 80, Weight: 1, Invalid: &Condition{Reason: "BackendNotFound", Message: "not found"}},
			{Kind: "Bucket", Service: ServiceKey{"a", "b"}, Weight: 1, Invalid: &Condition{Reason: "InvalidKind", Message: "want a Service"}},
		},
		Timeouts: RouteTimeouts{Request: dur(1500 * time.Microsecond), BackendRequest: dur(time.Nanosecond)},
		Retry:    &RouteRetry{Backoff: dur(time.Millisecond + time.Nanosecond)},
	}}}
	got, p := roundTrip(t, r)
	if b := got.Rules[0].Backends; b[0].Invalid != nil || b[1].Invalid == nil || b[1].Invalid.Reason != "InvalidKind" {
		t.Errorf("backends = %+v: want the resolution verdict (BackendNotFound) dropped and InvalidKind kept", b)
	}
	if tm := p.Rules[0].Timeouts; tm.GetRequestMs() != 2 || tm.GetBackendRequestMs() != 1 || p.Rules[0].Retry.GetBackoffMs() != 2 {
		t.Errorf("timeouts %v, retry %v: want 1.5ms -> 2, 1ns -> 1 (never 0, which disables), 1ms+1ns -> 2", tm, p.Rules[0].Retry)
	}
}

// randomRoute builds a valid route from rng: every field, each optional part present or not.
func randomRoute(rng *rand.Rand) Route {
	pick := func(vs ...string) string { return vs[rng.IntN(len(vs))] }
	label := func() string { return pick("a", "shop", "web-v2", "x1") + pick("", "-b", "0") }
	svc := func() ServiceKey { return ServiceKey{label(), label()} }
	maybeDur := func() *time.Duration {
		switch rng.IntN(3) {
		case 0:
			return nil
		case 1:
			return dur(0)
		}
		return dur(time.Duration(1+rng.IntN(100000)) * time.Millisecond)
	}
	// headers are a header modifier's list of names from names (each once: a model's lists
	// hold each name once, in one list only).
	headers := func(names ...string) []Header {
		var hs []Header
		for _, n := range names {
			if rng.IntN(2) == 0 {
				hs = append(hs, Header{Name: n, Value: pick("", "1", "a b")})
			}
		}
		return hs
	}
	headerMod := func() *HeaderModifier {
		h := &HeaderModifier{Set: headers("x-a", "te"), Add: headers("x-b", "x-set-cookie")}
		for _, n := range []string{"x-c", "server"} {
			if rng.IntN(2) == 0 {
				h.Remove = append(h.Remove, n)
			}
		}
		return h
	}
	backend := func(filters bool) BackendRef {
		b := BackendRef{Kind: BackendService, Service: svc(), Port: uint32(rng.IntN(65536)), Weight: int32(rng.IntN(maxWeight + 1))}
		switch rng.IntN(5) {
		case 0:
			b.Kind = BackendServiceImport
		case 1:
			b.Kind = BackendKind(pick("Bucket", "Gateway", "X"))
			b.Invalid = &Condition{Reason: "InvalidKind", Message: fmt.Sprintf("backendRef %s %q: want a Service", b.Kind, b.Service.Name)}
		case 2: // a Service or ServiceImport of another group
			b.Kind = BackendKind(pick(string(BackendService), string(BackendServiceImport)))
			b.Invalid = &Condition{Reason: "InvalidKind", Message: fmt.Sprintf("backendRef %s %q (group \"x.io\"): want ...", b.Kind, b.Service.Name)}
		}
		for i := 0; filters && i < rng.IntN(3); i++ {
			b.Filters = append(b.Filters, RouteFilter{Type: FilterType(pick(string(FilterRequestHeaderModifier), string(FilterResponseHeaderModifier))), Headers: headerMod()})
		}
		return b
	}
	pathMod := func() *PathModifier {
		if rng.IntN(2) == 0 {
			return nil
		}
		return &PathModifier{Type: pick(ReplaceFullPath, ReplacePrefixMatch), Value: pick("", "/", "/v2")}
	}
	matchType := func() MatchType { return MatchType(pick(string(MatchExact), string(MatchRegex))) }
	stringMatches := func(names ...string) []StringMatch {
		var ms []StringMatch
		for _, n := range names {
			if rng.IntN(2) == 0 {
				continue
			}
			t := matchType()
			v := pick("a", "", "x y")
			if t == MatchRegex {
				v = pick("^a+$", ".*", "[0-9]{2}")
			}
			ms = append(ms, StringMatch{Type: t, Name: n, Value: v})
		}
		return ms
	}

	r := Route{RouteRef: RouteRef{Kind: KindHTTPRoute, Namespace: label(), Name: label() + pick("", ".v1")}, Generation: rng.Int64N(1 << 40)}
	grpc := rng.IntN(3) == 0
	if grpc {
		r.Kind = KindGRPCRoute
	}
	if rng.IntN(4) > 0 {
		r.Created = time.Unix(1_700_000_000+rng.Int64N(1e8), rng.Int64N(1e9)).In(time.FixedZone("z", 3600*(rng.IntN(25)-12)))
	}
	for i := rng.IntN(3); i < maxParentRefs && len(r.Parents) < 4; i += 1 + rng.IntN(10) {
		p := ParentRef{Index: i, Kind: ParentService, Service: svc()}
		if rng.IntN(2) == 0 {
			p.Kind = ParentServiceImport
		}
		if rng.IntN(2) == 0 {
			p.Port = uint32(1 + rng.IntN(65535))
		}
		if rng.IntN(3) == 0 {
			p.SectionName = pick("http", "grpc-web")
		}
		r.Parents = append(r.Parents, p)
	}
	for range rng.IntN(4) {
		rule := RouteRule{Name: pick("", "main", "r.1")}
		for range 1 + rng.IntN(3) {
			var m RouteMatch
			if grpc {
				m.Headers = stringMatches("x-a", "grpc-tag")
				if rng.IntN(2) == 0 {
					g := &GRPCMethodMatch{Type: matchType()}
					switch rng.IntN(3) {
					case 0:
						g.Service = "shop.Cart"
					case 1:
						g.Method = "Get"
					default:
						g.Service, g.Method = "Cart", "Put_2"
					}
					rule.Matches = append(rule.Matches, RouteMatch{Headers: m.Headers, GRPC: g})
					continue
				}
			} else {
				m.Path = PathMatch{Type: MatchType(pick(string(MatchExact), string(MatchPathPrefix))), Value: pick("/", "/api/", "/a-b/c~d", "/%20")}
				if rng.IntN(3) == 0 {
					m.Path = PathMatch{Type: MatchRegex, Value: pick("/v[0-9]+", "^/$")}
				}
				m.Headers = stringMatches("x-a", "x-b")
				m.Query = stringMatches("q", "Page")
				m.Method = pick("", "GET", "PATCH")
			}
			rule.Matches = append(rule.Matches, m)
		}
		for range rng.IntN(4) {
			types := ruleFilters
			if grpc {
				types = grpcRuleFilters
			}
			f := RouteFilter{Type: types[rng.IntN(len(types))]}
			switch f.Type {
			case FilterRequestHeaderModifier, FilterResponseHeaderModifier:
				f.Headers = headerMod()
			case FilterRequestRedirect:
				f.Redirect = &Redirect{Scheme: pick("", "http", "https"), Hostname: pick("", "a.example"), Path: pathMod(),
					Port: uint32(rng.IntN(65536)), StatusCode: []int{301, 302, 303, 307, 308}[rng.IntN(5)]}
			case FilterURLRewrite:
				f.Rewrite = &Rewrite{Hostname: pick("", "b.example"), Path: pathMod()}
			case FilterRequestMirror:
				d := int32(1 + rng.IntN(1000))
				f.Mirror = &Mirror{Backend: backend(false), Denominator: d, Numerator: rng.Int32N(d + 1)}
			case FilterCORS:
				f.CORS = &CORS{AllowCredentials: rng.IntN(2) == 0, MaxAge: int32(1 + rng.IntN(86400))}
				if rng.IntN(2) == 0 {
					f.CORS.AllowOrigins = []string{"https://a.example", "http://*.b.example:8080"}
					f.CORS.AllowMethods = []string{"GET", "OPTIONS"}
					f.CORS.AllowHeaders = []string{"X-Custom", "content-type"}
					f.CORS.ExposeHeaders = []string{"X-Trace", "*"}
				}
			}
			rule.Filters = append(rule.Filters, f)
		}
		for range rng.IntN(4) {
			rule.Backends = append(rule.Backends, backend(true))
		}
		rule.Timeouts = RouteTimeouts{Request: maybeDur(), BackendRequest: maybeDur()}
		if rq, br := rule.Timeouts.Request, rule.Timeouts.BackendRequest; rq != nil && br != nil && *rq != 0 && *br > *rq {
			rule.Timeouts.BackendRequest = dur(*rq)
		}
		if rng.IntN(2) == 0 {
			rt := &RouteRetry{Backoff: retryBackoff(maybeDur())} // a model's backoff is never 0
			if rng.IntN(2) == 0 {
				rt.Attempts = ptr(1 + rng.IntN(10))
			}
			for range rng.IntN(3) {
				rt.Codes = append(rt.Codes, 400+rng.IntN(200))
			}
			rule.Retry = rt
		}
		for range rng.IntN(2) {
			rule.Unsupported = append(rule.Unsupported, pick(`spec.rules[0].filters[1]: type "ExtensionRef": not supported`, "spec.rules[0].sessionPersistence: not supported"))
			rule.FailClosed, rule.BadMatches = rng.IntN(2) == 0, rng.IntN(3) == 0
		}
		r.Rules = append(r.Rules, rule)
	}
	return r
}

// TestRouteProtoRandom: RouteFromProto(RouteToProto(r)) == r for 1000 seeded random routes.
func TestRouteProtoRandom(t *testing.T) {
	for seed := range uint64(1000) {
		r := randomRoute(rand.New(rand.NewPCG(seed, 23)))
		got, _ := roundTrip(t, r)
		if d := cmp.Diff(r, got, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("seed %d: route changed in the round trip (-want +got):\n%s", seed, d)
		}
	}
}

// TestRouteFromProtoRefusals: each malformed record is refused with the field's path and value,
// and nothing is returned.
func TestRouteFromProtoRefusals(t *testing.T) {
	for _, tc := range []struct {
		name       string
		grpc       bool
		mod        func(p *registryv1.Route)
		field, val string
	}{
		{"unknown kind", false, func(p *registryv1.Route) { p.Kind = 9 }, "kind", "9"},
		{"unspecified kind", false, func(p *registryv1.Route) { p.Kind = 0 }, "kind", "KIND_UNSPECIFIED"},
		{"missing name", false, func(p *registryv1.Route) { p.Name = "" }, "name", ""},
		{"bad namespace", false, func(p *registryv1.Route) { p.Namespace = "Shop" }, "namespace", "Shop"},
		{"negative generation", false, func(p *registryv1.Route) { p.Generation = -1 }, "generation", "-1"},
		{"bad create time", false, func(p *registryv1.Route) { p.CreateTime = "yesterday" }, "create_time", "yesterday"},
		{"parent kind", false, func(p *registryv1.Route) { p.ParentRefs[1].Kind = 3 }, "parent_refs[1].kind", "3"},
		{"parent index out of range", false, func(p *registryv1.Route) { p.ParentRefs[1].Index = 32 }, "parent_refs[1].index", "32"},
		{"parent indexes not increasing", false, func(p *registryv1.Route) { p.ParentRefs[1].Index = 0 }, "parent_refs[1].index", "0"},
		{"parent without service", false, func(p *registryv1.Route) { p.ParentRefs[0].Service = nil }, "parent_refs[0].service", ""},
		{"parent name with a slash", false, func(p *registryv1.Route) { p.ParentRefs[0].Service.Name = "a/b" }, "parent_refs[0].service.name", "a/b"},
		{"parent port", false, func(p *registryv1.Route) { p.ParentRefs[0].Port = 65536 }, "parent_refs[0].port", "65536"},
		{"section name", false, func(p *registryv1.Route) { p.ParentRefs[1].SectionName = "HTTP" }, "parent_refs[1].section_name", "HTTP"},
		{"too many rules", false, func(p *registryv1.Route) {
			for len(p.Rules) <= maxRules {
				p.Rules = append(p.Rules, p.Rules[1])
			}
		}, "rules", "17 items"},
		{"too many matches in the route", false, func(p *registryv1.Route) {
			for range 10 {
				p.Rules = append(p.Rules, &registryv1.RouteRule{Matches: p.Rules[1].Matches})
			}
			for len(p.Rules[1].Matches) < maxMatches {
				p.Rules[1].Matches = append(p.Rules[1].Matches, p.Rules[1].Matches[0])
			}
			p.Rules[3].Matches = p.Rules[1].Matches
		}, "rules[3].matches", "132 matches in the route"},
		{"rule without matches", false, func(p *registryv1.Route) { p.Rules[1].Matches = nil }, "rules[1].matches", "0 items"},
		{"unspecified path type", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Path.Type = 0 }, "rules[0].matches[0].path.type", "TYPE_UNSPECIFIED"},
		{"unknown path type", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Path.Type = 4 }, "rules[0].matches[0].path.type", "4"},
		{"HTTP match without path", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Path = nil }, "rules[0].matches[0].path", ""},
		{"relative path", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Path.Value = "api" }, "rules[0].matches[0].path.value", "api"},
		{"dot segment", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Path.Value = "/a/../b" }, "rules[0].matches[0].path.value", "/a/../b"},
		{"encoded slash", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Path.Value = "/a%2Fb" }, "rules[0].matches[0].path.value", "/a%2Fb"},
		{"bad path regex", false, func(p *registryv1.Route) { p.Rules[0].Matches[2].Path.Value = "(" }, "rules[0].matches[2].path.value", "("},
		{"upper-case header match", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Headers[0].Name = "X-Env" }, "rules[0].matches[0].headers[0].name", "X-Env"},
		{"header match type", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Headers[0].Type = 7 }, "rules[0].matches[0].headers[0].type", "7"},
		{"bad header regex", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Headers[1].Value = "[" }, "rules[0].matches[0].headers[1].value", "["},
		{"header value with LF", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Headers[0].Value = "a\nb" }, "rules[0].matches[0].headers[0].value", "a\nb"},
		{"query name", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].QueryParams[0].Name = "a b" }, "rules[0].matches[0].query_params[0].name", "a b"},
		{"method", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Method = "get" }, "rules[0].matches[0].method", "get"},
		{"grpc method on an HTTP route", false, func(p *registryv1.Route) {
			p.Rules[0].Matches[0].GrpcMethod = &registryv1.GRPCMethodMatch{Type: 1, Method: "M"}
		}, "rules[0].matches[0].grpc_method", "/M"},
		{"empty filter", false, func(p *registryv1.Route) { p.Rules[0].Filters[1] = &registryv1.RouteFilter{} }, "rules[0].filters[1]", ""},
		{"header modifier name", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[0].GetRequestHeaderModifier().Set[0].Name = "x:a"
		}, "rules[0].filters[0].request_header_modifier.set[0].name", "x:a"},
		{"header modifier value with CR", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[0].GetRequestHeaderModifier().Add[0].Value = "1\r\nx-evil: 1"
		}, "rules[0].filters[0].request_header_modifier.add[0].value", "1\r\nx-evil: 1"},
		{"header modifier remove", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[0].GetRequestHeaderModifier().Remove[0] = ""
		}, "rules[0].filters[0].request_header_modifier.remove[0]", ""},
		{"header modifier sets host", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[0].GetRequestHeaderModifier().Set[0].Name = "host"
		}, "rules[0].filters[0].request_header_modifier.set[0].name", "host"},
		{"header modifier removes a pseudo-header", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[0].GetRequestHeaderModifier().Remove[0] = ":path"
		}, "rules[0].filters[0].request_header_modifier.remove[0]", ":path"},
		{"header modifier sets and removes one name", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[0].GetRequestHeaderModifier().Remove[0] = "x-a"
		}, "rules[0].filters[0].request_header_modifier.remove[0]", "x-a"},
		{"header modifier adds one name twice", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[0].GetRequestHeaderModifier().Add[1].Name = "x-b"
		}, "rules[0].filters[0].request_header_modifier.add[1].name", "x-b"},
		{"header matched twice", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Headers[1].Name = "x-env" }, "rules[0].matches[0].headers[1].name", "x-env"},
		{"query parameter matched twice", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].QueryParams[1].Name = "Debug" }, "rules[0].matches[0].query_params[1].name", "Debug"},
		{"path regex over Envoy's program size", false, func(p *registryv1.Route) { p.Rules[0].Matches[2].Path.Value = uuidPath }, "rules[0].matches[2].path.value", uuidPath},
		{"non-ASCII header regex", false, func(p *registryv1.Route) { p.Rules[0].Matches[0].Headers[1].Value = "é" }, "rules[0].matches[0].headers[1].value", "é"},
		{"CORS origin over Envoy's program size", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[5].GetCors().AllowOrigins[0] = "https://" + strings.Repeat("a", 90) + ".example"
		}, "rules[0].filters[5].cors.allow_origins[0]", "https://" + strings.Repeat("a", 90) + ".example"},
		{"redirect code 305", false, func(p *registryv1.Route) {
			p.Rules[1].Filters[0].GetRequestRedirect().StatusCode = 305
		}, "rules[1].filters[0].request_redirect.status_code", "305"},
		{"redirect code unset", false, func(p *registryv1.Route) {
			p.Rules[1].Filters[0].GetRequestRedirect().StatusCode = 0
		}, "rules[1].filters[0].request_redirect.status_code", "0"},
		{"redirect scheme", false, func(p *registryv1.Route) {
			p.Rules[1].Filters[0].GetRequestRedirect().Scheme = "ftp"
		}, "rules[1].filters[0].request_redirect.scheme", "ftp"},
		{"redirect hostname", false, func(p *registryv1.Route) {
			p.Rules[1].Filters[0].GetRequestRedirect().Hostname = "a_b"
		}, "rules[1].filters[0].request_redirect.hostname", "a_b"},
		{"redirect port", false, func(p *registryv1.Route) {
			p.Rules[1].Filters[0].GetRequestRedirect().Port = 70000
		}, "rules[1].filters[0].request_redirect.port", "70000"},
		{"path modifier type", false, func(p *registryv1.Route) {
			p.Rules[1].Filters[0].GetRequestRedirect().Path.Type = 0
		}, "rules[1].filters[0].request_redirect.path.type", "TYPE_UNSPECIFIED"},
		{"rewrite path with a space", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[2].GetUrlRewrite().Path.Value = "/v 2"
		}, "rules[0].filters[2].url_rewrite.path.value", "/v 2"},
		{"mirror denominator 0", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[3].GetRequestMirror().Denominator = 0
		}, "rules[0].filters[3].request_mirror.denominator", "0"},
		{"mirror numerator above denominator", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[3].GetRequestMirror().Numerator = 101
		}, "rules[0].filters[3].request_mirror.numerator", "101"},
		{"mirror negative numerator", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[3].GetRequestMirror().Numerator = -1
		}, "rules[0].filters[3].request_mirror.numerator", "-1"},
		{"mirror without backend", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[3].GetRequestMirror().Backend = nil
		}, "rules[0].filters[3].request_mirror.backend", ""},
		{"mirror backend with filters", false, func(p *registryv1.Route) {
			m := p.Rules[0].Filters[3].GetRequestMirror()
			m.Backend.Filters = []*registryv1.RouteFilter{p.Rules[0].Filters[3]}
		}, "rules[0].filters[3].request_mirror.backend.filters[0].request_mirror", "RequestMirror"},
		{"CORS origin", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[5].GetCors().AllowOrigins[0] = "a.example"
		}, "rules[0].filters[5].cors.allow_origins[0]", "a.example"},
		{"CORS wildcard method with others", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[5].GetCors().AllowMethods[1] = "*"
		}, "rules[0].filters[5].cors.allow_methods[1]", "*"},
		{"CORS max age", false, func(p *registryv1.Route) {
			p.Rules[0].Filters[5].GetCors().MaxAgeSeconds = 0
		}, "rules[0].filters[5].cors.max_age_seconds", "0"},
		{"backend kind", false, func(p *registryv1.Route) { p.Rules[0].Backends[0].Kind = 0 }, "rules[0].backends[0].kind", "KIND_UNSPECIFIED"},
		{"negative weight", false, func(p *registryv1.Route) { p.Rules[0].Backends[0].Weight = -1 }, "rules[0].backends[0].weight", "-1"},
		{"weight too large", false, func(p *registryv1.Route) { p.Rules[0].Backends[0].Weight = 1000001 }, "rules[0].backends[0].weight", "1000001"},
		{"backend port", false, func(p *registryv1.Route) { p.Rules[0].Backends[0].Port = 65536 }, "rules[0].backends[0].port", "65536"},
		{"backend namespace", false, func(p *registryv1.Route) { p.Rules[0].Backends[0].Service.Namespace = "" }, "rules[0].backends[0].service.namespace", ""},
		{"backend name", false, func(p *registryv1.Route) { p.Rules[0].Backends[0].Service.Name = "" }, "rules[0].backends[0].service.name", ""},
		{"resolution verdict on a Service backend", false, func(p *registryv1.Route) {
			p.Rules[0].Backends[0].Invalid = &registryv1.BackendInvalid{Reason: "BackendNotFound", Message: "gone"}
		}, "rules[0].backends[0].invalid", "BackendNotFound"},
		{"other kind without invalid", false, func(p *registryv1.Route) { p.Rules[0].Backends[3].Invalid = nil }, "rules[0].backends[3].invalid", ""},
		{"other kind empty", false, func(p *registryv1.Route) { p.Rules[0].Backends[3].OtherKind = "" }, "rules[0].backends[3].other_kind", ""},
		{"other kind not a kind name", false, func(p *registryv1.Route) { p.Rules[0].Backends[3].OtherKind = "a/b" }, "rules[0].backends[3].other_kind", "a/b"},
		{"other kind on a Service", false, func(p *registryv1.Route) { p.Rules[0].Backends[0].OtherKind = "Bucket" }, "rules[0].backends[0].other_kind", "Bucket"},
		{"invalid reason", false, func(p *registryv1.Route) { p.Rules[0].Backends[3].Invalid.Reason = "BackendNotFound" }, "rules[0].backends[3].invalid.reason", "BackendNotFound"},
		{"backend filter type", false, func(p *registryv1.Route) {
			p.Rules[0].Backends[1].Filters = append(p.Rules[0].Backends[1].Filters, p.Rules[0].Filters[2])
		}, "rules[0].backends[1].filters[2].url_rewrite", "URLRewrite"},
		{"negative timeout", false, func(p *registryv1.Route) { p.Rules[0].Timeouts.RequestMs = proto.Int64(-1) }, "rules[0].timeouts.request_ms", "-1"},
		{"timeout overflows", false, func(p *registryv1.Route) { p.Rules[0].Timeouts.RequestMs = proto.Int64(maxDurationMs + 1) }, "rules[0].timeouts.request_ms", fmt.Sprint(maxDurationMs + 1)},
		{"backend timeout above request timeout", false, func(p *registryv1.Route) {
			p.Rules[0].Timeouts.BackendRequestMs = proto.Int64(2001)
		}, "rules[0].timeouts.backend_request_ms", "2001"},
		{"retry attempts 0", false, func(p *registryv1.Route) { p.Rules[0].Retry.Attempts = proto.Int64(0) }, "rules[0].retry.attempts", "0"},
		{"retry attempts too many", false, func(p *registryv1.Route) { p.Rules[0].Retry.Attempts = proto.Int64(1 << 31) }, "rules[0].retry.attempts", "2147483648"},
		{"retry code", false, func(p *registryv1.Route) { p.Rules[0].Retry.Codes[1] = 200 }, "rules[0].retry.codes[1]", "200"},
		{"negative backoff", false, func(p *registryv1.Route) { p.Rules[0].Retry.BackoffMs = proto.Int64(-5) }, "rules[0].retry.backoff_ms", "-5"},
		{"empty unsupported entry", false, func(p *registryv1.Route) { p.Rules[2].Unsupported[0] = "" }, "rules[2].unsupported[0]", ""},
		{"control character in unsupported", false, func(p *registryv1.Route) { p.Rules[2].Unsupported[1] = "a\x1b[31m" }, "rules[2].unsupported[1]", "a\x1b[31m"},
		{"GRPC match with path", true, func(p *registryv1.Route) {
			p.Rules[0].Matches[0].Path = &registryv1.PathMatch{Type: 1, Value: "/x"}
		}, "rules[0].matches[0].path", "/x"},
		{"GRPC match with query", true, func(p *registryv1.Route) {
			p.Rules[0].Matches[0].QueryParams = []*registryv1.QueryParamMatch{{Type: 1, Name: "q"}}
		}, "rules[0].matches[0].query_params[0].name", "q"},
		{"GRPC match with method", true, func(p *registryv1.Route) { p.Rules[0].Matches[0].Method = "GET" }, "rules[0].matches[0].method", "GET"},
		{"GRPC method match empty", true, func(p *registryv1.Route) {
			p.Rules[0].Matches[0].GrpcMethod = &registryv1.GRPCMethodMatch{Type: 1}
		}, "rules[0].matches[0].grpc_method", ""},
		{"GRPC exact service with a slash", true, func(p *registryv1.Route) {
			p.Rules[0].Matches[0].GrpcMethod.Service = "shop/Cart"
		}, "rules[0].matches[0].grpc_method.service", "shop/Cart"},
		{"GRPC method regex", true, func(p *registryv1.Route) { p.Rules[0].Matches[2].GrpcMethod.Method = "(" }, "rules[0].matches[2].grpc_method.method", "("},
		{"GRPC service regex that breaks Envoy's embedding", true, func(p *registryv1.Route) { p.Rules[0].Matches[2].GrpcMethod.Service = `\Qa` }, "rules[0].matches[2].grpc_method", `\Qa/Get.*`},
		{"GRPC rule with a redirect", true, func(p *registryv1.Route) {
			p.Rules[0].Filters[0] = &registryv1.RouteFilter{Filter: &registryv1.RouteFilter_RequestRedirect{RequestRedirect: &registryv1.RequestRedirect{StatusCode: 302}}}
		}, "rules[0].filters[0].request_redirect", "RequestRedirect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := fullRoute()
			if tc.grpc {
				src = grpcRoute()
			}
			p := RouteToProto(src)
			tc.mod(p)
			r, err := RouteFromProto(p)
			var fe *RouteFieldError
			if !errors.As(err, &fe) {
				t.Fatalf("RouteFromProto = %v, want a *RouteFieldError for %s", err, tc.field)
			}
			if fe.Field != tc.field || fe.Value != tc.val {
				t.Errorf("error %q: field %q value %q, want %q %q", err, fe.Field, fe.Value, tc.field, tc.val)
			}
			if !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Errorf("error %q does not start with the field", err)
			}
			if !reflect.DeepEqual(r, Route{}) {
				t.Errorf("RouteFromProto returned a half-converted route with its error: %+v", r)
			}
		})
	}
	if _, err := RouteFromProto(nil); err == nil {
		t.Error("RouteFromProto(nil) accepted")
	}
}

// FuzzRouteProto: any bytes decoded as a Route record are refused with a *RouteFieldError and a
// zero Route, or accepted as a route that survives its own encoding unchanged.
func FuzzRouteProto(f *testing.F) {
	for _, r := range []Route{fullRoute(), grpcRoute()} {
		b, err := proto.Marshal(RouteToProto(r))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for seed := range uint64(6) {
		b, err := proto.Marshal(RouteToProto(randomRoute(rand.New(rand.NewPCG(seed, 99)))))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var p registryv1.Route
		if err := proto.Unmarshal(data, &p); err != nil {
			return
		}
		r, err := RouteFromProto(&p)
		if err != nil {
			var fe *RouteFieldError
			if !errors.As(err, &fe) || !reflect.DeepEqual(r, Route{}) {
				t.Fatalf("refusal %v (%T) with route %+v: want a *RouteFieldError and a zero Route", err, err, r)
			}
			return
		}
		got, err := RouteFromProto(RouteToProto(r))
		if err != nil {
			t.Fatalf("an accepted route does not survive its own encoding: %v\nroute: %+v", err, r)
		}
		if d := cmp.Diff(r, got, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("an accepted route changed in its own round trip (-first +second):\n%s", d)
		}
	})
}

// routeEdgeFields are the fields of Route that only edge Gateways read (ResolveGateways): the
// registry record is the mesh's and carries neither (registry.proto reserves hostnames and lists
// mesh parentRefs only). RouteRef.Origin is not carried either: an importer sets it from the
// record's key path (ImportRoutes), never from the record's body.
var routeEdgeFields = []string{"Route.GatewayParents", "Route.Hostnames", "RouteRef.Origin"}

// routeProtoFields are the fields of Route and every model type under it that RouteToProto and
// RouteFromProto carry (Condition.Status is always false on a backend's Invalid).
var routeProtoFields = []string{
	"BackendRef.Filters", "BackendRef.Invalid", "BackendRef.Kind", "BackendRef.Port", "BackendRef.Service", "BackendRef.Weight",
	"CORS.AllowCredentials", "CORS.AllowHeaders", "CORS.AllowMethods", "CORS.AllowOrigins", "CORS.ExposeHeaders", "CORS.MaxAge",
	"Condition.Message", "Condition.Reason", "Condition.Status",
	"GRPCMethodMatch.Method", "GRPCMethodMatch.Service", "GRPCMethodMatch.Type",
	"Header.Name", "Header.Value",
	"HeaderModifier.Add", "HeaderModifier.Remove", "HeaderModifier.Set",
	"Mirror.Backend", "Mirror.Denominator", "Mirror.Numerator",
	"ParentRef.Index", "ParentRef.Kind", "ParentRef.Port", "ParentRef.SectionName", "ParentRef.Service",
	"PathMatch.Type", "PathMatch.Value",
	"PathModifier.Type", "PathModifier.Value",
	"Redirect.Hostname", "Redirect.Path", "Redirect.Port", "Redirect.Scheme", "Redirect.StatusCode",
	"Rewrite.Hostname", "Rewrite.Path",
	"Route.Created", "Route.Generation", "Route.Parents", "Route.RouteRef", "Route.Rules",
	"RouteFilter.CORS", "RouteFilter.Headers", "RouteFilter.Mirror", "RouteFilter.Redirect", "RouteFilter.Rewrite", "RouteFilter.Type",
	"RouteMatch.GRPC", "RouteMatch.Headers", "RouteMatch.Method", "RouteMatch.Path", "RouteMatch.Query",
	"RouteRef.Kind", "RouteRef.Name", "RouteRef.Namespace",
	"RouteRetry.Attempts", "RouteRetry.Backoff", "RouteRetry.Codes",
	"RouteRule.Backends", "RouteRule.Filters", "RouteRule.Matches", "RouteRule.Name", "RouteRule.Retry", "RouteRule.Timeouts", "RouteRule.Unsupported", "RouteRule.FailClosed", "RouteRule.BadMatches",
	"RouteTimeouts.BackendRequest", "RouteTimeouts.Request",
	"ServiceKey.Name", "ServiceKey.Namespace",
	"StringMatch.Name", "StringMatch.Type", "StringMatch.Value",
}

// TestRouteProtoCoversEveryField: a field added to Route or a type under it fails here until the
// record (registry.proto), the conversion, the round-trip fixtures and routeProtoFields carry it.
func TestRouteProtoCoversEveryField(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var have []string
	var walk func(reflect.Type)
	walk = func(ty reflect.Type) {
		for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice {
			ty = ty.Elem()
		}
		if ty.Kind() != reflect.Struct || ty.PkgPath() != reflect.TypeFor[Route]().PkgPath() || seen[ty] {
			return
		}
		seen[ty] = true
		for f := range ty.Fields() {
			if slices.Contains(routeEdgeFields, ty.Name()+"."+f.Name) {
				continue
			}
			have = append(have, ty.Name()+"."+f.Name)
			walk(f.Type)
		}
	}
	walk(reflect.TypeFor[Route]())
	slices.Sort(have)
	want := slices.Sorted(slices.Values(routeProtoFields))
	if d := cmp.Diff(want, have); d != "" {
		t.Errorf("model route fields differ from those the registry record carries (-carried +model):\n%s", d)
	}
}
