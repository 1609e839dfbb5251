package model

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// Tests of ResolveGateways. Objects are written as the YAML a user applies (route(kind, ns,
// name, age, spec) of routing_test.go makes one of any kind) and go through the same models the
// registrar uses (GatewaySpecModel, HTTPRouteModel, TCPRouteModel, ReferenceGrantRefs, ...).

// edgeServices are the mesh services edge routes send to: shop/web and shop/web-v2 (HTTP 80),
// shop/rpc (gRPC 9000), shop/db (TCP 5432), shop/dns (UDP 53), other/api (HTTP 80), other/db
// (TCP 5432).
func edgeServices() map[ServiceKey]*Service {
	svc := func(ns, name string, p ServicePort) *Service {
		return &Service{Key: ServiceKey{ns, name}, Local: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Ports: []ServicePort{p}}
	}
	port := func(name string, n uint32, p Protocol) ServicePort {
		return ServicePort{Name: name, Port: n, TargetPort: n, Protocol: p, AppProtocol: true}
	}
	out := map[ServiceKey]*Service{}
	for _, s := range []*Service{
		svc("shop", "web", port("http", 80, ProtocolHTTP)),
		svc("shop", "web-v2", port("http", 80, ProtocolHTTP)),
		svc("shop", "rpc", port("grpc", 9000, ProtocolGRPC)),
		svc("shop", "db", port("pg", 5432, ProtocolTCP)),
		svc("shop", "dns", port("dns", 53, ProtocolUDP)),
		svc("other", "api", port("http", 80, ProtocolHTTP)),
		svc("other", "db", port("pg", 5432, ProtocolTCP)),
	} {
		out[s.Key] = s
	}
	return out
}

// edgeCertificates are the certificateRefs' Secrets: infra/wildcard (*.example.com,
// example.com), infra/shop (shop.example.com), shop/shop (the same in namespace shop), infra/bad
// (its key belongs to another certificate); every state comes from CheckCertificate.
var edgeCertificates = sync.OnceValue(func() map[SecretKey]CertificateState {
	k := testKeys()
	wc, wk := selfSigned(&testing.T{}, k["p256"], "*.example.com", "example.com")
	sc, sk := selfSigned(&testing.T{}, k["p384"], "shop.example.com")
	return map[SecretKey]CertificateState{
		{"infra", "wildcard"}: CheckCertificate("kubernetes.io/tls", tlsSecret(wc, wk)),
		{"infra", "shop"}:     CheckCertificate("kubernetes.io/tls", tlsSecret(sc, sk)),
		{"shop", "shop"}:      CheckCertificate("kubernetes.io/tls", tlsSecret(sc, sk)),
		{"infra", "bad"}:      CheckCertificate("kubernetes.io/tls", tlsSecret(wc, sk)),
	}
})

// gatewayInputs are the inputs of a cluster with edgeServices, edgeCertificates, GatewayClasses
// aether (ours) and other (another controller's), namespaces infra, shop (labelled edge=yes)
// and other, and the objects of docs (YAML, by kind).
func gatewayInputs(t *testing.T, docs ...string) GatewayInputs {
	t.Helper()
	in := GatewayInputs{
		Classes:  map[string]string{"aether": GatewayControllerName, "other": "example.com/gateway-controller"},
		Services: edgeServices(), Certificates: edgeCertificates(),
		// The grant logic is under test here; TestCrossNamespaceCertificatesOff has it off.
		CrossNamespaceCertificates: true,
		NamespaceLabels: map[string]map[string]string{
			"infra": {"kubernetes.io/metadata.name": "infra", "edge": "yes"},
			"shop":  {"kubernetes.io/metadata.name": "shop", "edge": "yes"},
			"other": {"kubernetes.io/metadata.name": "other"},
		},
	}
	for i, d := range docs {
		var tm struct{ Kind string }
		if err := yaml.Unmarshal([]byte(d), &tm); err != nil {
			t.Fatalf("doc %d: %v", i, err)
		}
		switch tm.Kind {
		case "Gateway":
			in.Gateways = append(in.Gateways, GatewaySpecModel(decode[gwv1.Gateway](t, d)))
		case "HTTPRoute":
			in.Routes = append(in.Routes, HTTPRouteModel(decode[gwv1.HTTPRoute](t, d)))
		case "GRPCRoute":
			in.Routes = append(in.Routes, GRPCRouteModel(decode[gwv1.GRPCRoute](t, d)))
		case "TCPRoute":
			in.Routes = append(in.Routes, TCPRouteModel(decode[gwv1.TCPRoute](t, d)))
		case "TLSRoute":
			in.Routes = append(in.Routes, TLSRouteModel(decode[gwv1.TLSRoute](t, d)))
		case "UDPRoute":
			in.Routes = append(in.Routes, UDPRouteModel(decode[gwv1.UDPRoute](t, d)))
		case "ReferenceGrant":
			in.Grants = append(in.Grants, ReferenceGrantRefs(decode[gwv1.ReferenceGrant](t, d))...)
		default:
			t.Fatalf("doc %d: kind %q", i, tm.Kind)
		}
	}
	return in
}

func decode[T any](t *testing.T, doc string) *T {
	t.Helper()
	v := new(T)
	if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	return v
}

// gateway is a Gateway infra/<name> of class aether with the listeners given as YAML list items
// (indented by two spaces, "  - name: ...").
func gateway(name, listeners string) string {
	return route("Gateway", "infra", name, 0, "  gatewayClassName: aether\n  listeners:\n"+listeners)
}

// cond renders a condition as "Reason" (status True) or "!Reason" (False).
func cond(c Condition) string {
	if c.Status {
		return c.Reason
	}
	return "!" + c.Reason
}

// listenerSummary renders a listener status as "<name>: <Accepted> <Programmed> <ResolvedRefs>
// <Conflicted> [<OverlappingTLSConfig>] kinds=<kinds> attached=<n>".
func listenerSummary(l ListenerStatus) string {
	var kinds []string
	for _, k := range l.SupportedKinds {
		kinds = append(kinds, k.Kind)
	}
	s := fmt.Sprintf("%s: %s %s %s %s", l.Name, cond(l.Accepted), cond(l.Programmed), cond(l.ResolvedRefs), cond(l.Conflicted))
	if l.OverlappingTLSConfig != nil {
		s += " " + cond(*l.OverlappingTLSConfig)
	}
	return s + fmt.Sprintf(" kinds=%s attached=%d", strings.Join(kinds, ","), l.AttachedRoutes)
}

// parentSummary renders a route parent status as "<Accepted> <ResolvedRefs>[ <PartiallyInvalid>]".
func parentSummary(p GatewayParentStatus) string {
	s := cond(p.Accepted) + " " + cond(p.ResolvedRefs)
	if p.PartiallyInvalid != nil {
		s += " partial"
	}
	return s
}

// edgeSummary renders an edge Gateway as lines "<port> <listener>[<hostname>] <hosts or L4>",
// hosts as "<hostname>{<route>/<rule>.<match> ...}", L4 routes as "<route>(<SNI names>)-><backends>".
func edgeSummary(eg *EdgeGateway) string {
	if eg == nil {
		return "none"
	}
	var lines []string
	for _, p := range eg.Ports {
		for _, l := range p.Listeners {
			var parts []string
			for _, h := range l.Hosts {
				parts = append(parts, h.Hostname+"{"+entryNames(h.Entries)+"}")
			}
			for _, r := range l.L4 {
				var bs []string
				for _, b := range r.Backends {
					s := fmt.Sprintf("%s:%d", b.Service, b.Port)
					if b.Invalid != nil {
						s += "!" + b.Invalid.Reason
					}
					bs = append(bs, s)
				}
				parts = append(parts, fmt.Sprintf("%s(%s)->%s", r.Route.Name, strings.Join(r.Hostnames, ","), strings.Join(bs, ",")))
			}
			var certs []string
			for _, c := range l.Certificates {
				certs = append(certs, c.Ref.String())
			}
			line := fmt.Sprintf("%d %s[%s]", p.Port, l.Name, l.Hostname)
			if len(certs) > 0 {
				line += " certs=" + strings.Join(certs, ",")
			}
			lines = append(lines, strings.TrimSpace(line+" "+strings.Join(parts, " ")))
		}
	}
	return strings.Join(lines, "\n")
}

// resolved runs ResolveGateways on in and indexes the result.
type resolved struct {
	edges    map[string]*EdgeGateway
	gateways map[string]GatewayStatus
	routes   map[string]GatewayRouteStatus
}

func resolve(in GatewayInputs) resolved {
	edges, gws, routes := ResolveGateways(in)
	out := resolved{edges: map[string]*EdgeGateway{}, gateways: map[string]GatewayStatus{}, routes: map[string]GatewayRouteStatus{}}
	for _, e := range edges {
		out.edges[e.Key.Name] = e
	}
	for _, g := range gws {
		out.gateways[g.Key.Name] = g
	}
	for _, r := range routes {
		out.routes[r.Route.Name] = r
	}
	return out
}

// listeners renders every listener status of Gateway name, one per line.
func (r resolved) listeners(name string) string {
	var s []string
	for _, l := range r.gateways[name].Listeners {
		s = append(s, listenerSummary(l))
	}
	return strings.Join(s, "\n")
}

// parent renders the status of route name's parent i ("none" without one).
func (r resolved) parent(name string, i int) string {
	st, ok := r.routes[name]
	if !ok || i >= len(st.Parents) {
		return "none"
	}
	return parentSummary(st.Parents[i])
}

// shopGrant lets routes of every kind in namespace infra send to Services of namespace shop.
var shopGrant = route("ReferenceGrant", "shop", "from-infra", 0, `  from:
  - {group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra}
  - {group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: infra}
  - {group: gateway.networking.k8s.io, kind: TCPRoute, namespace: infra}
  - {group: gateway.networking.k8s.io, kind: TLSRoute, namespace: infra}
  - {group: gateway.networking.k8s.io, kind: UDPRoute, namespace: infra}
  to:
  - {group: "", kind: Service}
`)

// webRule is an HTTP rule sending to shop/web:80.
const webRule = "  rules:\n  - backendRefs: [{name: web, namespace: shop, port: 80}]\n"

func httpRoute(ns, name string, age int, parent, more string) string {
	return route("HTTPRoute", ns, name, age, "  parentRefs:\n  - "+parent+"\n"+more+webRule)
}

// TestHostnameIntersection: the Gateway API "Hostnames" table, listener hostname against route
// hostname.
func TestHostnameIntersection(t *testing.T) {
	for _, tc := range []struct{ listener, route, want string }{
		{"www.example.com", "www.example.com", "www.example.com"},
		{"*.example.com", "www.example.com", "www.example.com"},
		{"*.example.com", "sub.domain.example.com", "sub.domain.example.com"},
		{"www.example.com", "*.example.com", "www.example.com"},
		{"sub.domain.example.com", "*.example.com", "sub.domain.example.com"},
		{"*.example.com", "*.example.com", "*.example.com"},
		{"*.com", "*.example.com", "*.example.com"},
		{"*.example.com", "*.com", "*.example.com"},
		{"", "www.example.com", "www.example.com"},
		{"www.example.com", "", "www.example.com"},
		{"", "", "*"},
		{"*.example.com", "example.com", ""},
		{"example.com", "*.example.com", ""},
		{"*.example.com", "*.example.net", ""},
		{"*.foo.example.com", "*.bar.example.com", ""},
		{"www.example.com", "api.example.com", ""},
	} {
		got, ok := intersectHostnames(tc.listener, tc.route)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("intersect(listener %q, route %q) = %q, %t; want %q", tc.listener, tc.route, got, ok, tc.want)
		}
	}
}

// TestGatewayHostnames: a route binds to a listener only where a hostname intersects (else
// NoMatchingListenerHostname), its other hostnames are ignored there, and each intersected
// hostname is a virtual host whose entries are the routes with that hostname, then those with a
// wildcard covering it (HTTPRouteSpec.hostnames precedence); a host a more specific listener of
// the port covers belongs to that listener (listener isolation).
func TestGatewayHostnames(t *testing.T) {
	listeners := "  - {name: any, port: 80, protocol: HTTP}\n" +
		"  - {name: wild, port: 80, protocol: HTTP, hostname: \"*.example.com\"}\n" +
		"  - {name: foo, port: 80, protocol: HTTP, hostname: \"*.foo.example.com\"}\n" +
		"  - {name: exact, port: 80, protocol: HTTP, hostname: abc.foo.example.com}\n"
	// perListener is a route r-<listener> bound to each listener, with hostnames hosts (YAML).
	perListener := func(hosts string) []string {
		var out []string
		for _, l := range []string{"any", "wild", "foo", "exact"} {
			out = append(out, httpRoute("infra", "r-"+l, 0, "{name: gw, sectionName: "+l+"}", hosts))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		routes []string
		edge   string
		status map[string]string // route name -> parent 0
	}{{
		name:   "listener hostnames only (conformance HTTPListenerIsolation)",
		routes: perListener(""),
		edge: "80 exact[abc.foo.example.com] abc.foo.example.com{r-exact/0.0}\n" +
			"80 foo[*.foo.example.com] *.foo.example.com{r-foo/0.0}\n" +
			"80 wild[*.example.com] *.example.com{r-wild/0.0}\n" +
			"80 any[] *{r-any/0.0}",
	}, {
		name:   "intersections, and what a more specific listener takes (conformance, with hostname intersection)",
		routes: perListener("  hostnames: [bar.com, \"*.example.com\", \"*.foo.example.com\"]\n"),
		edge: "80 exact[abc.foo.example.com] abc.foo.example.com{r-exact/0.0}\n" +
			"80 foo[*.foo.example.com] *.foo.example.com{r-foo/0.0}\n" +
			"80 wild[*.example.com] *.example.com{r-wild/0.0}\n" +
			"80 any[] bar.com{r-any/0.0}",
	}, {
		name: "no intersection on the listener named",
		routes: []string{
			httpRoute("infra", "r", 0, "{name: gw, sectionName: exact}", "  hostnames: [bar.com, example.com]\n"),
		},
		edge:   "",
		status: map[string]string{"r": "!NoMatchingListenerHostname ResolvedRefs"},
	}, {
		name: "precise and wildcard routes on one listener: the precise host falls through to the wildcard's rules",
		routes: []string{
			httpRoute("infra", "wide", -10, "{name: gw, sectionName: wild}", ""),
			route("HTTPRoute", "infra", "star", 0, "  parentRefs: [{name: gw, sectionName: wild}]\n  hostnames: [\"*.example.com\"]\n  rules:\n  - matches: [{path: {value: /a}}]\n    backendRefs: [{name: web, namespace: shop, port: 80}]\n"),
			route("HTTPRoute", "infra", "www", 5, "  parentRefs: [{name: gw, sectionName: wild}]\n  hostnames: [www.example.com, www.example.net]\n  rules:\n  - matches: [{path: {value: /}}]\n    backendRefs: [{name: web, namespace: shop, port: 80}]\n"),
		},
		edge:   "80 wild[*.example.com] www.example.com{www/0.0 star/0.0 wide/0.0} *.example.com{star/0.0 wide/0.0}",
		status: map[string]string{"www": "Accepted ResolvedRefs", "star": "Accepted ResolvedRefs", "wide": "Accepted ResolvedRefs"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			in := gatewayInputs(t, append([]string{gateway("gw", listeners), shopGrant}, tc.routes...)...)
			r := resolve(in)
			var lines []string
			for _, l := range strings.Split(edgeSummary(r.edges["gw"]), "\n") {
				if strings.Contains(l, "{") {
					lines = append(lines, l)
				}
			}
			if got := strings.Join(lines, "\n"); got != tc.edge {
				t.Errorf("edge listeners with hosts:\n%s\nwant\n%s", got, tc.edge)
			}
			for name, want := range tc.status {
				if got := r.parent(name, 0); got != want {
					t.Errorf("route %s: %s, want %s", name, got, want)
				}
			}
		})
	}
	// The message of a route whose hostnames meet no listener names them and the listeners'.
	r := resolve(gatewayInputs(t, gateway("gw", listeners), httpRoute("infra", "r", 0, "{name: gw, sectionName: exact}", "  hostnames: [bar.com]\n")))
	if got, want := r.routes["r"].Parents[0].Accepted.Message, `hostnames bar.com intersect none of the listeners' hostnames (exact "abc.foo.example.com")`; got != want {
		t.Errorf("message %q\nwant      %q", got, want)
	}
}

// TestListenerConflicts: listeners that are not distinct on their port are all refused (none
// wins), with the reason the spec gives; compatible listeners are programmed, most specific
// hostname first on a port; the Gateway is accepted while one listener is.
func TestListenerConflicts(t *testing.T) {
	const cert = "tls: {certificateRefs: [{name: wildcard}]}"
	const pass = "tls: {mode: Passthrough}"
	for _, tc := range []struct {
		name, listeners string
		want            string // listener summaries
		gateway         string // Accepted Programmed
		edge            string // edgeSummary ("none": not served)
	}{{
		name: "HTTP and HTTPS on one port",
		listeners: "  - {name: a, port: 8443, protocol: HTTP}\n" +
			"  - {name: b, port: 8443, protocol: HTTPS, hostname: www.example.com, " + cert + "}\n",
		want: "a: !ProtocolConflict !Invalid ResolvedRefs ProtocolConflict kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"b: !ProtocolConflict !Invalid ResolvedRefs ProtocolConflict kinds=HTTPRoute,GRPCRoute attached=0",
		gateway: "!ListenersNotValid !Invalid",
		edge:    "none",
	}, {
		name: "TCP shares its port with nothing (TLS)",
		listeners: "  - {name: a, port: 443, protocol: TCP}\n" +
			"  - {name: b, port: 443, protocol: TLS, hostname: db.example.com, " + pass + "}\n" +
			"  - {name: c, port: 80, protocol: HTTP}\n",
		want: "a: !ProtocolConflict !Invalid ResolvedRefs ProtocolConflict kinds=TCPRoute attached=0\n" +
			"b: !ProtocolConflict !Invalid ResolvedRefs ProtocolConflict kinds=TLSRoute attached=0\n" +
			"c: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0",
		gateway: "ListenersNotValid Programmed",
		edge:    "80 c[]",
	}, {
		name: "two TCP listeners on one port",
		listeners: "  - {name: a, port: 5432, protocol: TCP}\n" +
			"  - {name: b, port: 5432, protocol: TCP}\n",
		want: "a: !ProtocolConflict !Invalid ResolvedRefs ProtocolConflict kinds=TCPRoute attached=0\n" +
			"b: !ProtocolConflict !Invalid ResolvedRefs ProtocolConflict kinds=TCPRoute attached=0",
		gateway: "!ListenersNotValid !Invalid",
		edge:    "none",
	}, {
		name: "HTTPS and TLS passthrough with one hostname: SNI cannot tell them apart",
		listeners: "  - {name: a, port: 443, protocol: HTTPS, hostname: www.example.com, " + cert + "}\n" +
			"  - {name: b, port: 443, protocol: TLS, hostname: www.example.com, " + pass + "}\n" +
			"  - {name: c, port: 443, protocol: TLS, " + pass + "}\n",
		want: "a: !HostnameConflict !Invalid ResolvedRefs HostnameConflict kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"b: !HostnameConflict !Invalid ResolvedRefs HostnameConflict kinds=TLSRoute attached=0\n" +
			"c: Accepted Programmed ResolvedRefs !NoConflicts kinds=TLSRoute attached=0",
		gateway: "ListenersNotValid Programmed",
		edge:    "443 c[]",
	}, {
		name: "HTTPS, TLS passthrough and TLS terminate on one port, told apart by SNI",
		listeners: "  - {name: web, port: 443, protocol: HTTPS, hostname: www.example.com, " + cert + "}\n" +
			"  - {name: db, port: 443, protocol: TLS, hostname: db.example.com, " + pass + "}\n" +
			"  - {name: mq, port: 443, protocol: TLS, hostname: mq.example.com, tls: {mode: Terminate, certificateRefs: [{name: wildcard}]}}\n",
		want: "web: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"db: Accepted Programmed ResolvedRefs !NoConflicts kinds=TLSRoute attached=0\n" +
			"mq: Accepted Programmed ResolvedRefs !NoConflicts kinds=TLSRoute,TCPRoute attached=0",
		gateway: "Accepted Programmed",
		edge: "443 web[www.example.com] certs=infra/wildcard\n" +
			"443 db[db.example.com]\n" +
			"443 mq[mq.example.com] certs=infra/wildcard",
	}, {
		name: "the edge pod's own ports are refused for TCP, not for UDP",
		listeners: "  - {name: a, port: 15010, protocol: HTTP}\n" +
			"  - {name: b, port: 15090, protocol: TCP}\n" +
			"  - {name: c, port: 15010, protocol: UDP}\n",
		want: "a: !PortUnavailable !Invalid ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"b: !PortUnavailable !Invalid ResolvedRefs !NoConflicts kinds=TCPRoute attached=0\n" +
			"c: Accepted Programmed ResolvedRefs !NoConflicts kinds=UDPRoute attached=0",
		gateway: "ListenersNotValid Programmed",
		edge:    "15010 c[]",
	}, {
		name: "TCP and UDP share a port number",
		listeners: "  - {name: dns-tcp, port: 53, protocol: TCP}\n" +
			"  - {name: dns-udp, port: 53, protocol: UDP}\n",
		want: "dns-tcp: Accepted Programmed ResolvedRefs !NoConflicts kinds=TCPRoute attached=0\n" +
			"dns-udp: Accepted Programmed ResolvedRefs !NoConflicts kinds=UDPRoute attached=0",
		gateway: "Accepted Programmed",
		edge:    "53 dns-tcp[]\n53 dns-udp[]",
	}, {
		name: "two UDP listeners on one port",
		listeners: "  - {name: a, port: 53, protocol: UDP}\n" +
			"  - {name: b, port: 53, protocol: UDP}\n" +
			"  - {name: c, port: 54, protocol: UDP}\n",
		want: "a: !ProtocolConflict !Invalid ResolvedRefs ProtocolConflict kinds=UDPRoute attached=0\n" +
			"b: !ProtocolConflict !Invalid ResolvedRefs ProtocolConflict kinds=UDPRoute attached=0\n" +
			"c: Accepted Programmed ResolvedRefs !NoConflicts kinds=UDPRoute attached=0",
		gateway: "ListenersNotValid Programmed",
		edge:    "54 c[]",
	}, {
		name: "HTTP listeners distinct by hostname, most specific first",
		listeners: "  - {name: any, port: 80, protocol: HTTP}\n" +
			"  - {name: wild, port: 80, protocol: HTTP, hostname: \"*.example.com\"}\n" +
			"  - {name: www, port: 80, protocol: HTTP, hostname: www.example.com}\n" +
			"  - {name: deep, port: 80, protocol: HTTP, hostname: \"*.eu.example.com\"}\n",
		want: "any: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"wild: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"www: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"deep: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0",
		gateway: "Accepted Programmed",
		edge:    "80 www[www.example.com]\n80 deep[*.eu.example.com]\n80 wild[*.example.com]\n80 any[]",
	}, {
		name: "overlapping Terminate hostnames on one port (not on another port, not example.com)",
		listeners: "  - {name: foo, port: 443, protocol: HTTPS, hostname: foo.example.com, " + cert + "}\n" +
			"  - {name: wild, port: 443, protocol: HTTPS, hostname: \"*.example.com\", " + cert + "}\n" +
			"  - {name: apex, port: 443, protocol: HTTPS, hostname: example.com, " + cert + "}\n" +
			"  - {name: other, port: 9443, protocol: HTTPS, hostname: foo.example.com, " + cert + "}\n",
		want: "foo: Accepted Programmed ResolvedRefs !NoConflicts OverlappingHostnames kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"wild: Accepted Programmed ResolvedRefs !NoConflicts OverlappingHostnames kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"apex: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"other: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0",
		gateway: "Accepted Programmed",
		edge: "443 foo[foo.example.com] certs=infra/wildcard\n443 apex[example.com] certs=infra/wildcard\n" +
			"443 wild[*.example.com] certs=infra/wildcard\n9443 other[foo.example.com] certs=infra/wildcard",
	}, {
		name: "unsupported protocol and TLS settings (a conflicting port partner that is refused anyway does not count)",
		listeners: "  - {name: custom, port: 80, protocol: example.com/foo}\n" +
			"  - {name: plain-tls, port: 81, protocol: HTTP, tls: {certificateRefs: [{name: wildcard}]}}\n" +
			"  - {name: https-pass, port: 443, protocol: HTTPS, " + pass + "}\n" +
			"  - {name: https-bare, port: 444, protocol: HTTPS}\n" +
			"  - {name: ok, port: 80, protocol: TCP}\n",
		want: "custom: !UnsupportedProtocol !Invalid ResolvedRefs !NoConflicts kinds= attached=0\n" +
			"plain-tls: !UnsupportedValue !Invalid ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"https-pass: !UnsupportedValue !Invalid ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"https-bare: !UnsupportedValue !Invalid ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
			"ok: Accepted Programmed ResolvedRefs !NoConflicts kinds=TCPRoute attached=0",
		gateway: "ListenersNotValid Programmed",
		edge:    "80 ok[]",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := resolve(gatewayInputs(t, gateway("gw", tc.listeners)))
			if got := r.listeners("gw"); got != tc.want {
				t.Errorf("listeners:\n%s\nwant\n%s", got, tc.want)
			}
			g := r.gateways["gw"]
			if got := cond(g.Accepted) + " " + cond(g.Programmed); got != tc.gateway {
				t.Errorf("Gateway: %s, want %s", got, tc.gateway)
			}
			if got := edgeSummary(r.edges["gw"]); got != tc.edge {
				t.Errorf("edge:\n%s\nwant\n%s", got, tc.edge)
			}
		})
	}
	r := resolve(gatewayInputs(t, gateway("gw", "  - {name: a, port: 443, protocol: TCP}\n  - {name: b, port: 443, protocol: TLS, hostname: db.example.com, "+pass+"}\n")))
	want := "port 443 is shared by listeners a (TCP), b (TLS): one port serves HTTP, or HTTPS and TLS (told apart by SNI), or one TCP listener"
	if l := r.gateways["gw"].Listeners[0]; l.Conflicted.Message != want || l.Accepted.Message != want {
		t.Errorf("conflict messages %q, %q\nwant %q", l.Conflicted.Message, l.Accepted.Message, want)
	}
	r = resolve(gatewayInputs(t, gateway("gw", "  - {name: h, port: 443, protocol: HTTPS, "+pass+"}\n")))
	if got, want := r.gateways["gw"].Listeners[0].Accepted.Message, `spec.listeners[0].tls.mode: value "Passthrough": protocol HTTPS takes Terminate only (TLS passthrough is protocol TLS)`; got != want {
		t.Errorf("message %q\nwant      %q", got, want)
	}
}

// TestAllowedRoutes: a parentRef binds to the listeners its sectionName and port select, when
// their kinds take the route's and allowedRoutes.namespaces admits its namespace; the listener
// counts the routes Accepted on it.
func TestAllowedRoutes(t *testing.T) {
	const listeners = "  - {name: same, port: 80, protocol: HTTP, hostname: same.example.com}\n" +
		"  - {name: all, port: 80, protocol: HTTP, hostname: all.example.com, allowedRoutes: {namespaces: {from: All}}}\n" +
		"  - {name: labelled, port: 80, protocol: HTTP, hostname: sel.example.com, allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {edge: \"yes\"}}}}}\n" +
		"  - {name: expr, port: 80, protocol: HTTP, hostname: expr.example.com, allowedRoutes: {namespaces: {from: Selector, selector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [other]}]}}}}\n" +
		"  - {name: http-only, port: 8080, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}], namespaces: {from: All}}}\n" +
		"  - {name: odd-kinds, port: 8081, protocol: HTTP, allowedRoutes: {kinds: [{kind: InvalidRoute}, {kind: HTTPRoute}, {group: example.com, kind: GRPCRoute}]}}\n" +
		"  - {name: tcp, port: 5432, protocol: TCP, allowedRoutes: {namespaces: {from: All}}}\n" +
		"  - {name: pass, port: 443, protocol: TLS, hostname: \"*.example.com\", tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}\n" +
		"  - {name: term, port: 8443, protocol: TLS, hostname: \"*.example.com\", tls: {certificateRefs: [{name: wildcard}]}, allowedRoutes: {namespaces: {from: All}}}\n" +
		"  - {name: dns, port: 53, protocol: UDP, allowedRoutes: {namespaces: {from: All}}}\n"
	tcp := func(ns, name, parent string) string {
		return route("TCPRoute", ns, name, 0, "  parentRefs: ["+parent+"]\n  rules:\n  - backendRefs: [{name: db, namespace: shop, port: 5432}]\n")
	}
	for _, tc := range []struct {
		name, route, want string
	}{
		{"Same: the Gateway's namespace", httpRoute("infra", "r", 0, "{name: gw, sectionName: same}", ""), "Accepted ResolvedRefs"},
		{"Same: another namespace", httpRoute("shop", "r", 0, "{name: gw, namespace: infra, sectionName: same}", ""), "!NotAllowedByListeners ResolvedRefs"},
		{"All", httpRoute("other", "r", 0, "{name: gw, namespace: infra, sectionName: all}", ""), "Accepted ResolvedRefs"},
		{"Selector, labelled namespace", httpRoute("shop", "r", 0, "{name: gw, namespace: infra, sectionName: labelled}", ""), "Accepted ResolvedRefs"},
		{"Selector, unlabelled namespace", httpRoute("other", "r", 0, "{name: gw, namespace: infra, sectionName: labelled}", ""), "!NotAllowedByListeners ResolvedRefs"},
		{"Selector expression", httpRoute("other", "r", 0, "{name: gw, namespace: infra, sectionName: expr}", ""), "Accepted ResolvedRefs"},
		{"Selector expression, other namespace", httpRoute("shop", "r", 0, "{name: gw, namespace: infra, sectionName: expr}", ""), "!NotAllowedByListeners ResolvedRefs"},
		{"kinds: HTTPRoute only, a GRPCRoute", route("GRPCRoute", "infra", "r", 0, "  parentRefs: [{name: gw, sectionName: http-only}]\n  rules:\n  - backendRefs: [{name: rpc, namespace: shop, port: 9000}]\n"),
			"!NotAllowedByListeners ResolvedRefs"},
		{"kinds: a GRPCRoute of another group", route("GRPCRoute", "infra", "r", 0, "  parentRefs: [{name: gw, sectionName: odd-kinds}]\n  rules:\n  - backendRefs: [{name: rpc, namespace: shop, port: 9000}]\n"),
			"!NotAllowedByListeners ResolvedRefs"},
		{"an HTTPRoute on a TCP listener", httpRoute("infra", "r", 0, "{name: gw, sectionName: tcp}", ""), "!NotAllowedByListeners ResolvedRefs"},
		{"a TCPRoute on a TCP listener", tcp("infra", "r", "{name: gw, sectionName: tcp}"), "Accepted ResolvedRefs"},
		{"a TCPRoute on an HTTP listener (conformance TCPRouteInvalidNonTCPListener)", tcp("infra", "r", "{name: gw, sectionName: http-only}"), "!NotAllowedByListeners ResolvedRefs"},
		{"a TCPRoute on a TLS Terminate listener", tcp("infra", "r", "{name: gw, sectionName: term}"), "Accepted ResolvedRefs"},
		{"a TCPRoute on a TLS Passthrough listener", tcp("infra", "r", "{name: gw, sectionName: pass}"), "!NotAllowedByListeners ResolvedRefs"},
		{"a TLSRoute on an HTTP listener", route("TLSRoute", "infra", "r", 0, "  parentRefs: [{name: gw, sectionName: all}]\n  hostnames: [all.example.com]\n  rules:\n  - backendRefs: [{name: db, namespace: shop, port: 5432}]\n"),
			"!NotAllowedByListeners ResolvedRefs"},
		{"a UDPRoute on a UDP listener", route("UDPRoute", "infra", "r", 0, "  parentRefs: [{name: gw, port: 53}]\n  rules:\n  - backendRefs: [{name: dns, namespace: shop, port: 53}]\n"), "Accepted ResolvedRefs"},
		{"no listener of that name", httpRoute("infra", "r", 0, "{name: gw, sectionName: nope}", ""), "!NoMatchingParent ResolvedRefs"},
		{"sectionName and port must both match", httpRoute("infra", "r", 0, "{name: gw, sectionName: same, port: 8080}", ""), "!NoMatchingParent ResolvedRefs"},
		{"port selects the listeners on it", httpRoute("infra", "r", 0, "{name: gw, port: 8080}", ""), "Accepted ResolvedRefs"},
		{"a Gateway of another class is not aether's", httpRoute("infra", "r", 0, "{name: theirs}", ""), "none"},
		{"a Gateway that does not exist is not aether's", httpRoute("infra", "r", 0, "{name: ghost}", ""), "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			theirs := strings.Replace(gateway("theirs", "  - {name: http, port: 80, protocol: HTTP}\n"), "aether", "other", 1)
			fromOther := route("ReferenceGrant", "shop", "from-other", 0, "  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}]\n  to: [{group: \"\", kind: Service}]\n")
			r := resolve(gatewayInputs(t, gateway("gw", listeners), theirs, shopGrant, fromOther, tc.route))
			if got := r.parent("r", 0); got != tc.want {
				t.Errorf("route: %s, want %s (%+v)", got, tc.want, r.routes["r"])
			}
			if _, ok := r.gateways["theirs"]; ok {
				t.Error("the Gateway of another class has a status")
			}
			attached := 0
			for _, l := range r.gateways["gw"].Listeners {
				attached += int(l.AttachedRoutes)
			}
			if want := map[bool]int{true: 1}[strings.HasPrefix(tc.want, "Accepted ")]; attached != want {
				t.Errorf("attached routes %d, want %d", attached, want)
			}
		})
	}
	r := resolve(gatewayInputs(t, gateway("gw", listeners)))
	var odd ListenerStatus
	for _, l := range r.gateways["gw"].Listeners {
		if l.Name == "odd-kinds" {
			odd = l
		}
	}
	if got, want := listenerSummary(odd), "odd-kinds: Accepted Programmed !InvalidRouteKinds !NoConflicts kinds=HTTPRoute attached=0"; got != want {
		t.Errorf("listener with unknown kinds: %s\nwant %s", got, want)
	}
	want := `spec.listeners[5].allowedRoutes.kinds: InvalidRoute (group "gateway.networking.k8s.io"): not a kind a HTTP listener takes (HTTPRoute, GRPCRoute); ` +
		`spec.listeners[5].allowedRoutes.kinds: GRPCRoute (group "example.com"): not a kind a HTTP listener takes (HTTPRoute, GRPCRoute)`
	if odd.ResolvedRefs.Message != want {
		t.Errorf("message %q\nwant      %q", odd.ResolvedRefs.Message, want)
	}
	for parent, want := range map[string]string{
		"{name: gw, namespace: infra, sectionName: same}": "listener same: takes routes of namespace infra only (allowedRoutes.namespaces.from Same), not of shop",
		"{name: gw, namespace: infra, port: 443}":         "listener pass: takes TLSRoute, not HTTPRoute",
		"{name: gw, namespace: infra, sectionName: expr}": `listener expr: namespace shop does not match its selector "kubernetes.io/metadata.name in (other)"`,
	} {
		r := resolve(gatewayInputs(t, gateway("gw", listeners), httpRoute("shop", "r", 0, parent, "")))
		if got := r.routes["r"].Parents[0].Accepted.Message; got != want {
			t.Errorf("parent %s: message %q\nwant %q", parent, got, want)
		}
	}
	r = resolve(gatewayInputs(t, gateway("gw", listeners), httpRoute("shop", "r", 0, "{name: gw, namespace: infra}", "")))
	// Without sectionName, the route may bind where allowed: all, labelled, http-only, odd-kinds.
	if got := r.parent("r", 0); got != "Accepted ResolvedRefs" {
		t.Errorf("route to the whole Gateway: %s, want Accepted", got)
	}
	if got := r.routes["r"].Parents[0].Accepted.Message; got != "bound to listeners all, labelled, http-only of Gateway infra/gw" {
		t.Errorf("message %q", got)
	}
	r = resolve(gatewayInputs(t, gateway("gw", listeners), httpRoute("shop", "r", 0, "{name: gw, namespace: infra, port: 80}", "  hostnames: [expr.example.com]\n")))
	if got := r.routes["r"].Parents[0].Accepted; got.Reason != string(gwv1.RouteReasonNoMatchingListenerHostname) {
		t.Errorf("route for expr.example.com from shop: %+v, want NoMatchingListenerHostname (the listeners that admit shop do not take that host)", got)
	}
}

// TestReferenceGrants: a certificateRef into another namespace needs a ReferenceGrant there from
// the Gateway's namespace (kind Gateway, to Secret, any name or that one), else the listener's
// ResolvedRefs is False, RefNotPermitted; a backendRef (or a mirror's) into another namespace
// needs one from the route's kind, else it is invalid with RefNotPermitted and its share fails.
func TestReferenceGrants(t *testing.T) {
	grant := func(from, to string) string {
		return route("ReferenceGrant", "shop", "g", 0, "  from: ["+from+"]\n  to: ["+to+"]\n")
	}
	const fromGateway = "{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}"
	const fromHTTP = "{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra}"
	// Without a usable certificate the listener is not programmed: the Gateway is accepted
	// (ListenersNotValid) and its edge serves no port.
	https := gateway("gw", "  - {name: https, port: 443, protocol: HTTPS, allowedRoutes: {namespaces: {from: All}}, tls: {certificateRefs: [{name: shop, namespace: shop}]}}\n")
	for _, tc := range []struct{ name, grant, listener, edge string }{
		{"no grant", "", "https: Accepted !Invalid !RefNotPermitted !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0", ""},
		{"grant for every Secret", grant(fromGateway, `{group: "", kind: Secret}`),
			"https: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0", "443 https[] certs=shop/shop"},
		{"grant for that Secret", grant(fromGateway, `{group: "", kind: Secret, name: shop}`),
			"https: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0", "443 https[] certs=shop/shop"},
		{"grant for another Secret", grant(fromGateway, `{group: "", kind: Secret, name: other}`),
			"https: Accepted !Invalid !RefNotPermitted !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0", ""},
		{"grant from another namespace", grant("{group: gateway.networking.k8s.io, kind: Gateway, namespace: other}", `{group: "", kind: Secret}`),
			"https: Accepted !Invalid !RefNotPermitted !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0", ""},
		{"grant to HTTPRoutes, not Gateways", grant(fromHTTP, `{group: "", kind: Secret}`),
			"https: Accepted !Invalid !RefNotPermitted !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0", ""},
	} {
		t.Run("certificate/"+tc.name, func(t *testing.T) {
			docs := []string{https}
			if tc.grant != "" {
				docs = append(docs, tc.grant)
			}
			r := resolve(gatewayInputs(t, docs...))
			if got := r.listeners("gw"); got != tc.listener {
				t.Errorf("listener: %s\nwant      %s", got, tc.listener)
			}
			if got := edgeSummary(r.edges["gw"]); got != tc.edge {
				t.Errorf("edge: %s, want %s", got, tc.edge)
			}
		})
	}
	r := resolve(gatewayInputs(t, https))
	if got, want := r.gateways["gw"].Listeners[0].ResolvedRefs.Message, "spec.listeners[0].tls.certificateRefs[0]: Secret shop/shop: another namespace: a ReferenceGrant in shop must allow Gateways of infra"; got != want {
		t.Errorf("message %q\nwant      %q", got, want)
	}

	split := route("HTTPRoute", "infra", "r", 0, `  parentRefs: [{name: gw}]
  rules:
  - backendRefs: [{name: web, namespace: shop, port: 80, weight: 3}, {name: api, namespace: other, port: 80}, {name: api, port: 80}]
    filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web-v2, namespace: shop, port: 80}}}]
`)
	http := gateway("gw", "  - {name: http, port: 80, protocol: HTTP}\n")
	for _, tc := range []struct{ name, grant, refs, backends string }{
		{"no grant", "", "!RefNotPermitted", "shop/web!RefNotPermitted other/api!RefNotPermitted infra/api!BackendNotFound mirror shop/web-v2!RefNotPermitted"},
		{"grant for shop's Services", grant(fromHTTP, `{group: "", kind: Service}`), "!RefNotPermitted",
			"shop/web other/api!RefNotPermitted infra/api!BackendNotFound mirror shop/web-v2"},
		{"grant for shop/web only", grant(fromHTTP, `{group: "", kind: Service, name: web}`), "!RefNotPermitted",
			"shop/web other/api!RefNotPermitted infra/api!BackendNotFound mirror shop/web-v2!RefNotPermitted"},
		{"grant to GRPCRoutes", grant("{group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: infra}", `{group: "", kind: Service}`), "!RefNotPermitted",
			"shop/web!RefNotPermitted other/api!RefNotPermitted infra/api!BackendNotFound mirror shop/web-v2!RefNotPermitted"},
	} {
		t.Run("backend/"+tc.name, func(t *testing.T) {
			docs := []string{http, split}
			if tc.grant != "" {
				docs = append(docs, tc.grant)
			}
			r := resolve(gatewayInputs(t, docs...))
			st := r.routes["r"].Parents[0]
			if got := cond(st.Accepted) + " " + cond(st.ResolvedRefs); got != "Accepted "+tc.refs {
				t.Errorf("route: %s, want Accepted %s", got, tc.refs)
			}
			e := r.edges["gw"].Ports[0].Listeners[0].Hosts[0].Entries[0].Rule
			var got []string
			for _, b := range e.Backends {
				got = append(got, backendSummary(b))
			}
			got = append(got, "mirror "+backendSummary(e.Filters[0].Mirror.Backend))
			if g := strings.Join(got, " "); g != tc.backends {
				t.Errorf("backends: %s\nwant      %s", g, tc.backends)
			}
		})
	}
	r = resolve(gatewayInputs(t, http, split))
	want := "backendRef Service shop/web: another namespace: a ReferenceGrant in shop must allow HTTPRoutes of infra; " +
		"backendRef Service other/api: another namespace: a ReferenceGrant in other must allow HTTPRoutes of infra; " +
		"backendRef Service infra/api: not found in a mesh namespace; " +
		"backendRef Service shop/web-v2: another namespace: a ReferenceGrant in shop must allow HTTPRoutes of infra"
	if got := r.routes["r"].Parents[0].ResolvedRefs.Message; got != want {
		t.Errorf("message %q\nwant      %q", got, want)
	}
	// The mesh needs no grant (GEP-1294): ResolveRoutes of the same route with a Service parent.
	in := gatewayInputs(t, strings.Replace(split, "[{name: gw}]", `[{group: "", kind: Service, name: web, namespace: shop}]`, 1))
	_, mesh := ResolveRoutes(in.Services, in.Routes)
	if got := cond(mesh[0].Parents[0].ResolvedRefs); got != "!BackendNotFound" {
		t.Errorf("mesh ResolvedRefs: %s, want !BackendNotFound (infra/api only)", got)
	}
}

// backendSummary renders a backend as "<ns>/<name>[!<reason>]".
func backendSummary(b BackendRef) string {
	s := b.Service.String()
	if b.Invalid != nil {
		s += "!" + b.Invalid.Reason
	}
	return s
}

// TestListenerCertificates: a certificateRef that is not a Secret, a missing Secret or one with a
// CertificateState.Problem makes ResolvedRefs False, InvalidCertificateRef, naming the ref; the
// usable certificates are served in certificateRefs order, and a Terminate listener without one
// is not programmed (conformance GatewayInvalidTLSConfiguration).
func TestListenerCertificates(t *testing.T) {
	for _, tc := range []struct{ name, refs, listener, message, edge string }{
		{"two good certificates", "[{name: shop}, {name: wildcard}]",
			"https: Accepted Programmed ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0", "", "443 https[] certs=infra/shop,infra/wildcard"},
		{"missing Secret", "[{name: nonexistent}]",
			"https: Accepted !Invalid !InvalidCertificateRef !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0",
			"spec.listeners[0].tls.certificateRefs[0]: Secret infra/nonexistent not found", ""},
		{"another group", "[{group: wrong.group.company.io, kind: Secret, name: wildcard}]",
			"https: Accepted !Invalid !InvalidCertificateRef !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0",
			`spec.listeners[0].tls.certificateRefs[0]: Secret "wildcard" (group "wrong.group.company.io"): want a Secret (group "")`, ""},
		{"another kind", "[{group: \"\", kind: WrongKind, name: wildcard}]",
			"https: Accepted !Invalid !InvalidCertificateRef !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0",
			`spec.listeners[0].tls.certificateRefs[0]: WrongKind "wildcard" (group ""): want a Secret (group "")`, ""},
		{"key of another certificate", "[{name: bad}]",
			"https: Accepted !Invalid !InvalidCertificateRef !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0",
			"spec.listeners[0].tls.certificateRefs[0]: Secret infra/bad: tls.key: the private key does not match the certificate (the first of tls.crt)", ""},
		{"one bad, one good: the good one is served", "[{name: bad}, {name: wildcard}]",
			"https: Accepted Programmed !InvalidCertificateRef !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0",
			"spec.listeners[0].tls.certificateRefs[0]: Secret infra/bad: tls.key: the private key does not match the certificate (the first of tls.crt)",
			"443 https[] certs=infra/wildcard"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := resolve(gatewayInputs(t, gateway("gw", "  - {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: "+tc.refs+"}}\n")))
			if got := r.listeners("gw"); got != tc.listener {
				t.Errorf("listener: %s\nwant      %s", got, tc.listener)
			}
			if got := r.gateways["gw"].Listeners[0].ResolvedRefs.Message; got != tc.message {
				t.Errorf("message %q\nwant      %q", got, tc.message)
			}
			if got := edgeSummary(r.edges["gw"]); got != tc.edge {
				t.Errorf("edge: %s, want %s", got, tc.edge)
			}
		})
	}
	r := resolve(gatewayInputs(t, gateway("gw", "  - {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: wildcard}]}}\n")))
	c := r.edges["gw"].Ports[0].Listeners[0].Certificates[0]
	if c.Ref != (SecretKey{"infra", "wildcard"}) || len(c.CertPEM) == 0 || len(c.KeyPEM) == 0 || strings.Join(c.DNSNames, ",") != "*.example.com,example.com" {
		t.Errorf("certificate %s: DNS names %v, PEM %d/%d bytes; want infra/wildcard with its PEM and *.example.com,example.com", c.Ref, c.DNSNames, len(c.CertPEM), len(c.KeyPEM))
	}
}

// TestEdgeRoutePrecedence: on one virtual host, entries of every route bound there follow
// HTTPRouteRule.matches precedence, ties to the oldest route then "<namespace>/<name>"; rules
// that cannot be served are dropped (PartiallyInvalid), a route with none left is not accepted.
func TestEdgeRoutePrecedence(t *testing.T) {
	gw := gateway("gw", "  - {name: http, port: 80, protocol: HTTP, hostname: \"*.example.com\", allowedRoutes: {namespaces: {from: All}}}\n")
	r := resolve(gatewayInputs(t, gw, shopGrant,
		route("HTTPRoute", "shop", "b", 0, `  parentRefs: [{name: gw, namespace: infra}]
  hostnames: [www.example.com]
  rules:
  - matches: [{path: {value: /api}}, {path: {type: Exact, value: /api/v1}}]
    backendRefs: [{name: web, port: 80}]
  - matches: [{path: {value: /}, headers: [{name: x-beta, value: "1"}]}]
    backendRefs: [{name: web-v2, port: 80}]
`),
		route("HTTPRoute", "shop", "a", 0, `  parentRefs: [{name: gw, namespace: infra}]
  hostnames: [www.example.com]
  rules:
  - matches: [{path: {value: /api}}]
    backendRefs: [{name: web-v2, port: 80}]
  - matches: [{path: {type: RegularExpression, value: "/a("}}]
`),
		route("HTTPRoute", "infra", "old", -60, `  parentRefs: [{name: gw}]
  hostnames: [www.example.com]
  rules:
  - matches: [{path: {value: /api}}]
    backendRefs: [{name: web, namespace: shop, port: 80}]
`),
		route("HTTPRoute", "infra", "broken", 0, `  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {type: RegularExpression, value: "/a("}}]
`),
	))
	want := "80 http[*.example.com] www.example.com{b/0.1 old/0.0 a/0.0 b/0.0 b/1.0}"
	if got := edgeSummary(r.edges["gw"]); got != want {
		t.Errorf("edge:\n%s\nwant\n%s", got, want)
	}
	for name, want := range map[string]string{"a": "Accepted ResolvedRefs partial", "b": "Accepted ResolvedRefs", "old": "Accepted ResolvedRefs", "broken": "!UnsupportedValue ResolvedRefs"} {
		if got := r.parent(name, 0); got != want {
			t.Errorf("route %s: %s, want %s", name, got, want)
		}
	}
	if got := r.gateways["gw"].Listeners[0].AttachedRoutes; got != 3 {
		t.Errorf("attached routes %d, want 3 (the route with no rule left is not accepted)", got)
	}
	if got, want := r.routes["a"].Parents[0].PartiallyInvalid.Message, `Dropped Rule(s): rule 1: spec.rules[1].matches[0].path.value: invalid value "/a(": not an RE2 expression: missing closing ): "/a("`; got != want {
		t.Errorf("message %q\nwant      %q", got, want)
	}
}

// TestHTTPAndGRPCRoutesOnOneListener: of an HTTPRoute and a GRPCRoute whose hostnames intersect on
// a listener, only the older is accepted there (GRPCRouteSpec.hostnames, GEP-1016); routes of the
// two types on disjoint hostnames share the listener, and a route that wins on another listener
// stays accepted.
func TestHTTPAndGRPCRoutesOnOneListener(t *testing.T) {
	gw := gateway("gw", "  - {name: a, port: 80, protocol: HTTP}\n  - {name: b, port: 8080, protocol: HTTP, hostname: api.example.com}\n"+
		"  - {name: c, port: 9090, protocol: HTTP, hostname: www.example.com}\n")
	grpc := func(name string, age int, parent, hosts string) string {
		return route("GRPCRoute", "infra", name, age, "  parentRefs: ["+parent+"]\n  hostnames: "+hosts+"\n  rules:\n  - backendRefs: [{name: rpc, namespace: shop, port: 9000}]\n")
	}
	r := resolve(gatewayInputs(t, gw, shopGrant,
		httpRoute("infra", "web", -10, "{name: gw}", "  hostnames: [\"*.example.com\"]\n"),
		grpc("rpc", 0, "{name: gw, sectionName: a}", "[api.example.com]"),
		grpc("rpc-elsewhere", 0, "{name: gw, sectionName: a}", "[rpc.example.net]"),
		grpc("rpc-both", -20, "{name: gw}", "[api.example.com]"),
		httpRoute("infra", "web-late", 5, "{name: gw, sectionName: b}", ""),
	))
	for name, want := range map[string]string{
		"web":           "Accepted ResolvedRefs",    // on c; rpc-both (older) took a and b with api.example.com
		"rpc":           "Accepted ResolvedRefs",    // web lost, so rpc only meets rpc-both, of its own type
		"rpc-elsewhere": "Accepted ResolvedRefs",    // no overlap with web
		"rpc-both":      "Accepted ResolvedRefs",    // oldest
		"web-late":      "!Conflicted ResolvedRefs", // b: rpc-both is older, api.example.com
	} {
		if got := r.parent(name, 0); got != want {
			t.Errorf("route %s: %s, want %s", name, got, want)
		}
	}
	want := "80 a[] api.example.com{rpc-both/0.0 rpc/0.0} rpc.example.net{rpc-elsewhere/0.0}\n" +
		"8080 b[api.example.com] api.example.com{rpc-both/0.0}\n" +
		"9090 c[www.example.com] www.example.com{web/0.0}"
	if got := edgeSummary(r.edges["gw"]); got != want {
		t.Errorf("edge:\n%s\nwant\n%s", got, want)
	}
	const lost = "where the older GRPCRoute infra/rpc-both has overlapping hostnames (of an HTTPRoute and a GRPCRoute whose hostnames intersect, only the older is accepted: GEP-1016)"
	if got, want := r.routes["web"].Parents[0].Accepted.Message, "bound to listener c of Gateway infra/gw; not to listener a, "+lost+"; listener b, "+lost; got != want {
		t.Errorf("message %q\nwant      %q", got, want)
	}
	if got, want := r.routes["web-late"].Parents[0].Accepted.Message, "not bound to listener b, "+lost; got != want {
		t.Errorf("message %q\nwant      %q", got, want)
	}
}

// TestL4Bindings: TCP, TLS and UDP listeners list their routes oldest first (every route
// Accepted and counted, as conformance TCPRouteMultipleRoutesAttachment asks; the first serves a
// TCP or UDP listener); on a TLS listener each SNI name goes to the oldest TLSRoute having it,
// a name a more specific listener takes is left out, and a TCPRoute takes the rest (Terminate);
// backends must be ports of the route's transport.
func TestL4Bindings(t *testing.T) {
	gw := gateway("gw", `  - {name: tcp, port: 5432, protocol: TCP}
  - {name: dns, port: 53, protocol: UDP}
  - {name: pass, port: 443, protocol: TLS, hostname: "*.example.com", tls: {mode: Passthrough}}
  - {name: pass-db, port: 443, protocol: TLS, hostname: db.example.com, tls: {mode: Passthrough}}
  - {name: term, port: 9443, protocol: TLS, tls: {certificateRefs: [{name: wildcard}]}}
`)
	tcp := func(name string, age int, parent, backends string) string {
		return route("TCPRoute", "infra", name, age, "  parentRefs: ["+parent+"]\n  rules:\n  - backendRefs: "+backends+"\n")
	}
	tls := func(name string, age int, parent, hosts string) string {
		return route("TLSRoute", "infra", name, age, "  parentRefs: ["+parent+"]\n  hostnames: "+hosts+"\n  rules:\n  - backendRefs: [{name: db, namespace: shop, port: 5432}]\n")
	}
	r := resolve(gatewayInputs(t, gw, shopGrant,
		tcp("pg-new", 5, "{name: gw, sectionName: tcp}", "[{name: db, namespace: shop, port: 5432, weight: 9}, {name: web, namespace: shop, port: 80, weight: 1}]"),
		tcp("pg-old", 0, "{name: gw, sectionName: tcp}", "[{name: db, namespace: shop, port: 5432}]"),
		tcp("pg-udp", 9, "{name: gw, sectionName: tcp}", "[{name: dns, namespace: shop, port: 53}]"),
		route("TCPRoute", "infra", "pg-two", 10, "  parentRefs: [{name: gw, sectionName: tcp}]\n  rules:\n  - backendRefs: [{name: db, namespace: shop, port: 5432}]\n  - backendRefs: [{name: web, namespace: shop, port: 80}]\n"),
		route("UDPRoute", "infra", "dns", 0, "  parentRefs: [{name: gw, sectionName: dns}]\n  rules:\n  - backendRefs: [{name: dns, namespace: shop, port: 53}, {name: db, namespace: shop, port: 5432}]\n"),
		tls("tls-a", 0, "{name: gw, port: 443}", "[a.example.com, db.example.com, shared.example.com]"),
		tls("tls-b", 1, "{name: gw, port: 443}", "[shared.example.com, b.example.com, example.org]"),
		tls("tls-c", 2, "{name: gw, sectionName: pass}", "[shared.example.com]"),
		tls("tls-none", 0, "{name: gw, sectionName: pass}", "[example.org]"),
		tls("tls-term", 0, "{name: gw, sectionName: term}", "[mq.example.com]"),
		tcp("tcp-term", -5, "{name: gw, sectionName: term}", "[{name: db, namespace: shop, port: 5432}]"),
		route("TLSRoute", "infra", "tls-http", 3, "  parentRefs: [{name: gw, sectionName: pass}]\n  hostnames: [web.example.com]\n  rules:\n  - backendRefs: [{name: web, namespace: shop, port: 80}]\n"),
	))
	want := "53 dns[] dns()->shop/dns:53,shop/db:5432!UnsupportedProtocol\n" +
		"443 pass-db[db.example.com] tls-a(db.example.com)->shop/db:5432\n" +
		"443 pass[*.example.com] tls-a(a.example.com,shared.example.com)->shop/db:5432 tls-b(b.example.com)->shop/db:5432 tls-http(web.example.com)->shop/web:80!UnsupportedProtocol\n" +
		"5432 tcp[] pg-old()->shop/db:5432 pg-new()->shop/db:5432,shop/web:80 pg-udp()->shop/dns:53!UnsupportedProtocol pg-two()->shop/db:5432\n" +
		"9443 term[] certs=infra/wildcard tcp-term()->shop/db:5432 tls-term(mq.example.com)->shop/db:5432"
	if got := edgeSummary(r.edges["gw"]); got != want {
		t.Errorf("edge:\n%s\nwant\n%s", got, want)
	}
	for name, want := range map[string]string{
		"pg-old": "Accepted ResolvedRefs", "pg-new": "Accepted ResolvedRefs", "pg-udp": "Accepted !UnsupportedProtocol",
		"pg-two": "Accepted ResolvedRefs partial", "dns": "Accepted !UnsupportedProtocol",
		"tls-a": "Accepted ResolvedRefs", "tls-b": "Accepted ResolvedRefs", "tls-c": "Accepted ResolvedRefs",
		"tls-none": "!NoMatchingListenerHostname ResolvedRefs", "tls-term": "Accepted ResolvedRefs", "tcp-term": "Accepted ResolvedRefs",
		"tls-http": "Accepted !UnsupportedProtocol",
	} {
		if got := r.parent(name, 0); got != want {
			t.Errorf("route %s: %s, want %s", name, got, want)
		}
	}
	want = "tcp: Accepted Programmed ResolvedRefs !NoConflicts kinds=TCPRoute attached=4\n" +
		"dns: Accepted Programmed ResolvedRefs !NoConflicts kinds=UDPRoute attached=1\n" +
		"pass: Accepted Programmed ResolvedRefs !NoConflicts kinds=TLSRoute attached=4\n" +
		"pass-db: Accepted Programmed ResolvedRefs !NoConflicts kinds=TLSRoute attached=1\n" +
		"term: Accepted Programmed ResolvedRefs !NoConflicts kinds=TLSRoute,TCPRoute attached=2"
	if got := r.listeners("gw"); got != want {
		t.Errorf("listeners:\n%s\nwant\n%s", got, want)
	}
	msgs := map[string]string{
		"pg-udp": "backendRef Service shop/dns port 53 is UDP: a TCPRoute backend must be a TCP port (any protocol but UDP)",
		"dns":    "backendRef Service shop/db port 5432 is TCP: a UDPRoute backend must be a UDP port",
		// The client's TLS would reach the backend pod's inbound HTTP chain.
		"tls-http": "backendRef Service shop/web port 80 is HTTP: a TLSRoute passes TLS on to its backend, which must be a TCP port (appProtocol tcp, tls, ...)",
	}
	for name, want := range msgs {
		if got := r.routes[name].Parents[0].ResolvedRefs.Message; got != want {
			t.Errorf("route %s: message %q\nwant %q", name, got, want)
		}
	}
	if got, want := r.routes["pg-two"].Parents[0].PartiallyInvalid.Message, "Dropped Rule(s): rule 1: spec.rules[1]: a TCPRoute has one rule (Gateway API v1.6.3, rules MaxItems=1); rules after the first are not served"; got != want {
		t.Errorf("message %q\nwant      %q", got, want)
	}
}

// TestGatewayStatusGolden: the statuses of a realistic edge Gateway (HTTP redirect, HTTPS by SNI
// with a certificate from another namespace, gRPC, TLS passthrough beside HTTPS, TCP, UDP, an
// unsupported protocol), of a Gateway with an address aether cannot take, and of the routes
// bound to them, against testdata/gateway-status.golden.json (refresh with REFRESH_GOLDEN=1).
func TestGatewayStatusGolden(t *testing.T) {
	in := gatewayInputs(t,
		route("Gateway", "infra", "edge", 0, `  gatewayClassName: aether
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
  - name: https
    port: 443
    protocol: HTTPS
    hostname: "*.example.com"
    tls: {certificateRefs: [{name: wildcard}]}
    allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {edge: "yes"}}}}
  - name: shop-https
    port: 443
    protocol: HTTPS
    hostname: shop.example.com
    tls: {certificateRefs: [{name: shop, namespace: shop}]}
    allowedRoutes: {namespaces: {from: All}}
  - name: vault
    port: 443
    protocol: TLS
    hostname: "*.internal.example.com"
    tls: {mode: Passthrough}
  - name: grpc
    port: 8443
    protocol: HTTPS
    hostname: api.example.com
    tls: {certificateRefs: [{name: wildcard}]}
    allowedRoutes: {kinds: [{kind: GRPCRoute}], namespaces: {from: All}}
  - {name: db, port: 5432, protocol: TCP}
  - {name: dns, port: 53, protocol: UDP}
  - {name: custom, port: 8080, protocol: example.com/custom}
`),
		route("Gateway", "infra", "fixed-ip", 0, `  gatewayClassName: aether
  addresses: [{type: Hostname, value: lb.example.com}]
  listeners: [{name: http, port: 80, protocol: HTTP}]
`),
		route("Gateway", "infra", "theirs", 0, "  gatewayClassName: other\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n"),
		shopGrant,
		route("ReferenceGrant", "shop", "certs", 0, `  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]
  to: [{group: "", kind: Secret, name: shop}]
`),
		route("HTTPRoute", "infra", "redirect", -100, `  parentRefs: [{name: edge, sectionName: http}, {name: fixed-ip}, {name: theirs}]
  rules:
  - filters: [{type: RequestRedirect, requestRedirect: {scheme: https, statusCode: 301}}]
`),
		route("HTTPRoute", "shop", "storefront", -50, `  parentRefs:
  - {name: edge, namespace: infra, port: 443}
  - {group: "", kind: Service, name: web}
  hostnames: [shop.example.com, www.example.com, www.example.org]
  rules:
  - matches: [{path: {value: /api}}]
    backendRefs: [{name: web-v2, port: 80}]
  - backendRefs: [{name: web, port: 80}]
  - matches: [{path: {value: /old}}]
    filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Filter, name: f}}]
`),
		route("HTTPRoute", "shop", "cross", 0, `  parentRefs: [{name: edge, namespace: infra, sectionName: https}]
  hostnames: [cross.example.com]
  rules:
  - backendRefs: [{name: api, namespace: other, port: 80}]
`),
		route("HTTPRoute", "other", "api", 0, `  parentRefs: [{name: edge, namespace: infra, sectionName: https}]
  rules:
  - backendRefs: [{name: api, port: 80}]
`),
		route("HTTPRoute", "shop", "legacy", 0, `  parentRefs: [{name: edge, namespace: infra, sectionName: legacy}]
  rules:
  - backendRefs: [{name: web, port: 80}]
`),
		route("GRPCRoute", "shop", "catalog", 0, `  parentRefs: [{name: edge, namespace: infra, sectionName: grpc}]
  rules:
  - matches: [{method: {service: shop.Catalog}}]
    backendRefs: [{name: rpc, port: 9000}]
  - backendRefs: [{name: web, port: 80}]
`),
		route("TLSRoute", "infra", "vault", 0, `  parentRefs: [{name: edge, sectionName: vault}]
  hostnames: [vault.internal.example.com]
  rules:
  - backendRefs: [{name: db, namespace: shop, port: 5432}]
`),
		route("TCPRoute", "infra", "pg", 0, `  parentRefs: [{name: edge, sectionName: db}]
  rules:
  - backendRefs: [{name: db, namespace: shop, port: 5432}]
`),
		route("UDPRoute", "infra", "dns", 0, `  parentRefs: [{name: edge, port: 53}]
  rules:
  - backendRefs: [{name: dns, namespace: shop, port: 53}]
`),
	)
	edges, gateways, routes := ResolveGateways(in)
	var edge []string
	for _, e := range edges {
		edge = append(edge, e.Key.String()+" (service account "+e.ServiceAccount+")")
		edge = append(edge, strings.Split(edgeSummary(e), "\n")...)
	}
	b, err := json.MarshalIndent(struct {
		Gateways []GatewayStatus
		Routes   []GatewayRouteStatus
		Edge     []string
	}{gateways, routes, edge}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Golden(t, "gateway-status.golden.json", append(b, '\n'))
}

// TestCrossNamespaceCertificatesOff: by default a certificateRef into another namespace is refused
// even with a ReferenceGrant (the edge pods, in the Gateway's namespace, would get the key),
// naming the setting; same-namespace certificates are served.
func TestCrossNamespaceCertificatesOff(t *testing.T) {
	grant := route("ReferenceGrant", "shop", "g", 0, "  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]\n  to: [{group: \"\", kind: Secret}]\n")
	gw := gateway("gw", "  - {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: shop, namespace: shop}]}}\n")
	in := gatewayInputs(t, gw, grant)
	in.CrossNamespaceCertificates = false
	r := resolve(in)
	if got, want := r.listeners("gw"), "https: Accepted !Invalid !RefNotPermitted !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0"; got != want {
		t.Errorf("listener: %s\nwant      %s", got, want)
	}
	if msg := r.gateways["gw"].Listeners[0].ResolvedRefs.Message; !strings.Contains(msg, "--edge-cross-namespace-certificates") || !strings.Contains(msg, "Secret shop/shop") {
		t.Errorf("message %q: want the Secret and the setting named", msg)
	}
	if got := edgeSummary(r.edges["gw"]); got != "" {
		t.Errorf("edge serves %s", got)
	}
}
