package xds

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// longest returns the longest of mk(1..) whose regex (rx of it) has an RE2 program size within
// Envoy's limit: a value at the model's bound.
func longest(t *testing.T, mk func(n int) string, rx func(string) string) string {
	t.Helper()
	best := ""
	for n := 1; n < 400; n++ {
		size, err := model.RE2ProgramSize(rx(mk(n)))
		if err != nil {
			t.Fatal(err)
		}
		if size > model.RegexProgramLimit {
			break
		}
		best = mk(n)
	}
	if best == "" {
		t.Fatal("no value fits the regex limit")
	}
	return best
}

// edgeRoutes are an HTTPRoute and a GRPCRoute on goldenMesh's shop/web with values at the edge
// of what the model takes: regexes of program size up to Envoy's limit, header values Envoy
// formats ("%"), hop-by-hop and empty header values, 16 header edits, every method and redirect
// code, the longest GEP-2257 duration, retry attempts 1 and 2147483647, codes 400 and 599,
// backoff 0s, the longest hostname, path modifiers with every path character, CORS origins up
// to the regex limit, the exact gRPC method and regex service at the limit.
func edgeRoutes(t *testing.T) []model.Route {
	size := func(re string) int {
		n, err := model.RE2ProgramSize(re)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	pathRe := longest(t, func(n int) string {
		return `^/api/v[0-9]+/(users|orders)/[0-9a-f]{8}-` + strings.Repeat("[0-9a-f]", n) + "$"
	}, func(s string) string { return s })
	headerRe := longest(t, func(n int) string { return `(?i)^bearer [a-z0-9._~+/-]+=*` + strings.Repeat("x", n) }, func(s string) string { return s })
	queryRe := longest(t, func(n int) string { return `^(asc|desc)` + strings.Repeat(`\.`, n) }, func(s string) string { return s })
	origin := longest(t, func(n int) string { return "https://" + strings.Repeat("a", n) + ".example" }, model.CORSOriginRegex)
	grpcMethod := longest(t, func(n int) string { return "M" + strings.Repeat("x", n) }, func(m string) string {
		re, _ := model.GRPCMethodRegex(model.GRPCMethodMatch{Type: model.MatchExact, Method: m})
		return re
	})
	grpcService := longest(t, func(n int) string { return `pkg\.v[0-9]+\.` + strings.Repeat("[A-Z]", n) }, func(s string) string {
		re, _ := model.GRPCMethodRegex(model.GRPCMethodMatch{Type: model.MatchRegex, Service: s, Method: "Get.*"})
		return re
	})
	for _, re := range []string{pathRe, headerRe, queryRe} {
		if n := size(re); n < model.RegexProgramLimit-5 {
			t.Fatalf("%q: size %d, not near the limit", re, n)
		}
	}
	host := strings.Repeat(strings.Repeat("h", 62)+".", 3) + strings.Repeat("h", 61) // 253 bytes
	var headers []string
	for _, h := range []struct{ n, v string }{
		{"x-percent", "100%"}, {"x-format", "%HOSTNAME% %REQ(:path)%"}, {"x-empty", ""}, {"x-spaces", " a\tb "},
		{"connection", "close"}, {"te", "trailers"}, {"upgrade", "h2c"}, {"keep-alive", "1"}, {"proxy-connection", "x"},
		{"transfer-encoding", "chunked"}, {"content-length", "0"}, {"x-envoy-original-path", "/x"}, {"x-forwarded-for", "1.2.3.4"},
		{"authorization", "Bearer x"}, {"cookie", "a=b"}, {"X-Up", "\x7f~!"},
	} {
		headers = append(headers, fmt.Sprintf("{name: %q, value: %q}", h.n, h.v))
	}
	var redirects []string
	for i, code := range []int{301, 302, 303, 307, 308} {
		redirects = append(redirects, fmt.Sprintf(`  - matches: [{path: {value: /r%d}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: %s, hostname: %s, port: %d, statusCode: %d, path: {type: %s}}}]`,
			i, []string{"http", "https"}[i%2], host, []int{1, 65535}[i%2], code,
			[]string{"ReplacePrefixMatch, replacePrefixMatch: ''", "ReplaceFullPath, replaceFullPath: /x"}[i%2]))
	}
	httpRoute := `kind: HTTPRoute
metadata: {namespace: shop, name: edge}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - matches:
    - path: {type: RegularExpression, value: '` + pathRe + `'}
      headers: [{name: X-Re, type: RegularExpression, value: '` + headerRe + `'}, {name: X-Exact, value: "a\tb ~!@#$%^&*()"}]
      queryParams: [{name: q, type: RegularExpression, value: '` + queryRe + `'}, {name: "Exact!#$%&'*+-.^_|~", value: "%00"}]
      method: CONNECT
    - {path: {type: Exact, value: "/a-b._~!$&'()*+,;=:@%20"}, method: PATCH}
    - {path: {type: PathPrefix, value: /p/}, method: OPTIONS}
    filters:
    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [` + strings.Join(headers, ", ") + `], add: [{name: Set-Cookie, value: "a=b; Path=/"}], remove: [user-agent, accept]}}
    - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [` + strings.Join(headers, ", ") + `], remove: [server]}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: web, port: 80}, percent: 0}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: web, port: 80}, fraction: {numerator: 1, denominator: 1000000}}}
    - {type: CORS, cors: {allowOrigins: ["` + origin + `", "http://*.a.example:65535", "https://*"], allowCredentials: true, allowMethods: [GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH], allowHeaders: ["*"], exposeHeaders: [x-a, "*"], maxAge: 86400}}
    backendRefs:
    - {name: web, port: 80, weight: 1000000, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-b, value: "%"}]}}, {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-c, value: "%%"}]}}]}
    - {name: web, port: 80, weight: 0}
    timeouts: {request: 99999h99999m99999s99999ms, backendRequest: 0s}
    retry: {attempts: 2147483647, codes: [400, 599], backoff: 0s}
  - matches: [{path: {type: PathPrefix, value: /old}}]
    filters: [{type: URLRewrite, urlRewrite: {hostname: ` + host + `, path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
    backendRefs: [{name: web, port: 80}]
    timeouts: {request: 0s, backendRequest: 1ms}
    retry: {attempts: 1, backoff: 99999h}
  - matches: [{path: {type: PathPrefix, value: /full}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: "/a\\1%{}|^` + "`" + `[]\"<>"}}}]
    backendRefs: [{name: web, port: 80}]
` + strings.Join(redirects, "\n") + "\n"
	grpcRoute := `kind: GRPCRoute
metadata: {namespace: shop, name: edge-rpc}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 9090}]
  rules:
  - matches:
    - method: {type: RegularExpression, service: '` + grpcService + `', method: "Get.*"}
    - method: {method: ` + grpcMethod + `}
    - method: {service: pkg.Svc_1.X, method: M}
    - method: {service: .pkg.Svc}
    - headers: [{name: x-h, type: RegularExpression, value: '` + headerRe + `'}]
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-p, value: "%"}]}}, {type: RequestMirror, requestMirror: {backendRef: {name: web, port: 9090}}}]
    backendRefs: [{name: web, port: 9090}]
  - {}
`
	h := &gwv1.HTTPRoute{}
	if err := yaml.UnmarshalStrict([]byte(httpRoute), h); err != nil {
		t.Fatalf("HTTPRoute: %v\n%s", err, httpRoute)
	}
	g := &gwv1.GRPCRoute{}
	if err := yaml.UnmarshalStrict([]byte(grpcRoute), g); err != nil {
		t.Fatalf("GRPCRoute: %v\n%s", err, grpcRoute)
	}
	routes := []model.Route{model.HTTPRouteModel(h), model.GRPCRouteModel(g)}
	for _, r := range routes {
		for i, rule := range r.Rules {
			if len(rule.Unsupported) > 0 || rule.BadMatches {
				t.Fatalf("%s rule %d: the model refuses an edge value: %q", r.RouteRef, i, rule.Unsupported)
			}
		}
	}
	return routes
}

// captureTableConfig is an Envoy bootstrap serving the capture route table of r in a static
// listener's connection manager, with the HTTP filters of a capture connection manager (CORS,
// router); the table's clusters are not checked (validate_clusters false), its routes are.
func captureTableConfig(t *testing.T, r *Resources) string {
	t.Helper()
	rc := proto.Clone(routeNamed(r, CaptureRouteName)).(*routev3.RouteConfiguration)
	rc.ValidateClusters = wrapperspb.Bool(false)
	cors, err := corsFilter()
	if err != nil {
		t.Fatal(err)
	}
	f, err := hcmFilter(&hcmv3.HttpConnectionManager{StatPrefix: "edge", RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc}}, cors)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{StaticResources: &bootstrapv3.Bootstrap_StaticResources{Listeners: []*listenerv3.Listener{{
		Name: "edge",
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: 0}}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{f}}},
	}}}}
	j, err := protojson.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(j)
}

// TestGAMMAEdgeValuesEnvoy: Envoy takes everything the model takes in edgeRoutes: the capture
// route table aether builds for them (ValidateAll-clean) passes the real Envoy's
// --mode validate. Then, to show the check bites, the same table with a regex one instruction
// over the limit, and with Host set, which the model would have refused, is refused by Envoy.
func TestGAMMAEdgeValuesEnvoy(t *testing.T) {
	routes := edgeRoutes(t)
	r := buildValid(t, gammaMesh(t, routes), Options{})
	if out, ok := testenv.ValidateEnvoy(t, captureTableConfig(t, r), "warning"); !ok {
		t.Fatalf("envoy refused the capture route table of edge values the model takes:\n%s", testenv.Tail(out, 6000))
	}
	for _, c := range []struct {
		name string
		bad  func(*model.Route)
		want string
	}{
		{"a path regex of program size 101", func(r *model.Route) { r.Rules[0].Matches[0].Path.Value = strings.Repeat("x", 97) },
			"RE2 program size of 101 > max program size of 100"},
		{"Host set", func(r *model.Route) { r.Rules[0].Filters[0].Headers.Set[0].Name = "host" },
			":-prefixed or host headers may not be modified"},
	} {
		bad := edgeRoutes(t)
		c.bad(&bad[0])
		out, ok := testenv.ValidateEnvoy(t, captureTableConfig(t, buildValid(t, gammaMesh(t, bad), Options{})), "warning")
		if ok || !strings.Contains(out, c.want) {
			t.Errorf("%s: envoy accepted=%t, want it to refuse with %q:\n%s", c.name, ok, c.want, testenv.Tail(out, 3000))
		}
	}
}

// TestModelRegexesAreXDSRegexes: the regexes the model bounds (model.GRPCMethodRegex,
// model.CORSOriginRegex) are the ones xds builds, so the model checks what Envoy compiles.
func TestModelRegexesAreXDSRegexes(t *testing.T) {
	for _, g := range []model.GRPCMethodMatch{
		{Type: model.MatchExact, Method: "Get"}, {Type: model.MatchRegex, Service: `pkg\..*`},
		{Type: model.MatchRegex, Method: "Get.*"}, {Type: model.MatchRegex, Service: "a|b", Method: "c"},
		{Type: model.MatchExact, Service: "pkg.Svc"}, {Type: model.MatchExact, Service: "pkg.Svc", Method: "M"},
	} {
		want, ok := model.GRPCMethodRegex(g)
		got := routeMatch(model.RouteMatch{GRPC: &g}).GetSafeRegex().GetRegex()
		if got != want || ok != (got != "") {
			t.Errorf("%+v: xds regex %q, model %q (ok %t)", g, got, want, ok)
		}
	}
	if _, err := regexp.Compile(model.CORSOriginRegex("https://*.bar.com")); err != nil {
		t.Error(err)
	}
}
