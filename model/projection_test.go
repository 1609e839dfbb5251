package model

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

var (
	webKey      = ServiceKey{"shop", "web"}
	webImport80 = Frontend{Service: webKey, Import: true, Port: 80}
)

// originRoutes are the routes of an exporting cluster around Service shop/web: two producer
// routes (one also on a Gateway and on shop/web-v2), a consumer route, a route of another
// service and a ServiceImport route.
func originRoutes(t *testing.T) Sources {
	return routeSources(t,
		route("HTTPRoute", "shop", "canary", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: web}\n  - {group: \"\", kind: Service, name: web-v2}\n  - {name: edge}\n  hostnames: [shop.example]\n"+`  rules:
  - matches: [{headers: [{name: x-canary, value: "yes"}]}]
    backendRefs: [{name: web-v2, port: 80}]
  - backendRefs: [{name: web, port: 80, weight: 9}, {name: web-v2, port: 80, weight: 1}]
`),
		route("HTTPRoute", "shop", "pin", 0, webParent+"  rules:\n  - matches: [{path: {type: Exact, value: /pin}}]\n"),
		route("HTTPRoute", "client", "consumer", 0, webParent+"  rules:\n  - backendRefs: [{name: web, namespace: shop, port: 80}]\n"),
		route("HTTPRoute", "shop", "other", 0, "  parentRefs:\n  - {group: \"\", kind: Service, name: web-v2}\n  rules:\n  - {}\n"),
		route("HTTPRoute", "shop", "clusterset", 0, "  parentRefs:\n  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web}\n  rules:\n  - {}\n"),
	)
}

func sourceRoutes(in Sources) []Route {
	var rs []Route
	for _, r := range in.GRPCRoutes {
		rs = append(rs, GRPCRouteModel(r))
	}
	for _, r := range in.HTTPRoutes {
		rs = append(rs, HTTPRouteModel(r))
	}
	return rs
}

// projectionOf is the Projection an importer reads for what ProjectService gives origin's routes,
// through the registry record (RouteToProto, ProjectionFromProto).
func projectionOf(t *testing.T, origin string, created time.Time, version uint64, routes []Route) Projection {
	t.Helper()
	c := &registryv1.ServiceConfigProjection{Version: version, ExportTime: t0.Format(time.RFC3339Nano), ExportCreateTime: created.Format(time.RFC3339Nano)}
	for _, r := range ProjectService(webKey, routes) {
		c.Routes = append(c.Routes, RouteToProto(r))
	}
	p, err := ProjectionFromProto(origin, "r1", webKey, c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProjectServiceIsTheLocalProducerConfig: the projection of shop/web holds exactly its producer
// routes (kind Service parentRefs naming it, in its namespace), trimmed to those parentRefs, in a
// stable order; the origin routes its own callers with exactly these (the same entries on the
// Service frontend from the projection alone as from every route of the cluster); an importer
// routes the clusterset frontend with the same rules, Service backends made ServiceImport ones.
func TestProjectServiceIsTheLocalProducerConfig(t *testing.T) {
	in := originRoutes(t)
	all := sourceRoutes(in)
	got := ProjectService(webKey, all)
	var names []string
	for _, r := range got {
		names = append(names, r.RouteRef.String())
		if len(r.Parents) != 1 || r.Parents[0].Service != webKey || r.Parents[0].Kind != ParentService || r.GatewayParents != nil || r.Hostnames != nil {
			t.Errorf("%s projected with parents %+v, gateway parents %+v, hostnames %v; want only its Service parentRef naming shop/web", r.RouteRef, r.Parents, r.GatewayParents, r.Hostnames)
		}
	}
	if want := []string{"HTTPRoute shop/canary", "HTTPRoute shop/pin"}; !slices.Equal(names, want) {
		t.Fatalf("ProjectService(shop/web) = %v, want %v", names, want)
	}
	slices.Reverse(all)
	if d := cmp.Diff(got, ProjectService(webKey, all), cmpopts.EquateEmpty()); d != "" {
		t.Errorf("projection depends on the order of routes:\n%s", d)
	}

	// The origin: the Service frontend's producer entries from the projection alone.
	m := Assemble(1, in)
	fromAll := m.Routing.For(web80, "other")
	only, _ := ResolveRoutes(m.byKey, got)
	if d := cmp.Diff(fromAll, only.For(web80, "other")); d != "" {
		t.Errorf("the origin's producer routing differs from its projection's:\n%s", d)
	}

	// An importer (the same services; shop/web is imported here) applies it to the clusterset
	// frontend: the same matches in the same order, Service backends now ServiceImport backends.
	imp := routeSources(t)
	imp.Projections = []Projection{projectionOf(t, "beta", t0, 1, sourceRoutes(in))}
	imp.Exports = []ExportMark{betaExport(webKey)}
	mi := Assemble(1, imp)
	entries := mi.Routing.For(webImport80, "other")
	if len(entries) != len(fromAll) {
		t.Fatalf("importer: %d entries on %s, want %d: %s", len(entries), webImport80, len(fromAll), entryNames(entries))
	}
	for i, e := range entries {
		o := fromAll[i]
		if e.Route.Origin != "beta" || e.Route.Name != o.Route.Name || e.RuleIndex != o.RuleIndex || !cmp.Equal(e.Match, o.Match) {
			t.Errorf("importer entry %d = %s rule %d, want %s rule %d from cluster beta", i, e.Route, e.RuleIndex, o.Route, o.RuleIndex)
		}
		for _, b := range e.Rule.Backends {
			if b.Kind != BackendServiceImport {
				t.Errorf("importer entry %s: backend %s of kind %s, want ServiceImport", e.Route, b.Service, b.Kind)
			}
		}
	}
	// shop/web-v2 is not exported from beta: its share is a backend not found, said in Problems.
	probs := mi.ConfigImports().Problems[webKey]
	if len(probs) == 0 || !strings.Contains(strings.Join(probs, "\n"), "Service shop/web-v2: not exported from cluster beta") {
		t.Errorf("Problems[shop/web] = %q, want the backend shop/web-v2 not exported from beta", probs)
	}
	if st := mi.RouteStatuses(); len(st) != 0 {
		t.Errorf("importer route statuses = %+v, want none: imported routes have no object here", st)
	}
}

// betaExport is cluster beta's export mark of svc (region r1, created at t0).
func betaExport(svc ServiceKey) ExportMark {
	return ExportMark{Service: svc, Cluster: "beta", Region: "r1", Created: t0}
}

// TestSelectProjections: only projections of origins that export the service count (others
// ignored, NotExported); then the control cluster's only when one is set (others ignored and
// marked NotControl), else the oldest export by the origin's export mark (not by what the
// projection claims), then the smaller cluster name, whatever the versions and the order of
// the input.
func TestSelectProjections(t *testing.T) {
	var marks []ExportMark
	p := func(origin string, createdAge int, version uint64) Projection {
		created := t0.Add(time.Duration(createdAge) * time.Second)
		marks = append(marks, ExportMark{Service: webKey, Cluster: origin, Created: created})
		// The projection claims the oldest time possible: only the mark's counts.
		return Projection{Service: webKey, Origin: origin, Version: version, ExportCreated: time.Unix(0, 0)}
	}
	unexported := func(origin string) Projection {
		return Projection{Service: webKey, Origin: origin, Version: 1, ExportCreated: time.Unix(0, 0)}
	}
	for _, tc := range []struct {
		name      string
		in        func() []Projection
		control   string
		want      string
		notCtl    int
		notExp    int
		ignoredOK int
	}{
		{"oldest export wins over a newer version", func() []Projection { return []Projection{p("alpha", 10, 99), p("beta", 0, 1)} }, "", "beta", 0, 0, 1},
		{"same creation time: the smaller cluster name", func() []Projection { return []Projection{p("zeta", 0, 1), p("beta", 0, 7), p("gamma", 0, 3)} }, "", "beta", 0, 0, 2},
		{"control cluster only", func() []Projection { return []Projection{p("alpha", 10, 1), p("beta", 0, 1)} }, "alpha", "alpha", 1, 0, 0},
		{"control cluster without a projection: nothing applies", func() []Projection { return []Projection{p("beta", 0, 1)} }, "alpha", "", 1, 0, 0},
		{"an origin that does not export the service cannot take it, whatever it claims", func() []Projection { return []Projection{p("beta", 10, 1), unexported("aaa")} }, "", "beta", 0, 1, 0},
		{"nor as the control cluster", func() []Projection { return []Projection{p("beta", 0, 1), unexported("alpha")} }, "alpha", "", 1, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marks = nil
			in := tc.in()
			rev := slices.Clone(in)
			slices.Reverse(rev)
			rmarks := slices.Clone(marks)
			slices.Reverse(rmarks)
			for i, order := range [][]Projection{in, rev} {
				ms := marks
				if i == 1 {
					ms = rmarks
				}
				sel := SelectProjections(order, ms, tc.control)
				got := ""
				if a := sel.Applied[webKey]; a != nil {
					got = a.Origin
				}
				nc, ne, other := 0, 0, 0
				for _, ig := range sel.Ignored {
					switch {
					case ig.NotExported:
						ne++
					case ig.NotControl:
						nc++
					default:
						other++
					}
					if ig.Reason == "" {
						t.Errorf("ignored %s without a reason", ig.Projection)
					}
				}
				if got != tc.want || nc != tc.notCtl || ne != tc.notExp || other != tc.ignoredOK {
					t.Errorf("applied %q, ignored %d not-control, %d not-exported and %d others; want %q, %d, %d, %d (%+v)", got, nc, ne, other, tc.want, tc.notCtl, tc.notExp, tc.ignoredOK, sel.Ignored)
				}
			}
		})
	}
}

// TestImportRoutesAuthority: a projection attaches routes to its own service only: a route in
// another namespace and parentRefs naming another service are dropped; a local producer route on
// the ServiceImport overrides the whole projection; consumer routes are left to ResolveRoutes.
func TestImportRoutesAuthority(t *testing.T) {
	rogue := []Route{
		{RouteRef: RouteRef{Kind: KindHTTPRoute, Namespace: "client", Name: "elsewhere"},
			Parents: []ParentRef{{Kind: ParentService, Service: webKey}}, Rules: []RouteRule{{Matches: []RouteMatch{{Path: PathMatch{Type: MatchPathPrefix, Value: "/"}}}}}},
		{RouteRef: RouteRef{Kind: KindHTTPRoute, Namespace: "shop", Name: "grab"},
			Parents: []ParentRef{{Kind: ParentService, Service: ServiceKey{"shop", "web-v2"}}, {Index: 1, Kind: ParentService, Service: webKey}},
			Rules:   []RouteRule{{Matches: []RouteMatch{{Path: PathMatch{Type: MatchPathPrefix, Value: "/"}}}, Backends: []BackendRef{{Kind: BackendService, Service: webKey, Port: 80, Weight: 1}}}}},
	}
	applied := map[ServiceKey]*Projection{webKey: {Service: webKey, Origin: "beta", Region: "r1", Version: 2, Routes: rogue}}
	exports := []ExportMark{betaExport(webKey)}
	got, overridden := ImportRoutes(applied, nil, exports)
	if len(got) != 1 || got[0].Name != "grab" || len(got[0].Parents) != 1 || got[0].Parents[0].Service != webKey || got[0].Parents[0].Kind != ParentServiceImport || got[0].Parents[0].Index != 1 {
		t.Fatalf("ImportRoutes = %+v, want only shop/grab with its ServiceImport parentRef to shop/web (index 1)", got)
	}
	if got[0].Origin != "beta" || got[0].Rules[0].Backends[0].Kind != BackendServiceImport || got[0].Rules[0].Backends[0].Invalid != nil || len(overridden) != 0 {
		t.Errorf("imported route %+v overridden %v, want origin beta and a valid ServiceImport backend", got[0], overridden)
	}
	// A backend the origin does not export is invalid (its share gets 500), a ServiceImport
	// backend is left to ResolveRoutes.
	other := ServiceKey{"shop", "web-v2"}
	applied[webKey].Routes[1].Rules[0].Backends = append(slices.Clone(rogue[1].Rules[0].Backends),
		BackendRef{Kind: BackendService, Service: other, Port: 80, Weight: 1}, BackendRef{Kind: BackendServiceImport, Service: other, Port: 80, Weight: 1})
	got, _ = ImportRoutes(applied, nil, exports)
	bs := got[0].Rules[0].Backends
	if bs[1].Invalid == nil || !strings.Contains(bs[1].Invalid.Message, "not exported from cluster beta") || bs[2].Invalid != nil {
		t.Errorf("backends %+v: want the Service web-v2 beta does not export invalid, the ServiceImport web-v2 left alone", bs)
	}
	if rogue[1].Rules[0].Backends[0].Kind != BackendService {
		t.Error("ImportRoutes changed the projection's routes")
	}
	local := sourceRoutes(routeSources(t, route("HTTPRoute", "shop", "mine", 0, "  parentRefs:\n  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web}\n  rules:\n  - {}\n")))
	if got, overridden := ImportRoutes(applied, local, exports); len(got) != 0 || !slices.Equal(overridden, []ServiceKey{webKey}) {
		t.Errorf("with a local producer route on the ServiceImport: imported %+v, overridden %v; want nothing imported, shop/web overridden", got, overridden)
	}
	consumer := sourceRoutes(routeSources(t, route("HTTPRoute", "client", "theirs", 0, "  parentRefs:\n  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web, namespace: shop}\n  rules:\n  - {}\n")))
	if got, overridden := ImportRoutes(applied, consumer, exports); len(got) != 1 || len(overridden) != 0 {
		t.Errorf("with a consumer route: imported %d routes, overridden %v; want the projection imported", len(got), overridden)
	}
}

// TestAssembleLocalWinsAndConsumers: on the clusterset frontend, callers get the imported
// producer routes, a namespace with a consumer route gets its own, and a local producer route on
// the ServiceImport replaces the import (ConfigImports.Overridden).
func TestAssembleLocalWinsAndConsumers(t *testing.T) {
	proj := projectionOf(t, "beta", t0, 4, sourceRoutes(originRoutes(t)))
	in := routeSources(t, route("HTTPRoute", "client", "theirs", 0, "  parentRefs:\n  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web, namespace: shop}\n  rules:\n  - {}\n"))
	in.Projections = []Projection{proj}
	in.Exports = []ExportMark{betaExport(webKey), betaExport(ServiceKey{"shop", "web-v2"})}
	m := Assemble(1, in)
	if got := entryNames(m.Routing.For(webImport80, "other")); got == "" || !strings.Contains(got, "canary") {
		t.Errorf("callers in other: %q, want the imported routes", got)
	}
	if got := entryNames(m.Routing.For(webImport80, "client")); got != "theirs/0.0" {
		t.Errorf("callers in client: %q, want their consumer route", got)
	}
	if got := entryNames(m.Routing.For(web80, "other")); got != "" {
		t.Errorf("the local Service frontend got %q: an import binds to the ServiceImport only", got)
	}
	in.HTTPRoutes = append(in.HTTPRoutes, decode[gwv1.HTTPRoute](t, route("HTTPRoute", "shop", "mine", 0, "  parentRefs:\n  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web}\n  rules:\n  - {}\n")))
	m = Assemble(2, in)
	if got := entryNames(m.Routing.For(webImport80, "other")); got != "mine/0.0" {
		t.Errorf("with a local producer route: %q, want only it (local wins)", got)
	}
	if got := m.ConfigImports().Overridden; !slices.Equal(got, []ServiceKey{webKey}) {
		t.Errorf("Overridden = %v, want [shop/web]", got)
	}
}

// TestConfigDrift: nothing when this cluster applies the projection as it is; each local route
// that replaces it for some callers is named.
func TestConfigDrift(t *testing.T) {
	origin := sourceRoutes(originRoutes(t))
	proj := projectionOf(t, "beta", t0, 4, origin)
	if d := ConfigDrift(webKey, &proj, nil); d != nil {
		t.Errorf("no local routes: drift %q", d)
	}
	// The same producer routes in this cluster (GitOps to both): no drift, whatever their age.
	same := sourceRoutes(originRoutes(t))
	for i := range same {
		same[i].Created, same[i].Generation = t0.Add(time.Hour), 9
	}
	if d := ConfigDrift(webKey, &proj, ProjectService(webKey, same)); d != nil {
		t.Errorf("identical producer routes: drift %q", d)
	}
	local := sourceRoutes(routeSources(t,
		route("HTTPRoute", "client", "theirs", 0, "  parentRefs:\n  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web, namespace: shop}\n  rules:\n  - {}\n"),
		route("HTTPRoute", "shop", "mine", 0, "  parentRefs:\n  - {group: multicluster.x-k8s.io, kind: ServiceImport, name: web}\n  rules:\n  - {}\n"),
		route("HTTPRoute", "shop", "svc-only", 0, webParent+"  rules:\n  - {}\n"),
	))
	d := ConfigDrift(webKey, &proj, local)
	want := []string{"callers in namespace client use consumer routes HTTPRoute client/theirs instead of the config projected from shop/web from cluster beta (version 4)",
		"callers of the local Service shop/web use producer routes HTTPRoute shop/svc-only, which differ from the config projected from shop/web from cluster beta (version 4)",
		"local producer routes HTTPRoute shop/mine on ServiceImport shop/web replace the config projected from shop/web from cluster beta (version 4) for every caller"}
	if !slices.Equal(d, want) {
		t.Errorf("drift =\n%s\nwant\n%s", strings.Join(d, "\n"), strings.Join(want, "\n"))
	}
	if d := ConfigDrift(webKey, nil, local[:1]); len(d) != 1 || !strings.Contains(d[0], "the home cluster projects no routes") {
		t.Errorf("consumer route without a projection: %q", d)
	}
}

// TestProjectionFromProtoRefusals: a bad time or route names the projection and the field.
func TestProjectionFromProtoRefusals(t *testing.T) {
	good := &registryv1.ServiceConfigProjection{Version: 1, ExportTime: "2026-12-01T00:00:00Z", ExportCreateTime: "2026-12-01T00:00:00Z"}
	if _, err := ProjectionFromProto("beta", "r1", webKey, good); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(c *registryv1.ServiceConfigProjection){
		"export_time":        func(c *registryv1.ServiceConfigProjection) { c.ExportTime = "soon" },
		"export_create_time": func(c *registryv1.ServiceConfigProjection) { c.ExportCreateTime = "" },
		"routes[0]":          func(c *registryv1.ServiceConfigProjection) { c.Routes = []*registryv1.Route{{}} },
	} {
		c := &registryv1.ServiceConfigProjection{Version: 1, ExportTime: good.ExportTime, ExportCreateTime: good.ExportCreateTime}
		mod(c)
		_, err := ProjectionFromProto("beta", "r1", webKey, c)
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "beta") {
			t.Errorf("%s: error %v, want one naming the field and the origin", name, err)
		}
	}
}
