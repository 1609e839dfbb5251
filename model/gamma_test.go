package model

import (
	"strings"
	"testing"
	"time"
)

// TestRouteModelRefusals: each value the model refuses in a Kubernetes route (what Envoy would
// refuse, what the spec calls invalid, an enum value aether does not know) makes one Unsupported
// entry naming the field and the value; the rule is not served (a bad match sets BadMatches and
// is left out); and the route still survives the registry record, whose reader applies the same
// checks.
func TestRouteModelRefusals(t *testing.T) {
	long := strings.Repeat("a", 90)
	for _, tc := range []struct {
		name, kind, rule string
		want             string // a substring of the rule's one Unsupported entry
		badMatch         bool
	}{
		{"path regex syntax", "HTTPRoute", `matches: [{path: {type: RegularExpression, value: "/a("}}]`,
			`spec.rules[0].matches[0].path.value: invalid value "/a(": not an RE2 expression: missing closing ): "/a("`, true},
		{"path regex over Envoy's program size", "HTTPRoute", `matches: [{path: {type: RegularExpression, value: '` + uuidPath + `'}}]`,
			`spec.rules[0].matches[0].path.value: invalid value "^/api/v[0-9]+/(users|orders|items|products|customers)/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$": RE2 program size 111 is over Envoy's limit of 100`, true},
		{"unknown path match type", "HTTPRoute", `matches: [{path: {type: Template, value: /a}}]`,
			`spec.rules[0].matches[0].path.type: invalid value "Template": want Exact, PathPrefix or RegularExpression`, true},
		{"path prefix with a query", "HTTPRoute", `matches: [{path: {type: PathPrefix, value: "/a?b"}}]`,
			`spec.rules[0].matches[0].path.value: invalid value "/a?b": want only the characters`, true},
		{"header regex syntax, second match", "HTTPRoute", `matches: [{path: {value: /ok}}, {headers: [{name: X-A, type: RegularExpression, value: "["}]}]`,
			`spec.rules[0].matches[1].headers[0].value: invalid value "[": not an RE2 expression: missing closing ]`, true},
		{"unknown header match type", "HTTPRoute", `matches: [{headers: [{name: x-a, type: Prefix, value: v}]}]`,
			`spec.rules[0].matches[0].headers[0].type: invalid value "Prefix": want Exact or RegularExpression`, true},
		{"header name", "HTTPRoute", `matches: [{headers: [{name: "a b", value: v}]}]`,
			`spec.rules[0].matches[0].headers[0].name: invalid value "a b": want an HTTP header name`, true},
		{"non-ASCII query regex", "HTTPRoute", `matches: [{queryParams: [{name: q, type: RegularExpression, value: "é+"}]}]`,
			`spec.rules[0].matches[0].queryParams[0].value: invalid value "é+": non-ASCII character 'é': Envoy matches bytes`, true},
		{"unknown query match type", "HTTPRoute", `matches: [{queryParams: [{name: q, type: Prefix, value: v}]}]`,
			`spec.rules[0].matches[0].queryParams[0].type: invalid value "Prefix"`, true},
		{"exact header value with LF", "HTTPRoute", `matches: [{headers: [{name: x-a, value: "a\nb"}]}]`,
			`spec.rules[0].matches[0].headers[0].value: invalid value "a\nb": want no NUL, CR or LF`, true},
		{"unknown method", "HTTPRoute", `matches: [{method: QUERY}]`,
			`spec.rules[0].matches[0].method: invalid value "QUERY": want GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE or PATCH`, true},
		{"set Host", "HTTPRoute", `filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Host, value: h}]}}]`,
			`spec.rules[0].filters[0]: requestHeaderModifier.set[0].name: invalid value "host": Envoy refuses to modify or remove Host (and with it the node's route table); set the host with a URLRewrite filter's hostname`, false},
		{"add host to a response", "HTTPRoute", `filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: host, value: h}]}}]`,
			`spec.rules[0].filters[0]: responseHeaderModifier.add[0].name: invalid value "host"`, false},
		{"remove a pseudo-header", "HTTPRoute", `filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {remove: [":status"]}}]`,
			`spec.rules[0].filters[0]: responseHeaderModifier.remove[0]: invalid value ":status": a pseudo-header`, false},
		{"remove an empty name", "HTTPRoute", `filters: [{type: RequestHeaderModifier, requestHeaderModifier: {remove: [""]}}]`,
			`spec.rules[0].filters[0]: requestHeaderModifier.remove[0]: invalid value "": want an HTTP header name in lower case`, false},
		{"set and remove one name", "HTTPRoute", `filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-A, value: "1"}], remove: [x-a]}}]`,
			`spec.rules[0].filters[0]: requestHeaderModifier.remove[0]: invalid value "x-a": also in set: one action per header name (HTTPHeaderFilter)`, false},
		{"header value with CR", "HTTPRoute", `filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x-a, value: "1\r\nx-evil: 1"}]}}]`,
			`spec.rules[0].filters[0]: requestHeaderModifier.add[0].value: invalid value "1\r\nx-evil: 1": want at most 4096 bytes without NUL, CR or LF`, false},
		{"set Host on a backend", "HTTPRoute", `backendRefs: [{name: web, port: 80, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: HOST, value: h}]}}]}]`,
			`spec.rules[0].backendRefs[0].filters[0]: requestHeaderModifier.set[0].name: invalid value "host"`, false},
		{"redirect scheme", "HTTPRoute", `filters: [{type: RequestRedirect, requestRedirect: {scheme: ftp}}]`,
			`spec.rules[0].filters[0]: requestRedirect.scheme: invalid value "ftp": want http or https`, false},
		{"redirect hostname", "HTTPRoute", `filters: [{type: RequestRedirect, requestRedirect: {hostname: "a_b"}}]`,
			`spec.rules[0].filters[0]: requestRedirect.hostname: invalid value "a_b": want a DNS name`, false},
		{"unknown path modifier type", "HTTPRoute", `filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplaceQuery}}}]`,
			`spec.rules[0].filters[0]: requestRedirect.path.type: invalid value "ReplaceQuery": want ReplaceFullPath or ReplacePrefixMatch`, false},
		{"rewrite path with LF", "HTTPRoute", `filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: "/a\nb"}}}]`,
			`spec.rules[0].filters[0]: urlRewrite.path.replaceFullPath: invalid value "/a\nb": want at most 1024 bytes without spaces or control characters`, false},
		{"CORS origin over Envoy's program size", "HTTPRoute", `filters: [{type: CORS, cors: {allowOrigins: ["https://` + long + `.example"]}}]`,
			`spec.rules[0].filters[0]: cors.allowOrigins[0]: "https://` + long + `.example": Envoy matches it with the regex "(?i)https://` + long + `\\.example(:443)?": RE2 program size 117 is over Envoy's limit of 100`, false},
		{"duration not GEP-2257", "HTTPRoute", `timeouts: {request: 1.5h}`,
			`spec.rules[0].timeouts.request: invalid value "1.5h": want a Gateway API duration (GEP-2257)`, false},
		{"duration in microseconds", "HTTPRoute", `timeouts: {backendRequest: 100us}`,
			`spec.rules[0].timeouts.backendRequest: invalid value "100us": want a Gateway API duration`, false},
		{"duration of six digits", "HTTPRoute", `retry: {backoff: 999999h}`,
			`spec.rules[0].retry.backoff: invalid value "999999h": want a Gateway API duration`, false},
		{"backend timeout over the request timeout", "HTTPRoute", `timeouts: {request: 1s, backendRequest: 2s}`,
			`spec.rules[0].timeouts.backendRequest: invalid value "2s": backendRequest 2s exceeds request 1s`, false},
		{"retry attempts 0", "HTTPRoute", `retry: {attempts: 0}`,
			`spec.rules[0].retry.attempts: invalid value "0": want 1-2147483647 (HTTPRouteRetry.attempts)`, false},
		{"retry code 200", "HTTPRoute", `retry: {codes: [503, 200]}`,
			`spec.rules[0].retry.codes[1]: invalid value "200": want 400-599 (HTTPRouteRetryStatusCode)`, false},
		{"gRPC method match with neither service nor method", "GRPCRoute", `matches: [{method: {type: Exact}}]`,
			`spec.rules[0].matches[0].method: invalid value "": want service and/or method`, true},
		{"unknown gRPC method match type", "GRPCRoute", `matches: [{method: {type: Prefix, service: shop.Cart}}]`,
			`spec.rules[0].matches[0].method.type: invalid value "Prefix": want Exact or RegularExpression`, true},
		{"gRPC service regex syntax", "GRPCRoute", `matches: [{method: {type: RegularExpression, service: "a("}}]`,
			`spec.rules[0].matches[0].method.service: invalid value "a(": not an RE2 expression: missing closing )`, true},
		{"gRPC regex that breaks Envoy's embedding", "GRPCRoute", `matches: [{method: {type: RegularExpression, service: '\Qshop.Cart'}}]`,
			`spec.rules[0].matches[0].method: invalid value "\\Qshop.Cart/": Envoy matches it as the path regex "/(\\Qshop.Cart)/([^/]+)": not an RE2 expression: missing closing )`, true},
		{"exact gRPC method whose path regex is too large", "GRPCRoute", `matches: [{method: {method: ` + "M" + long + `}}]`,
			`spec.rules[0].matches[0].method: invalid value "/M` + long + `": Envoy matches it as the path regex "/([^/]+)/(M` + long + `)": RE2 program size`, true},
		{"unknown gRPC header match type", "GRPCRoute", `matches: [{headers: [{name: x-a, type: Prefix, value: v}]}]`,
			`spec.rules[0].matches[0].headers[0].type: invalid value "Prefix"`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := "  parentRefs:\n  - {group: \"\", kind: Service, name: web}\n"
			in := routeSources(t, route(tc.kind, "shop", "r", 0, parent+"  rules:\n  - "+tc.rule+"\n"))
			var r Route
			if tc.kind == "GRPCRoute" {
				r = GRPCRouteModel(in.GRPCRoutes[0])
			} else {
				r = HTTPRouteModel(in.HTTPRoutes[0])
			}
			rule := r.Rules[0]
			if len(rule.Unsupported) != 1 || !strings.Contains(rule.Unsupported[0], tc.want) {
				t.Fatalf("Unsupported = %q\nwant one entry containing %q", rule.Unsupported, tc.want)
			}
			if served, _ := rule.Served(); served {
				t.Error("the rule is served")
			}
			if rule.BadMatches != tc.badMatch {
				t.Errorf("BadMatches = %t, want %t", rule.BadMatches, tc.badMatch)
			}
			if tc.badMatch && strings.Contains(tc.rule, "/ok") && (len(rule.Matches) != 1 || rule.Matches[0].Path.Value != "/ok") {
				t.Errorf("matches = %+v, want the good one only", rule.Matches)
			}
			got, _ := roundTrip(t, r)
			sameRoute(t, r, got)
		})
	}
}

// TestRouteModelEdgeValues: values at the edge of what is valid are kept as the spec says: the
// first of equivalent header names counts, a retry backoff of 0s is 1 ms, and what Envoy takes
// is not refused.
func TestRouteModelEdgeValues(t *testing.T) {
	in := routeSources(t, route("HTTPRoute", "shop", "r", 0, webParent+`  rules:
  - matches: [{path: {type: RegularExpression, value: '`+strings.Repeat("x", 96)+`'}, headers: [{name: X-A, value: "1"}, {name: x-a, value: "2"}], queryParams: [{name: q, value: "1"}, {name: q, value: "2"}]}]
    filters:
    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Foo, value: first}, {name: foo, value: second}], add: [{name: X-B, value: "100%"}], remove: [x-c, X-C]}}
    retry: {attempts: 1, codes: [400, 599], backoff: 0s}
    timeouts: {request: 99999h99999m99999s99999ms, backendRequest: 0s}
`))
	r := HTTPRouteModel(in.HTTPRoutes[0])
	rule := r.Rules[0]
	if len(rule.Unsupported) != 0 || rule.BadMatches {
		t.Fatalf("Unsupported = %q, BadMatches %t: want neither", rule.Unsupported, rule.BadMatches)
	}
	m := rule.Matches[0]
	if len(m.Headers) != 1 || m.Headers[0].Value != "1" || len(m.Query) != 1 || m.Query[0].Value != "1" {
		t.Errorf("match = %+v, want the first header and query entries only", m)
	}
	h := rule.Filters[0].Headers
	if len(h.Set) != 1 || h.Set[0] != (Header{"foo", "first"}) || len(h.Remove) != 1 || h.Remove[0] != "x-c" || h.Add[0].Value != "100%" {
		t.Errorf("header modifier = %+v, want set foo=first only, remove x-c once", h)
	}
	if b := rule.Retry.Backoff; b == nil || *b != time.Millisecond {
		t.Errorf("backoff = %v, want 1ms for 0s", b)
	}
	want := 99999*time.Hour + 99999*time.Minute + 99999*time.Second + 99999*time.Millisecond
	if rq := rule.Timeouts.Request; rq == nil || *rq != want {
		t.Errorf("request timeout = %v, want %v", rq, want)
	}
	got, _ := roundTrip(t, r)
	sameRoute(t, r, got)
}
