package model

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	"sigs.k8s.io/yaml"
)

// routeSources is a cluster with services in two mesh namespaces (shop, client, other) and the
// routes given as YAML documents (HTTPRoute, GRPCRoute, TCPRoute, TLSRoute or UDPRoute, by
// kind).
func routeSources(t *testing.T, docs ...string) Sources {
	t.Helper()
	in := Sources{
		Cluster:        "a",
		MeshNamespaces: map[string]bool{"shop": true, "client": true, "other": true},
		Services: []*corev1.Service{
			svc("shop", "web", "10.96.0.10", t0,
				corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
				corev1.ServicePort{Name: "admin", Port: 8080, TargetPort: intstr.FromInt32(9090)},
				corev1.ServicePort{Name: "db", Port: 5432, AppProtocol: ptr("tcp")}),
			svc("shop", "web-v2", "10.96.0.11", t0, corev1.ServicePort{Name: "http", Port: 80}),
			svc("shop", "rpc", "10.96.0.12", t0, corev1.ServicePort{Name: "grpc", Port: 9000, AppProtocol: ptr("grpc")}),
			svc("other", "mirror", "10.96.0.13", t0, corev1.ServicePort{Name: "http", Port: 80}),
			svc("shop", "pods", "None", t0, corev1.ServicePort{Name: "http", Port: 80}),
			svc("nomesh", "web", "10.96.0.14", t0, corev1.ServicePort{Name: "http", Port: 80}),
		},
		Imports: []*mcsv1beta1.ServiceImport{{}},
	}
	ext := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com",
		Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	ext.Namespace, ext.Name = "shop", "ext"
	in.Services = append(in.Services, ext)
	in.Imports[0].Namespace, in.Imports[0].Name = "shop", "web"
	in.Imports[0].Spec.IPs = []string{"10.97.0.10"}
	far := &mcsv1beta1.ServiceImport{} // exported elsewhere, no clusterset IP yet
	far.Namespace, far.Name = "shop", "far"
	far.Spec.Ports = []mcsv1beta1.ServicePort{{Name: "http", Port: 80}}
	in.Imports = append(in.Imports, far)
	for i, d := range docs {
		var tm struct{ Kind string }
		if err := yaml.Unmarshal([]byte(d), &tm); err != nil {
			t.Fatalf("route %d: %v", i, err)
		}
		switch tm.Kind {
		case "TCPRoute":
			in.Edge.TCPRoutes = append(in.Edge.TCPRoutes, decode[gwv1.TCPRoute](t, d))
		case "TLSRoute":
			in.Edge.TLSRoutes = append(in.Edge.TLSRoutes, decode[gwv1.TLSRoute](t, d))
		case "UDPRoute":
			in.Edge.UDPRoutes = append(in.Edge.UDPRoutes, decode[gwv1.UDPRoute](t, d))
		case "GRPCRoute":
			r := &gwv1.GRPCRoute{}
			if err := yaml.UnmarshalStrict([]byte(d), r); err != nil {
				t.Fatalf("route %d: %v", i, err)
			}
			in.GRPCRoutes = append(in.GRPCRoutes, r)
		default:
			r := &gwv1.HTTPRoute{}
			if err := yaml.UnmarshalStrict([]byte(d), r); err != nil {
				t.Fatalf("route %d: %v", i, err)
			}
			in.HTTPRoutes = append(in.HTTPRoutes, r)
		}
	}
	return in
}

// route is an HTTPRoute named name in ns, created at t0 plus age seconds, with spec as YAML
// (indented by two spaces under spec:).
func route(kind, ns, name string, age int, spec string) string {
	return fmt.Sprintf("kind: %s\nmetadata:\n  namespace: %s\n  name: %s\n  generation: 3\n  creationTimestamp: %q\nspec:\n%s",
		kind, ns, name, t0.Add(time.Duration(age)*time.Second).Format(time.RFC3339), spec)
}

const webParent = "  parentRefs:\n  - {group: \"\", kind: Service, name: web, namespace: shop}\n"

// entryNames lists entries as "<route>/<rule>.<match>".
func entryNames(es []RouteEntry) string {
	var s []string
	for _, e := range es {
		s = append(s, fmt.Sprintf("%s/%d.%d", e.Route.Name, e.RuleIndex, e.MatchIndex))
	}
	return strings.Join(s, " ")
}

func statusOf(t *testing.T, m *Mesh, name string) RouteStatus {
	t.Helper()
	for _, s := range m.RouteStatuses() {
		if s.Route.Name == name {
			return s
		}
	}
	t.Fatalf("no status for route %s in %+v", name, m.RouteStatuses())
	return RouteStatus{}
}

var web80 = Frontend{Service: ServiceKey{"shop", "web"}, Port: 80}

func TestResolveRoutesPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name   string
		routes []string
		want   string
	}{{
		name: "exact over prefix over regex, longer prefix first, trailing slash ignored",
		routes: []string{route("HTTPRoute", "shop", "r", 0, webParent+`  rules:
  - matches: [{path: {type: RegularExpression, value: "/a.*/b/c/d/e"}}]
  - matches: [{path: {type: PathPrefix, value: "/a"}}]
  - matches: [{path: {type: PathPrefix, value: "/a/b/"}}]
  - matches: [{path: {type: Exact, value: "/"}}]
  - matches: [{path: {type: PathPrefix, value: "/a/bc"}}]
`)},
		want: "r/3.0 r/4.0 r/2.0 r/1.0 r/0.0",
	}, {
		name: "then method, header count, query count",
		routes: []string{route("HTTPRoute", "shop", "r", 0, webParent+`  rules:
  - matches: [{path: {value: "/x"}, queryParams: [{name: a, value: "1"}, {name: b, value: "2"}]}]
  - matches: [{path: {value: "/x"}, headers: [{name: a, value: "1"}]}]
  - matches: [{path: {value: "/x"}, method: GET}]
  - matches: [{path: {value: "/x"}, headers: [{name: a, value: "1"}, {name: b, value: "1"}]}]
  - matches: [{path: {value: "/x"}}]
`)},
		want: "r/2.0 r/3.0 r/1.0 r/0.0 r/4.0",
	}, {
		name: "a rule without matches is PathPrefix / and duplicate header names count once",
		routes: []string{route("HTTPRoute", "shop", "r", 0, webParent+`  rules:
  - backendRefs: [{name: web, port: 80}]
  - matches: [{headers: [{name: A, value: "1"}, {name: a, value: "2"}]}]
  - matches: [{headers: [{name: a, value: "1"}, {name: b, value: "2"}]}]
`)},
		want: "r/2.0 r/1.0 r/0.0",
	}, {
		name: "ties across routes: the oldest, then namespace/name; within a route, rule then match order",
		routes: []string{
			route("HTTPRoute", "shop", "b", 0, webParent+"  rules:\n  - matches: [{path: {value: /p}}, {path: {value: /p}}]\n"),
			route("HTTPRoute", "shop", "a", 0, webParent+"  rules:\n  - matches: [{path: {value: /p}}]\n  - matches: [{path: {value: /p}}]\n"),
			route("HTTPRoute", "shop", "old", -10, webParent+"  rules:\n  - matches: [{path: {value: /p}}]\n"),
		},
		want: "old/0.0 a/0.0 a/1.0 b/0.0 b/0.1",
	}, {
		name: "gRPC: longer service, then longer method, then headers",
		routes: []string{route("GRPCRoute", "shop", "g", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: rpc}\n"+`  rules:
  - matches: [{method: {method: Get}}]
  - matches: [{method: {service: pkg.Svc}}]
  - matches: [{method: {service: pkg.Svc, method: Get}}]
  - matches: [{method: {service: pkg.Svc}, headers: [{name: x, value: "1"}]}]
  - {}
`)},
		want: "g/2.0 g/3.0 g/1.0 g/0.0 g/4.0",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := Assemble(1, routeSources(t, tc.routes...))
			fe := web80
			if strings.Contains(tc.routes[0], "name: rpc") {
				fe = Frontend{Service: ServiceKey{"shop", "rpc"}, Port: 9000}
			}
			if got := entryNames(m.Routing.For(fe, "client")); got != tc.want {
				t.Errorf("order = %s\nwant    %s", got, tc.want)
			}
		})
	}
}

func TestResolveRoutesProducerConsumerAndPorts(t *testing.T) {
	in := routeSources(t,
		route("HTTPRoute", "shop", "producer", 0, webParent+"  rules:\n  - backendRefs: [{name: web-v2, port: 80}]\n"),
		route("HTTPRoute", "client", "consumer", 0, webParent+"  rules:\n  - backendRefs: [{name: web, namespace: shop, port: 80}]\n"),
		route("HTTPRoute", "shop", "admin-only", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: web, port: 8080}\n  rules:\n  - {}\n"),
		route("HTTPRoute", "shop", "by-name", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: web, sectionName: admin}\n  rules:\n  - {}\n"),
		route("HTTPRoute", "shop", "clusterset", 0, "  parentRefs:\n  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web}\n  rules:\n  - {}\n"),
	)
	m := Assemble(1, in)
	if got := entryNames(m.Routing.For(web80, "other")); got != "producer/0.0" {
		t.Errorf("callers in other: %s, want the producer route", got)
	}
	if got := entryNames(m.Routing.For(web80, "shop")); got != "producer/0.0" {
		t.Errorf("callers in shop: %s, want the producer route", got)
	}
	if got := entryNames(m.Routing.For(web80, "client")); got != "consumer/0.0" {
		t.Errorf("callers in client: %s, want only the consumer route (it replaces the producer's)", got)
	}
	admin := Frontend{Service: ServiceKey{"shop", "web"}, Port: 8080}
	if got := entryNames(m.Routing.For(admin, "other")); got != "admin-only/0.0 by-name/0.0 producer/0.0" {
		t.Errorf("port 8080: %s, want the routes bound to it", got)
	}
	if got := entryNames(m.Routing.For(admin, "client")); got != "consumer/0.0" {
		t.Errorf("port 8080 from client: %s, want the consumer route (it binds to every port)", got)
	}
	if got := entryNames(m.Routing.For(Frontend{Service: ServiceKey{"shop", "web"}, Import: true, Port: 80}, "other")); got != "clusterset/0.0" {
		t.Errorf("clusterset frontend: %s, want the ServiceImport route only", got)
	}
	if got := m.Routing.For(Frontend{Service: ServiceKey{"shop", "web"}, Port: 5432}, "other"); got != nil {
		t.Errorf("TCP port 5432 got HTTP routes %s", entryNames(got))
	}
	if got := m.Routing.ConsumerNamespaces; len(got) != 1 || got[0] != "client" {
		t.Errorf("consumer namespaces = %v, want [client]", got)
	}
	st := statusOf(t, m, "producer").Parents[0]
	if !st.Accepted.Status || st.Accepted.Message != "bound to Service shop/web:80, Service shop/web:8080" || !st.ResolvedRefs.Status {
		t.Errorf("producer status = %+v", st)
	}
	if s := statusOf(t, m, "producer"); s.Generation != 3 {
		t.Errorf("generation = %d, want 3", s.Generation)
	}
}

func TestResolveRoutesRefusals(t *testing.T) {
	parent := func(extra string) string {
		return "  parentRefs:\n  - {group: \"\", kind: Service, name: web" + extra + "}\n"
	}
	for _, tc := range []struct {
		name, route string
		// accepted and resolved are "<status> <reason>"; message is a substring of the failing
		// condition's message.
		accepted, resolved, partial, message string
	}{{
		name: "no such port", route: route("HTTPRoute", "shop", "r", 0, parent(", port: 81")+"  rules:\n  - {}\n"),
		accepted: "false NoMatchingParent", resolved: "true ResolvedRefs", message: "Service shop/web has no port 81",
	}, {
		name: "port and sectionName must name the same port", route: route("HTTPRoute", "shop", "r", 0, parent(", port: 80, sectionName: admin")+"  rules:\n  - {}\n"),
		accepted: "false NoMatchingParent", resolved: "true ResolvedRefs", message: `no port 80 named "admin"`,
	}, {
		name: "a TCP port", route: route("HTTPRoute", "shop", "r", 0, parent(", port: 5432")+"  rules:\n  - {}\n"),
		accepted: "false NoMatchingParent", resolved: "true ResolvedRefs", message: "port 5432 is TCP",
	}, {
		name: "headless parent", route: route("HTTPRoute", "shop", "r", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: pods}\n  rules:\n  - {}\n"),
		accepted: "false NoMatchingParent", resolved: "true ResolvedRefs", message: "headless",
	}, {
		name: "parent outside the mesh", route: route("HTTPRoute", "nomesh", "r", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: web}\n  rules:\n  - {}\n"),
		accepted: "false NoMatchingParent", resolved: "true ResolvedRefs", message: "Service nomesh/web: not found in a mesh namespace",
	}, {
		name: "missing backend", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - backendRefs: [{name: gone, port: 80}]\n"),
		accepted: "true Accepted", resolved: "false BackendNotFound", message: "backendRef Service shop/gone: not found",
	}, {
		name: "backend without the port", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - backendRefs: [{name: web-v2, port: 81}]\n"),
		accepted: "true Accepted", resolved: "false BackendNotFound", message: "no port 81",
	}, {
		name: "backend of another kind", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - backendRefs: [{group: example.com, kind: Bucket, name: b}]\n"),
		accepted: "true Accepted", resolved: "false InvalidKind", message: `backendRef Bucket "b"`,
	}, {
		name: "TCP backend", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - backendRefs: [{name: web, port: 5432}]\n"),
		accepted: "true Accepted", resolved: "false UnsupportedProtocol", message: "port 5432 is TCP",
	}, {
		name: "gRPC backend on an HTTP/1.1 port", route: route("GRPCRoute", "shop", "r", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: rpc}\n  rules:\n  - backendRefs: [{name: web, port: 80}]\n"),
		accepted: "true Accepted", resolved: "false UnsupportedProtocol", message: "needs appProtocol grpc",
	}, {
		name: "backend in another namespace needs no ReferenceGrant", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - backendRefs: [{name: mirror, namespace: other, port: 80}]\n"),
		accepted: "true Accepted", resolved: "true ResolvedRefs",
	}, {
		name: "one rule unsupported", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - {}\n  - sessionPersistence: {sessionName: s}\n"),
		accepted: "true Accepted", resolved: "true ResolvedRefs", partial: "Dropped Rule(s): rule 1: spec.rules[1].sessionPersistence: not supported",
	}, {
		name: "a custom filter fails closed", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - {}\n  - filters: [{type: ExtensionRef, extensionRef: {group: x.io, kind: F, name: f}}]\n"),
		accepted: "true Accepted", resolved: "true ResolvedRefs", partial: "Dropped Rule(s): rule 1 (its requests are answered with an error, not passed to other rules): spec.rules[1].filters[0]: type \"ExtensionRef\": not supported",
	}, {
		name: "every rule fails closed: still bound", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - backendRefs: [{name: web-v2, port: 80, filters: [{type: ExtensionRef, extensionRef: {group: x.io, kind: F, name: f}}]}]\n"),
		accepted: "true Accepted", resolved: "true ResolvedRefs", partial: "Dropped Rule(s): rule 0 (its requests are answered with an error",
	}, {
		name: "mirror beside a redirect", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: RequestRedirect, requestRedirect: {hostname: h}}, {type: RequestMirror, requestMirror: {backendRef: {name: web-v2, port: 80}}}]\n"),
		accepted: "false IncompatibleFilters", resolved: "true ResolvedRefs", message: "RequestMirror and RequestRedirect cannot be combined",
	}, {
		name: "every rule unsupported", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - sessionPersistence: {sessionName: s}\n"),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: "spec.rules[0].sessionPersistence: not supported",
	}, {
		name: "rewrite with redirect", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: URLRewrite, urlRewrite: {hostname: h}}, {type: RequestRedirect, requestRedirect: {hostname: h}}]\n"),
		accepted: "false IncompatibleFilters", resolved: "true ResolvedRefs", message: "URLRewrite and RequestRedirect cannot be combined",
	}, {
		name: "prefix rewrite under an exact match", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - matches: [{path: {type: Exact, value: /a}}]\n    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]\n"),
		accepted: "false IncompatibleFilters", resolved: "true ResolvedRefs", message: "ReplacePrefixMatch needs PathPrefix matches, not Exact",
	}, {
		name: "redirect status 305", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: RequestRedirect, requestRedirect: {statusCode: 305}}]\n"),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: "requestRedirect.statusCode: value 305: want 301, 302, 303, 307 or 308",
	}, {
		name: "bad mirror fraction", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web-v2, port: 80}, fraction: {numerator: 3, denominator: 2}}}]\n"),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: "fraction 3/2",
	}, {
		name: "CORS origin with a path", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: CORS, cors: {allowOrigins: [\"https://a.example/x\"]}}]\n"),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: `cors.allowOrigins[0]: "https://a.example/x"`,
	}, {
		name: "CORS origin wildcard inside the host", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: CORS, cors: {allowOrigins: [\"https://a.*.example\"]}}]\n"),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: `cors.allowOrigins[0]: "https://a.*.example"`,
	}, {
		name: "CORS header name with a space", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: CORS, cors: {allowHeaders: [\"x-a, x-b\"]}}]\n"),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: `cors.allowHeaders[0]: "x-a, x-b"`,
	}, {
		name: "ExternalName backend", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - backendRefs: [{name: ext, port: 80}]\n"),
		accepted: "true Accepted", resolved: "false UnsupportedProtocol", message: "backendRef Service shop/ext is of type ExternalName",
	}, {
		name: "a regex Envoy would refuse, the only rule", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - matches: [{path: {type: RegularExpression, value: \"/a(\"}}]\n"),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: `no rule can be served: rule 0: spec.rules[0].matches[0].path.value: invalid value "/a(": not an RE2 expression`,
	}, {
		name: "setting Host, one rule of two", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - {}\n  - filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Host, value: h}]}}]\n"),
		accepted: "true Accepted", resolved: "true ResolvedRefs", partial: `Dropped Rule(s): rule 1: spec.rules[1].filters[0]: requestHeaderModifier.set[0].name: invalid value "host"`,
	}, {
		name: "a GRPCRoute without rules", route: route("GRPCRoute", "shop", "r", 0, parent("")),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: "the GRPCRoute has no rules: nothing to route; give it a rule (a rule without matches matches every request)",
	}, {
		name: "ServiceImport backend without a clusterset IP", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - backendRefs: [{group: multicluster.x-k8s.io, kind: ServiceImport, name: far, port: 80}]\n"),
		accepted: "true Accepted", resolved: "false BackendNotFound", message: "backendRef ServiceImport shop/far has no clusterset IP yet",
	}, {
		name: "a header the proxy owns", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Aether-Mirror-0, value: v}]}}]\n"),
		accepted: "false UnsupportedValue", resolved: "true ResolvedRefs", message: "the node proxy's own header",
	}, {
		name: "mirror to a missing backend", route: route("HTTPRoute", "shop", "r", 0, parent("")+"  rules:\n  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: gone, port: 80}}}]\n"),
		accepted: "true Accepted", resolved: "false BackendNotFound", message: "shop/gone",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := Assemble(1, routeSources(t, tc.route))
			st := statusOf(t, m, "r")
			if len(st.Parents) != 1 {
				t.Fatalf("parents = %+v, want one", st.Parents)
			}
			p := st.Parents[0]
			cond := func(c Condition) string { return fmt.Sprintf("%t %s", c.Status, c.Reason) }
			if cond(p.Accepted) != tc.accepted || cond(p.ResolvedRefs) != tc.resolved {
				t.Errorf("Accepted %q (%s), ResolvedRefs %q (%s); want %q, %q", cond(p.Accepted), p.Accepted.Message,
					cond(p.ResolvedRefs), p.ResolvedRefs.Message, tc.accepted, tc.resolved)
			}
			msg := p.Accepted.Message
			if p.Accepted.Status {
				msg = p.ResolvedRefs.Message
			}
			if !strings.Contains(msg, tc.message) {
				t.Errorf("message %q, want it to contain %q", msg, tc.message)
			}
			switch {
			case tc.partial == "" && p.PartiallyInvalid != nil:
				t.Errorf("PartiallyInvalid = %+v, want none", p.PartiallyInvalid)
			case tc.partial != "" && (p.PartiallyInvalid == nil || !strings.HasPrefix(p.PartiallyInvalid.Message, tc.partial)):
				t.Errorf("PartiallyInvalid = %+v, want a message starting %q", p.PartiallyInvalid, tc.partial)
			}
			served := m.Routing.For(web80, "client")
			if !p.Accepted.Status && served != nil && strings.Contains(tc.route, "name: web}") {
				t.Errorf("a route not accepted is served: %s", entryNames(served))
			}
		})
	}
}

func TestResolveRoutesTypeConflict(t *testing.T) {
	m := Assemble(1, routeSources(t,
		route("HTTPRoute", "shop", "h", -100, "  parentRefs:\n  - {group: \"\", kind: Service, name: rpc}\n  rules:\n  - {}\n"),
		route("GRPCRoute", "shop", "g", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: rpc}\n  rules:\n  - {}\n"),
		route("HTTPRoute", "client", "hc", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: rpc, namespace: shop}\n  rules:\n  - {}\n"),
	))
	rpc := Frontend{Service: ServiceKey{"shop", "rpc"}, Port: 9000}
	if got := entryNames(m.Routing.For(rpc, "other")); got != "g/0.0" {
		t.Errorf("producer routes = %s, want the GRPCRoute only", got)
	}
	if h := statusOf(t, m, "h").Parents[0].Accepted; h.Status || h.Reason != ReasonConflicted {
		t.Errorf("HTTPRoute status = %+v, want Accepted=False Conflicted", h)
	}
	// A consumer HTTPRoute is in another group: no conflict with the producer GRPCRoute.
	if got := entryNames(m.Routing.For(rpc, "client")); got != "hc/0.0" {
		t.Errorf("consumer routes = %s, want the consumer HTTPRoute", got)
	}
}

func TestRouteModelDefaultsAndFilters(t *testing.T) {
	in := routeSources(t, route("HTTPRoute", "shop", "r", 0, webParent+`  - {name: gw, kind: Gateway}
  hostnames: [ignored.example]
  rules:
`+everyFieldRules))
	r := HTTPRouteModel(in.HTTPRoutes[0])
	if len(r.Parents) != 1 || r.Parents[0].Index != 0 {
		t.Fatalf("parents = %+v, want the Service parent only (index 0), not the Gateway", r.Parents)
	}
	m := r.Rules[0].Matches[0]
	if m.Path != (PathMatch{Type: MatchPathPrefix, Value: "/api/"}) || m.Method != "POST" ||
		len(m.Headers) != 1 || m.Headers[0] != (StringMatch{Type: MatchRegex, Name: "x-env", Value: "p.*"}) ||
		len(m.Query) != 1 || m.Query[0].Value != "1" {
		t.Errorf("match = %+v", m)
	}
	f := r.Rules[0].Filters
	if len(f) != 5 || f[0].Headers.Set[0].Name != "x-a" || f[0].Headers.Remove[0] != "x-c" ||
		f[1].Mirror.Numerator != 25 || f[1].Mirror.Denominator != 100 ||
		f[2].Mirror.Numerator != 1 || f[2].Mirror.Denominator != 3 || f[2].Mirror.Backend.Service != (ServiceKey{"other", "mirror"}) ||
		f[3].Rewrite.Path.Type != ReplacePrefixMatch || f[3].Rewrite.Path.Value != "/v2" ||
		f[4].CORS.MaxAge != 5 || !f[4].CORS.AllowCredentials {
		t.Errorf("filters = %+v", f)
	}
	b := r.Rules[0].Backends
	if len(b) != 3 || b[0].Weight != 90 || b[1].Weight != 0 || len(b[1].Filters) != 1 || b[2].Kind != BackendServiceImport || b[2].Weight != 1 {
		t.Errorf("backends = %+v", b)
	}
	if rt := r.Rules[0]; *rt.Timeouts.Request != 2*time.Second || *rt.Timeouts.BackendRequest != 500*time.Millisecond ||
		*rt.Retry.Attempts != 3 || rt.Retry.Codes[0] != 503 || *rt.Retry.Backoff != 100*time.Millisecond || len(rt.Unsupported) != 0 {
		t.Errorf("rule = %+v", rt)
	}
	if d := r.Rules[1].Filters[0].Redirect; d.Scheme != "https" || d.Port != 8443 || d.StatusCode != 308 || d.Path.Value != "/new" {
		t.Errorf("redirect = %+v", d)
	}
	if r.Rules[1].Matches[0].Path != (PathMatch{Type: MatchPathPrefix, Value: "/"}) {
		t.Errorf("default match = %+v, want PathPrefix /", r.Rules[1].Matches[0])
	}
	mesh := Assemble(1, in)
	st := statusOf(t, mesh, "r").Parents[0]
	if !st.Accepted.Status || !st.ResolvedRefs.Status {
		t.Errorf("status = %+v", st)
	}
	if e := mesh.Routing.For(web80, "x"); len(e) != 2 || e[0].Rule.Backends[2].Invalid != nil {
		t.Errorf("entries = %+v, want 2 with a valid ServiceImport backend", e)
	}
}

// TestResolveRoutesPartlyConflicted: an HTTPRoute bound to every port of a Service that loses one
// port to a GRPCRoute stays Accepted, and its message names where it is bound and where not.
func TestResolveRoutesPartlyConflicted(t *testing.T) {
	m := Assemble(1, routeSources(t,
		route("HTTPRoute", "shop", "h", 0, webParent+"  rules:\n  - {}\n"),
		route("GRPCRoute", "shop", "g", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: web, port: 80}\n  rules:\n  - {}\n"),
	))
	a := statusOf(t, m, "h").Parents[0].Accepted
	want := "bound to Service shop/web:8080; not to Service shop/web:80, where a GRPCRoute is bound and wins over an HTTPRoute (GEP-1294, Route types)"
	if !a.Status || a.Message != want {
		t.Errorf("Accepted = %+v, want True with message %q", a, want)
	}
	if got := entryNames(m.Routing.For(Frontend{Service: ServiceKey{"shop", "web"}, Port: 8080}, "x")); got != "h/0.0" {
		t.Errorf("port 8080 routes = %s, want the HTTPRoute", got)
	}
}

// TestFailClosedKeepsItsGoodMatches: a rule with an ExternalAuth filter and one match that
// cannot be built still answers its other match with an error; its requests never fall through
// to the catch-all rule (HTTPRouteFilter.type: the filter MUST NOT be skipped).
func TestFailClosedKeepsItsGoodMatches(t *testing.T) {
	m := Assemble(1, routeSources(t, route("HTTPRoute", "shop", "r", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: web}\n  rules:\n"+
		"  - matches: [{path: {type: RegularExpression, value: \"/a(\"}}, {path: {type: Exact, value: /admin}}]\n"+
		"    filters: [{type: ExternalAuth, externalAuth: {protocol: HTTP, backendRef: {name: web, port: 80}}}]\n"+
		"  - matches: [{path: {type: PathPrefix, value: /}}]\n")))
	es := m.Routing.For(web80, "client")
	if got := entryNames(es); got != "r/0.0 r/1.0" {
		t.Fatalf("entries = %s, want the guarded rule's good match, then the catch-all", got)
	}
	if served, asError := es[0].Rule.Served(); !served || !asError || es[0].Match.Path.Value != "/admin" {
		t.Errorf("guarded rule: served %t as error %t, match %+v; want /admin answered with an error", served, asError, es[0].Match.Path)
	}
}

// everyFieldRules are the spec.rules of an HTTPRoute on Service web that use every match, filter
// and rule field the model converts (YAML, indented for route's spec).
const everyFieldRules = `  - name: main
    matches: [{path: {value: /api/}, headers: [{name: X-Env, type: RegularExpression, value: "p.*"}], queryParams: [{name: q, value: "1"}, {name: q, value: "2"}], method: POST}]
    filters:
    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-A, value: "1"}], add: [{name: X-B, value: "2"}], remove: [X-C]}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: mirror, namespace: other, port: 80}, percent: 25}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: mirror, namespace: other, port: 80}, fraction: {numerator: 1, denominator: 3}}}
    - {type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}
    - {type: CORS, cors: {allowOrigins: ["https://a.example"], allowMethods: [GET], allowCredentials: true}}
    backendRefs:
    - {name: web, port: 80, weight: 90}
    - {name: web-v2, port: 80, weight: 0, filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: X-V, value: "2"}]}}]}
    - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web, port: 80}
    timeouts: {request: 2s, backendRequest: 500ms}
    retry: {attempts: 3, codes: [503], backoff: 100ms}
  - filters: [{type: RequestRedirect, requestRedirect: {scheme: https, port: 8443, statusCode: 308, path: {type: ReplaceFullPath, replaceFullPath: /new}}}]
`
