package model

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TestRouteGatewayParents: every route model lists its parentRefs of kind Gateway (the defaults,
// namespace defaulting to the route's) apart from its mesh parents, and its hostnames in lower
// case.
func TestRouteGatewayParents(t *testing.T) {
	const parents = `  parentRefs:
  - {name: edge}
  - {group: "", kind: Service, name: web}
  - {group: gateway.networking.k8s.io, kind: Gateway, name: edge, namespace: infra, sectionName: https, port: 443}
  - {group: example.com, kind: Gateway, name: theirs}
  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web, port: 80}
`
	wantGateways := []GatewayParentRef{
		{Index: 0, Gateway: GatewayKey{"shop", "edge"}},
		{Index: 2, Gateway: GatewayKey{"infra", "edge"}, SectionName: "https", Port: 443},
	}
	wantMesh := []ParentRef{
		{Index: 1, Kind: ParentService, Service: ServiceKey{"shop", "web"}},
		{Index: 4, Kind: ParentServiceImport, Service: ServiceKey{"shop", "web"}, Port: 80},
	}
	rule := "  - backendRefs: [{name: web, port: 80}]\n"
	for _, r := range []Route{
		HTTPRouteModel(decode[gwv1.HTTPRoute](t, route("HTTPRoute", "shop", "r", 0, parents+"  hostnames: [WWW.Example.com, \"*.example.net\"]\n  rules:\n"+rule))),
		GRPCRouteModel(decode[gwv1.GRPCRoute](t, route("GRPCRoute", "shop", "r", 0, parents+"  hostnames: [WWW.Example.com, \"*.example.net\"]\n  rules:\n"+rule))),
		TLSRouteModel(decode[gwv1.TLSRoute](t, route("TLSRoute", "shop", "r", 0, parents+"  hostnames: [WWW.Example.com, \"*.example.net\"]\n  rules:\n"+rule))),
		TCPRouteModel(decode[gwv1.TCPRoute](t, route("TCPRoute", "shop", "r", 0, parents+"  rules:\n"+rule))),
		UDPRouteModel(decode[gwv1.UDPRoute](t, route("UDPRoute", "shop", "r", 0, parents+"  rules:\n"+rule))),
	} {
		if d := cmp.Diff(wantGateways, r.GatewayParents); d != "" {
			t.Errorf("%s Gateway parents (-want +got):\n%s", r.Kind, d)
		}
		if d := cmp.Diff(wantMesh, r.Parents); d != "" {
			t.Errorf("%s mesh parents (-want +got):\n%s", r.Kind, d)
		}
		wantHosts := []string{"www.example.com", "*.example.net"}
		if r.Kind == KindTCPRoute || r.Kind == KindUDPRoute {
			wantHosts = nil
		}
		if !slices.Equal(r.Hostnames, wantHosts) {
			t.Errorf("%s hostnames %q, want %q", r.Kind, r.Hostnames, wantHosts)
		}
	}
}

// TestL4RouteModels: an L4 route's rule has its backends (defaults applied, a kind aether does not
// route to Invalid) and no matches; a rule after the first is Unsupported.
func TestL4RouteModels(t *testing.T) {
	r := TCPRouteModel(decode[gwv1.TCPRoute](t, route("TCPRoute", "shop", "pg", 7, `  parentRefs: [{name: edge}]
  rules:
  - name: main
    backendRefs:
    - {name: db, port: 5432, weight: 3}
    - {group: multicluster.x-k8s.io, kind: ServiceImport, name: db, namespace: other}
    - {group: example.com, kind: Bucket, name: b}
  - backendRefs: [{name: db2, port: 5432}]
`)))
	want := Route{
		RouteRef: RouteRef{Kind: KindTCPRoute, Namespace: "shop", Name: "pg"}, Generation: 3, Created: r.Created,
		GatewayParents: []GatewayParentRef{{Gateway: GatewayKey{"shop", "edge"}}},
		Rules: []RouteRule{{
			Name: "main",
			Backends: []BackendRef{
				{Kind: BackendService, Service: ServiceKey{"shop", "db"}, Port: 5432, Weight: 3},
				{Kind: BackendServiceImport, Service: ServiceKey{"other", "db"}, Weight: 1},
				{Kind: "Bucket", Service: ServiceKey{"shop", "b"}, Weight: 1, Invalid: &Condition{Reason: "InvalidKind",
					Message: `backendRef Bucket "b" (group "example.com"): want a Service or a ServiceImport (group multicluster.x-k8s.io)`}},
			},
		}, {
			Backends:    []BackendRef{{Kind: BackendService, Service: ServiceKey{"shop", "db2"}, Port: 5432, Weight: 1}},
			Unsupported: []string{"spec.rules[1]: a TCPRoute has one rule (Gateway API v1.6.3, rules MaxItems=1); rules after the first are not served"},
		}},
	}
	if d := cmp.Diff(want, r); d != "" {
		t.Errorf("TCPRoute (-want +got):\n%s", d)
	}
	if !r.Created.Equal(t0.Add(7e9)) {
		t.Errorf("created %v", r.Created)
	}
}
