package model

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// l4Sources is routeSources with the services the L4 tests bind to: shop/pg (TCP 5432 and
// 5433, HTTP 80, UDP 53; imported too, clusterset IP 10.97.0.20), its versions shop/pg-v1 and
// shop/pg-v2 and other/pg-x (TCP 5432), and shop/dns (UDP 53).
func l4Sources(t *testing.T, docs ...string) Sources {
	t.Helper()
	in := routeSources(t, docs...)
	in.Services = append(in.Services,
		svc("shop", "pg", "10.96.0.20", t0,
			corev1.ServicePort{Name: "db", Port: 5432, AppProtocol: ptr("tcp")},
			corev1.ServicePort{Name: "replica", Port: 5433, AppProtocol: ptr("tls")},
			corev1.ServicePort{Name: "http", Port: 80},
			corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}),
		svc("shop", "pg-v1", "10.96.0.21", t0, corev1.ServicePort{Name: "db", Port: 5432, AppProtocol: ptr("tcp")}),
		svc("shop", "pg-v2", "10.96.0.22", t0, corev1.ServicePort{Name: "db", Port: 5432, AppProtocol: ptr("tcp")}),
		svc("other", "pg-x", "10.96.0.23", t0, corev1.ServicePort{Name: "db", Port: 5432, AppProtocol: ptr("tcp")}),
		svc("shop", "dns", "10.96.0.24", t0, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}),
	)
	imp := &mcsv1beta1.ServiceImport{}
	imp.Namespace, imp.Name = "shop", "pg"
	imp.Spec.IPs = []string{"10.97.0.20"}
	in.Imports = append(in.Imports, imp)
	return in
}

// l4Summary renders the L4 routing as one line per frontend, sorted:
// "<frontend>: <route>[<hostnames>]-><ns>/<svc>:<port>*<weight>[!<reason>],...".
func l4Summary(rt *L4Routing) string {
	if rt == nil {
		return ""
	}
	var lines []string
	for _, fe := range slices.SortedFunc(maps.Keys(rt.Ports), Frontend.Compare) {
		lines = append(lines, l4PortSummary(fe, rt.Ports[fe]))
	}
	for _, fe := range slices.SortedFunc(maps.Keys(rt.UDP), Frontend.Compare) {
		lines = append(lines, "UDP "+l4PortSummary(fe, rt.UDP[fe]))
	}
	return strings.Join(lines, "\n")
}

func l4PortSummary(fe Frontend, p *L4Port) string {
	var rs []string
	for _, r := range p.Routes {
		var bs []string
		for _, b := range r.Backends {
			s := fmt.Sprintf("%s:%d*%d", b.Service, b.Port, b.Weight)
			if b.Invalid != nil {
				s += "!" + b.Invalid.Reason
			}
			bs = append(bs, s)
		}
		rs = append(rs, fmt.Sprintf("%s[%s]->%s", r.Route.Name, strings.Join(r.Hostnames, ","), strings.Join(bs, ",")))
	}
	return fe.String() + ": " + strings.Join(rs, " ")
}

// l4Status renders the status of route kind/name as one line per parent:
// "<Accepted>: <message> | <ResolvedRefs>: <message>[ | <PartiallyInvalid>]".
func l4Status(t *testing.T, m *Mesh, kind RouteKind, name string) string {
	t.Helper()
	for _, s := range m.RouteStatuses() {
		if s.Route.Kind != kind || s.Route.Name != name {
			continue
		}
		var lines []string
		for _, p := range s.Parents {
			l := fmt.Sprintf("%s: %s | %s: %s", cond(p.Accepted), p.Accepted.Message, cond(p.ResolvedRefs), p.ResolvedRefs.Message)
			if p.PartiallyInvalid != nil {
				l += " | PartiallyInvalid: " + p.PartiallyInvalid.Message
			}
			lines = append(lines, l)
		}
		return strings.Join(lines, "\n")
	}
	t.Fatalf("no status for %s %s", kind, name)
	return ""
}

// l4Doc is a route of kind in ns, created at t0 plus age seconds, with the parentRefs and the
// first rule's backendRefs given as YAML flow lists and, for a TLSRoute, hostnames (a flow list,
// "" for none).
func l4Doc(kind, ns, name string, age int, parents, hostnames, backends string) string {
	spec := "  parentRefs: " + parents + "\n"
	if hostnames != "" {
		spec += "  hostnames: " + hostnames + "\n"
	}
	return route(kind, ns, name, age, spec+"  rules:\n  - backendRefs: "+backends+"\n")
}

const (
	pg5432   = `[{group: "", kind: Service, name: pg, port: 5432}]`
	pgAny    = `[{group: "", kind: Service, name: pg}]`
	toV1     = `[{name: pg-v1, port: 5432}]`
	toV1V2   = `[{name: pg-v1, port: 5432, weight: 3}, {name: pg-v2, port: 5432, weight: 1}]`
	tcpPorts = "a TCPRoute binds to TCP ports only (appProtocol tcp, tls, mysql, ...; not HTTP, h2c, gRPC or UDP)"
)

// TestResolveL4Routes: TCPRoutes and TLSRoutes with a Service or ServiceImport parentRef bind to
// the parent's TCP ports (a given port or every TCP port), producer routes only; the oldest route
// takes a frontend except that TLSRoutes share one by hostname; UDPRoutes bind to UDP ports; each
// route's status is exact.
func TestResolveL4Routes(t *testing.T) {
	type want struct {
		kind   RouteKind
		name   string
		status string
	}
	for _, tc := range []struct {
		name    string
		routes  []string
		routing string
		status  []want
	}{{
		name:    "a TCPRoute on a TCP port, 3:1",
		routes:  []string{l4Doc("TCPRoute", "shop", "split", 0, pg5432, "", toV1V2)},
		routing: "Service shop/pg:5432: split[]->shop/pg-v1:5432*3,shop/pg-v2:5432*1",
		status:  []want{{KindTCPRoute, "split", "Accepted: bound to Service shop/pg:5432 | ResolvedRefs: "}},
	}, {
		name:   "no port: every TCP port of the Service, not its HTTP or UDP ports",
		routes: []string{l4Doc("TCPRoute", "shop", "all", 0, pgAny, "", toV1)},
		routing: "Service shop/pg:5432: all[]->shop/pg-v1:5432*1\n" +
			"Service shop/pg:5433: all[]->shop/pg-v1:5432*1",
		status: []want{{KindTCPRoute, "all", "Accepted: bound to Service shop/pg:5432, Service shop/pg:5433 | ResolvedRefs: "}},
	}, {
		name: "an HTTP port and a UDP port do not bind, naming the protocol",
		routes: []string{
			l4Doc("TCPRoute", "shop", "http", 0, `[{group: "", kind: Service, name: pg, port: 80}]`, "", toV1),
			l4Doc("TLSRoute", "shop", "http", 0, `[{group: "", kind: Service, name: pg, sectionName: http}]`, "[a.example]", toV1),
			l4Doc("TCPRoute", "shop", "udp", 0, `[{group: "", kind: Service, name: pg, port: 53}]`, "", toV1),
			l4Doc("TCPRoute", "shop", "http-only", 0, `[{group: "", kind: Service, name: web-v2}]`, "", toV1),
		},
		status: []want{
			{KindTCPRoute, "http", "!NoMatchingParent: Service shop/pg: port 80 is HTTP: " + tcpPorts + " | ResolvedRefs: "},
			{KindTLSRoute, "http", "!NoMatchingParent: Service shop/pg: port 80 is HTTP: a TLSRoute binds to TCP ports only (appProtocol tcp, tls, mysql, ...; not HTTP, h2c, gRPC or UDP) | ResolvedRefs: "},
			{KindTCPRoute, "udp", "!NoMatchingParent: Service shop/pg: port 53 is UDP: " + tcpPorts + " | ResolvedRefs: "},
			{KindTCPRoute, "http-only", "!NoMatchingParent: Service shop/web-v2: port 80 is HTTP: " + tcpPorts + " | ResolvedRefs: "},
		},
	}, {
		name: "parents that are not mesh frontends",
		routes: []string{
			l4Doc("TCPRoute", "shop", "headless", 0, `[{group: "", kind: Service, name: pods}]`, "", toV1),
			l4Doc("TCPRoute", "shop", "missing", 0, `[{group: "", kind: Service, name: nope, port: 5432}]`, "", toV1),
			l4Doc("TCPRoute", "shop", "no-port", 0, `[{group: "", kind: Service, name: pg, port: 6000}]`, "", toV1),
			l4Doc("TCPRoute", "shop", "far", 0, `[{group: multicluster.x-k8s.io, kind: ServiceImport, name: far}]`, "", toV1),
			l4Doc("TCPRoute", "shop", "gateway-only", 0, `[{name: gw}]`, "", toV1),
		},
		status: []want{
			{KindTCPRoute, "headless", "!NoMatchingParent: Service shop/pods is headless: it has no frontend to route (GEP-1294, Allowed service types) | ResolvedRefs: "},
			{KindTCPRoute, "missing", "!NoMatchingParent: Service shop/nope: not found in a mesh namespace (labelled aether.io/mesh=enabled) | ResolvedRefs: "},
			{KindTCPRoute, "no-port", "!NoMatchingParent: Service shop/pg has no port 6000 | ResolvedRefs: "},
			{KindTCPRoute, "far", "!NoMatchingParent: ServiceImport shop/far has no clusterset IP yet | ResolvedRefs: "},
			{KindTCPRoute, "gateway-only", ""},
		},
	}, {
		name:    "a ServiceImport parent binds the clusterset frontend",
		routes:  []string{l4Doc("TCPRoute", "shop", "imp", 0, `[{group: multicluster.x-k8s.io, kind: ServiceImport, name: pg, port: 5432}]`, "", toV1)},
		routing: "ServiceImport shop/pg:5432: imp[]->shop/pg-v1:5432*1",
		status:  []want{{KindTCPRoute, "imp", "Accepted: bound to ServiceImport shop/pg:5432 | ResolvedRefs: "}},
	}, {
		name: "consumer routes are refused",
		routes: []string{
			l4Doc("TCPRoute", "other", "consumer", 0, `[{group: "", kind: Service, name: pg, namespace: shop, port: 5432}]`, "", `[{name: pg-v1, namespace: shop, port: 5432}]`),
			l4Doc("TLSRoute", "other", "consumer", 0, `[{group: "", kind: Service, name: pg, namespace: shop, port: 5433}]`, "[a.example]", `[{name: pg-v1, namespace: shop, port: 5432}]`),
		},
		status: []want{
			{KindTCPRoute, "consumer", "!UnsupportedValue: consumer L4 routes are not supported: a TCPRoute in namespace other on Service shop/pg in another namespace is not served (only routes in the Service's namespace are) | ResolvedRefs: "},
			{KindTLSRoute, "consumer", "!UnsupportedValue: consumer L4 routes are not supported: a TLSRoute in namespace other on Service shop/pg in another namespace is not served (only routes in the Service's namespace are) | ResolvedRefs: "},
		},
	}, {
		name: "the oldest route takes a frontend, then namespace/name",
		routes: []string{
			l4Doc("TCPRoute", "shop", "new", 5, pg5432, "", toV1V2),
			l4Doc("TCPRoute", "shop", "b", 1, pg5432, "", toV1),
			l4Doc("TCPRoute", "shop", "a", 1, pg5432, "", toV1),
			l4Doc("TCPRoute", "shop", "old", 0, pg5432, "", toV1V2),
			l4Doc("TLSRoute", "shop", "tls", 2, pg5432, "[a.example]", toV1),
		},
		routing: "Service shop/pg:5432: old[]->shop/pg-v1:5432*3,shop/pg-v2:5432*1",
		status: []want{
			{KindTCPRoute, "old", "Accepted: bound to Service shop/pg:5432 | ResolvedRefs: "},
			{KindTCPRoute, "a", "!Conflicted: not bound: Service shop/pg:5432: TCPRoute shop/old is bound there and is older (the oldest route takes a frontend; TLSRoutes share one by hostname) | ResolvedRefs: "},
			{KindTCPRoute, "b", "!Conflicted: not bound: Service shop/pg:5432: TCPRoute shop/old is bound there and is older (the oldest route takes a frontend; TLSRoutes share one by hostname) | ResolvedRefs: "},
			{KindTLSRoute, "tls", "!Conflicted: not bound: Service shop/pg:5432: TCPRoute shop/old is bound there and is older (the oldest route takes a frontend; TLSRoutes share one by hostname) | ResolvedRefs: "},
		},
	}, {
		name: "a route losing one frontend of two stays Accepted and says where it is not bound",
		routes: []string{
			l4Doc("TCPRoute", "shop", "old", 0, pg5432, "", toV1),
			l4Doc("TCPRoute", "shop", "new", 1, pgAny, "", toV1V2),
		},
		routing: "Service shop/pg:5432: old[]->shop/pg-v1:5432*1\n" +
			"Service shop/pg:5433: new[]->shop/pg-v1:5432*3,shop/pg-v2:5432*1",
		status: []want{{KindTCPRoute, "new", "Accepted: bound to Service shop/pg:5433; not to Service shop/pg:5432: TCPRoute shop/old is bound there and is older | ResolvedRefs: "}},
	}, {
		name: "TLSRoutes share a frontend by hostname; no hostnames is every other name",
		routes: []string{
			l4Doc("TLSRoute", "shop", "a", 0, pg5432, "[a.example, shared.example, \"*.wild.example\", A.example]", toV1),
			l4Doc("TLSRoute", "shop", "b", 1, pg5432, "[shared.example, b.example]", toV1V2),
			l4Doc("TLSRoute", "shop", "c", 2, pg5432, "[shared.example]", toV1),
			l4Doc("TLSRoute", "shop", "any", 3, pg5432, "", toV1),
			l4Doc("TLSRoute", "shop", "any-too", 4, pg5432, "", toV1),
			l4Doc("TCPRoute", "shop", "tcp", 5, pg5432, "", toV1),
		},
		routing: "Service shop/pg:5432: a[a.example,shared.example,*.wild.example]->shop/pg-v1:5432*1 " +
			"b[b.example]->shop/pg-v1:5432*3,shop/pg-v2:5432*1 any[*]->shop/pg-v1:5432*1",
		status: []want{
			{KindTLSRoute, "a", "Accepted: bound to Service shop/pg:5432 | ResolvedRefs: "},
			{KindTLSRoute, "b", "Accepted: bound to Service shop/pg:5432; on Service shop/pg:5432: hostname shared.example is TLSRoute shop/a's | ResolvedRefs: "},
			{KindTLSRoute, "c", "!Conflicted: not bound: Service shop/pg:5432: each of its hostnames is an older TLSRoute's: hostname shared.example is TLSRoute shop/a's (the oldest route takes a frontend; TLSRoutes share one by hostname) | ResolvedRefs: "},
			{KindTLSRoute, "any", "Accepted: bound to Service shop/pg:5432 | ResolvedRefs: "},
			{KindTLSRoute, "any-too", "!Conflicted: not bound: Service shop/pg:5432: each of its hostnames is an older TLSRoute's: every hostname (it names none) is TLSRoute shop/any's (the oldest route takes a frontend; TLSRoutes share one by hostname) | ResolvedRefs: "},
			{KindTCPRoute, "tcp", "!Conflicted: not bound: Service shop/pg:5432: TLSRoute shop/a is bound there and is older (the oldest route takes a frontend; TLSRoutes share one by hostname) | ResolvedRefs: "},
		},
	}, {
		name: "invalid backends are listed with their reason; other namespaces need no grant",
		routes: []string{l4Doc("TCPRoute", "shop", "bad", 0, pg5432, "",
			`[{name: pg-v1, port: 5432}, {name: nope, port: 5432}, {name: pg-v1, port: 6000}, {name: dns, port: 53}, {name: ext, port: 80},
  {name: pg-x, namespace: other, port: 5432}, {name: web, port: 80}, {group: multicluster.x-k8s.io, kind: ServiceImport, name: pg, port: 5432},
  {kind: ConfigMap, name: pg}, {name: pg-v2, port: 5432, weight: 0}]`)},
		routing: "Service shop/pg:5432: bad[]->shop/pg-v1:5432*1,shop/nope:5432*1!BackendNotFound,shop/pg-v1:6000*1!BackendNotFound," +
			"shop/dns:53*1!UnsupportedProtocol,shop/ext:80*1!UnsupportedProtocol,other/pg-x:5432*1,shop/web:80*1,shop/pg:5432*1,shop/pg:0*1!InvalidKind,shop/pg-v2:5432*0",
		status: []want{{KindTCPRoute, "bad", "Accepted: bound to Service shop/pg:5432 | !BackendNotFound: backendRef Service shop/nope: not found in a mesh namespace; " +
			"backendRef Service shop/pg-v1: no port 6000; backendRef Service shop/dns port 53 is UDP: a TCPRoute backend must be a TCP port (any protocol but UDP); " +
			"backendRef Service shop/ext is of type ExternalName: aether routes to mesh Services with endpoints, not to a DNS alias (Gateway API: implementations SHOULD NOT support ExternalName Services); " +
			`backendRef ConfigMap "pg" (group ""): want a Service or a ServiceImport (group multicluster.x-k8s.io)`}},
	}, {
		name:    "a TLSRoute's backend must be a TCP port (a TCPRoute's may be HTTP)",
		routes:  []string{l4Doc("TLSRoute", "shop", "to-http", 0, pg5432, "[a.example]", `[{name: pg-v1, port: 5432}, {name: web, port: 80}]`)},
		routing: "Service shop/pg:5432: to-http[a.example]->shop/pg-v1:5432*1,shop/web:80*1!UnsupportedProtocol",
		status: []want{{KindTLSRoute, "to-http", "Accepted: bound to Service shop/pg:5432 | !UnsupportedProtocol: backendRef Service shop/web port 80 is HTTP: " +
			"a TLSRoute passes TLS on to its backend, which must be a TCP port (appProtocol tcp, tls, ...)"}},
	}, {
		name: "UDPRoutes bind to UDP ports, the oldest on each; a TCPRoute on the same Service is apart",
		routes: []string{
			l4Doc("UDPRoute", "shop", "dns", 0, `[{group: "", kind: Service, name: dns, port: 53}]`, "", `[{name: dns, port: 53}]`),
			l4Doc("UDPRoute", "shop", "dns-new", 1, `[{group: "", kind: Service, name: dns, port: 53}]`, "", `[{name: dns, port: 53}]`),
			l4Doc("UDPRoute", "shop", "imp", 0, `[{group: multicluster.x-k8s.io, kind: ServiceImport, name: pg, port: 53}]`, "", `[{name: dns, port: 53}]`),
			l4Doc("UDPRoute", "shop", "tcp-port", 0, pg5432, "", `[{name: pg-v1, port: 5432}]`),
			l4Doc("TCPRoute", "shop", "split", 0, pg5432, "", toV1),
		},
		routing: "Service shop/pg:5432: split[]->shop/pg-v1:5432*1\n" +
			"UDP Service shop/dns:53: dns[]->shop/dns:53*1\n" +
			"UDP ServiceImport shop/pg:53: imp[]->shop/dns:53*1",
		status: []want{
			{KindUDPRoute, "dns", "Accepted: bound to Service shop/dns:53 | ResolvedRefs: "},
			{KindUDPRoute, "dns-new", "!Conflicted: not bound: Service shop/dns:53: UDPRoute shop/dns is bound there and is older (the oldest route takes a frontend; TLSRoutes share one by hostname) | ResolvedRefs: "},
			{KindUDPRoute, "imp", "Accepted: bound to ServiceImport shop/pg:53 | ResolvedRefs: "},
			{KindUDPRoute, "tcp-port", "!NoMatchingParent: Service shop/pg: port 5432 is TCP: a UDPRoute binds to UDP ports only | !UnsupportedProtocol: backendRef Service shop/pg-v1 port 5432 is TCP: a UDPRoute backend must be a UDP port"},
		},
	}, {
		name:    "rules after the first are dropped",
		routes:  []string{route("TCPRoute", "shop", "two", 0, "  parentRefs: "+pg5432+"\n  rules:\n  - backendRefs: "+toV1+"\n  - backendRefs: "+toV1V2+"\n")},
		routing: "Service shop/pg:5432: two[]->shop/pg-v1:5432*1",
		status: []want{{KindTCPRoute, "two", "Accepted: bound to Service shop/pg:5432 | ResolvedRefs:  | PartiallyInvalid: Dropped Rule(s): rule 1: " +
			"spec.rules[1]: a TCPRoute has one rule (Gateway API v1.6.3, rules MaxItems=1); rules after the first are not served"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := Assemble(1, l4Sources(t, tc.routes...))
			if got := l4Summary(m.L4Routing); got != tc.routing {
				t.Errorf("routing:\n%s\nwant\n%s", got, tc.routing)
			}
			for _, w := range tc.status {
				if got := l4Status(t, m, w.kind, w.name); got != w.status {
					t.Errorf("%s %s:\n%s\nwant\n%s", w.kind, w.name, got, w.status)
				}
			}
		})
	}
}

// TestResolveL4RoutesAlone: ResolveL4Routes is pure and skips routes of other kinds; the same
// route named by two parentRefs to one frontend is bound once, both parents Accepted; the
// statuses follow the order of the routes given.
func TestResolveL4RoutesAlone(t *testing.T) {
	m := Assemble(1, l4Sources(t))
	tcp := TCPRouteModel(decode[gwv1.TCPRoute](t, l4Doc("TCPRoute", "shop", "twice", 0,
		`[{group: "", kind: Service, name: pg, port: 5432}, {group: "", kind: Service, name: pg, sectionName: db}]`, "", toV1)))
	http := Route{RouteRef: RouteRef{Kind: KindHTTPRoute, Namespace: "shop", Name: "h"}}
	services := map[ServiceKey]*Service{}
	for _, s := range m.Services {
		services[s.Key] = s
	}
	before := fmt.Sprintf("%+v", tcp)
	rt, st := ResolveL4Routes(services, []Route{http, tcp})
	if after := fmt.Sprintf("%+v", tcp); after != before {
		t.Errorf("the route changed:\n%s\nwas\n%s", after, before)
	}
	if len(st) != 1 || st[0].Route.Name != "twice" || len(st[0].Parents) != 2 {
		t.Fatalf("statuses %+v, want one, of twice, with two parents", st)
	}
	for i, p := range st[0].Parents {
		if !p.Accepted.Status || p.Accepted.Message != "bound to Service shop/pg:5432" || p.Index != i {
			t.Errorf("parent %d: %+v", i, p)
		}
	}
	if got, want := l4Summary(rt), "Service shop/pg:5432: twice[]->shop/pg-v1:5432*1"; got != want {
		t.Errorf("routing %s, want %s", got, want)
	}
	if got := rt.For(Frontend{Service: ServiceKey{"shop", "pg"}, Port: 5432}); len(got) != 1 {
		t.Errorf("For: %+v", got)
	}
	if got := (*L4Routing)(nil).For(Frontend{}); got != nil {
		t.Errorf("nil For: %+v", got)
	}
}
