package xds

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// gammaRoutes are routes over goldenMesh's services using every match type and filter: a
// producer HTTPRoute on shop/web port 80, a producer GRPCRoute on its port 9090, and a consumer
// route in shop for the ServiceImport edge/api.
func gammaRoutes() []model.Route {
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	api := model.ServiceKey{Namespace: "edge", Name: "api"}
	d := func(v time.Duration) *time.Duration { return &v }
	n := func(v int) *int { return &v }
	hm := &model.HeaderModifier{Set: []model.Header{{Name: "x-set", Value: "1"}}, Add: []model.Header{{Name: "x-add", Value: "2"}}, Remove: []string{"x-gone"}}
	return []model.Route{{
		RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: "web"},
		Parents:  []model.ParentRef{{Kind: model.ParentService, Service: web, Port: 80}},
		Rules: []model.RouteRule{{
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchExact, Value: "/exact"}, Method: "POST",
				Headers: []model.StringMatch{{Type: model.MatchExact, Name: "x-a", Value: "1"}, {Type: model.MatchRegex, Name: "x-b", Value: "v[0-9]+"}},
				Query:   []model.StringMatch{{Type: model.MatchExact, Name: "q", Value: "1"}, {Type: model.MatchRegex, Name: "r", Value: "a.*"}}}},
			Filters: []model.RouteFilter{
				{Type: model.FilterRequestHeaderModifier, Headers: hm},
				{Type: model.FilterResponseHeaderModifier, Headers: hm},
				{Type: model.FilterRequestMirror, Mirror: &model.Mirror{Backend: model.BackendRef{Kind: model.BackendService, Service: web, Port: 80}, Numerator: 25, Denominator: 100}},
				{Type: model.FilterRequestMirror, Mirror: &model.Mirror{Backend: model.BackendRef{Kind: model.BackendServiceImport, Service: api, Port: 80}, Numerator: 1, Denominator: 3}},
			},
			Backends: []model.BackendRef{
				{Kind: model.BackendService, Service: web, Port: 80, Weight: 90},
				{Kind: model.BackendServiceImport, Service: api, Port: 80, Weight: 10, Filters: []model.RouteFilter{{Type: model.FilterRequestHeaderModifier, Headers: hm}}},
				{Kind: model.BackendService, Service: web, Port: 80, Weight: 0},
				{Kind: model.BackendService, Service: model.ServiceKey{Namespace: "shop", Name: "gone"}, Port: 80, Weight: 5},
			},
			Timeouts: model.RouteTimeouts{Request: d(2 * time.Second), BackendRequest: d(500 * time.Millisecond)},
			Retry:    &model.RouteRetry{Attempts: n(3), Codes: []int{502, 503}, Backoff: d(100 * time.Millisecond)},
		}, {
			Matches:  []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchRegex, Value: "/v[0-9]/.*"}}},
			Filters:  []model.RouteFilter{{Type: model.FilterRequestHeaderModifier, Headers: hm}},
			Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}},
		}, {
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/api/"}}, {Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/v1"}}},
			Filters: []model.RouteFilter{{Type: model.FilterURLRewrite, Rewrite: &model.Rewrite{Hostname: "internal", Path: &model.PathModifier{Type: model.ReplacePrefixMatch, Value: "/"}}},
				{Type: model.FilterCORS, CORS: &model.CORS{AllowOrigins: []string{"https://www.foo.com", "https://*.bar.com", "http://local:8080"},
					AllowCredentials: true, AllowMethods: []string{"*"}, AllowHeaders: []string{"*"}, ExposeHeaders: []string{"*"}, MaxAge: 5}}},
			Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}},
			Timeouts: model.RouteTimeouts{BackendRequest: d(time.Second)},
		}, {
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/full"}}},
			Filters: []model.RouteFilter{{Type: model.FilterURLRewrite, Rewrite: &model.Rewrite{Path: &model.PathModifier{Type: model.ReplaceFullPath, Value: "/replaced"}}},
				{Type: model.FilterCORS, CORS: &model.CORS{AllowOrigins: []string{"*"}, AllowMethods: []string{"GET", "POST"}, AllowHeaders: []string{"x-a"},
					ExposeHeaders: []string{"x-b", "x-c"}, MaxAge: 60}}},
			Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}},
		}, {
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/old"}}},
			Filters: []model.RouteFilter{{Type: model.FilterRequestRedirect, Redirect: &model.Redirect{Scheme: "https", Hostname: "new.example", Port: 8443, StatusCode: 308,
				Path: &model.PathModifier{Type: model.ReplacePrefixMatch, Value: "/new"}}}},
		}, {
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/see-other"}}},
			Filters: []model.RouteFilter{{Type: model.FilterRequestRedirect, Redirect: &model.Redirect{StatusCode: 303, Path: &model.PathModifier{Type: model.ReplaceFullPath, Value: "/other"}}}},
		}, {
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/nowhere"}}},
		}},
	}, {
		RouteRef: model.RouteRef{Kind: model.KindGRPCRoute, Namespace: "shop", Name: "rpc"},
		Parents:  []model.ParentRef{{Kind: model.ParentService, Service: web, Port: 9090}},
		Rules: []model.RouteRule{{
			Matches: []model.RouteMatch{
				{GRPC: &model.GRPCMethodMatch{Type: model.MatchExact, Service: "pkg.Echo", Method: "Say"}},
				{GRPC: &model.GRPCMethodMatch{Type: model.MatchExact, Service: "pkg.Echo"}},
				{GRPC: &model.GRPCMethodMatch{Type: model.MatchExact, Method: "Ping"}},
				{GRPC: &model.GRPCMethodMatch{Type: model.MatchRegex, Service: `pkg\..*`}, Headers: []model.StringMatch{{Type: model.MatchExact, Name: "x-v", Value: "2"}}},
				{},
			},
			Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 9090, Weight: 1}},
		}},
	}, {
		RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: "to-api"},
		Parents:  []model.ParentRef{{Kind: model.ParentServiceImport, Service: api}},
		Rules: []model.RouteRule{{
			Matches:  []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}},
			Filters:  []model.RouteFilter{{Type: model.FilterRequestHeaderModifier, Headers: &model.HeaderModifier{Set: []model.Header{{Name: "x-consumer", Value: "shop"}}}}},
			Backends: []model.BackendRef{{Kind: model.BackendServiceImport, Service: api, Port: 80, Weight: 1}},
		}},
	}}
}

// gammaMesh is goldenMesh with gammaRoutes resolved and a pod in namespace edge (which has no
// consumer routes, so it uses the shared capture route table).
func gammaMesh(t *testing.T, routes []model.Route) *model.Mesh {
	g := goldenMesh()
	pods := append(g.Pods, &model.LocalPod{UID: "uid-edge", Namespace: "edge", Name: "edge-client", ServiceAccount: "edge",
		NetnsPath: "/var/run/netns/cni-edge", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.6")}, Ready: true})
	m := model.New(g.Version, g.Cluster, g.MeshDomain, g.TrustDomain, g.Node, g.Services, g.Endpoints, pods)
	var st []model.RouteStatus
	m.Routing, st = model.ResolveRoutes(servicesOf(m), routes)
	mustAccept(t, st, false)
	return m
}

// TestBuildGAMMAGolden builds goldenMesh with routes using every match type and filter and
// compares the route tables with their golden file; they pass ValidateAll and the snapshot is
// Consistent. The consumer routes of namespace shop are in the one capture table, behind a match
// on the caller's namespace, and every capture listener keeps the shared table.
func TestBuildGAMMAGolden(t *testing.T) {
	m := gammaMesh(t, gammaRoutes())
	r := buildValid(t, m, Options{})
	testenv.Golden(t, "gamma.routes.json", stableJSON(t, asMessages(r.Routes)))

	var names []string
	for _, rc := range r.Routes {
		names = append(names, rc.Name)
	}
	if got := strings.Join(names, " "); got != "capture-http capture-http-headless lane" {
		t.Errorf("route tables = %s, want the shared ones only", got)
	}
	for _, l := range r.Listeners {
		if strings.HasPrefix(l.Name, "capture|") {
			if got := rdsName(t, l.FilterChains[0]); got != CaptureRouteName {
				t.Errorf("%s: HTTP chain uses %q, want %s", l.Name, got, CaptureRouteName)
			}
		}
	}
	// api's clusterset frontend has shop's consumer route: shop's callers get it and a 404 when
	// it does not match; every other caller the default route.
	rl := routeListOf(t, r, "10.97.0.5:80")
	var got []string
	for _, rt := range rl.Routes {
		fs := ""
		for _, f := range rt.Match.FilterState {
			fs = " caller " + f.GetStringMatch().GetPrefix()
		}
		act := rt.GetRoute().GetCluster()
		if rt.GetDirectResponse() != nil {
			act = fmt.Sprint(rt.GetDirectResponse().Status)
		}
		got = append(got, act+fs)
	}
	want := "api.edge.mesh:80 caller spiffe://aether.internal/ns/shop/sa/|404 caller spiffe://aether.internal/ns/shop/sa/|api.edge.mesh:80"
	if strings.Join(got, "|") != want {
		t.Errorf("api's route list = %s, want %s", strings.Join(got, "|"), want)
	}
}

// routeListOf is the route list the capture route table maps dst ("<vip>:<port>") to.
func routeListOf(t *testing.T, r *Resources, dst string) *routev3.RouteList {
	t.Helper()
	rl := &routev3.RouteList{}
	act := routeNamed(r, CaptureRouteName).GetVirtualHosts()[0].GetMatcher().GetMatcherTree().GetExactMatchMap().GetMap()[dst].GetAction()
	if err := act.GetTypedConfig().UnmarshalTo(rl); err != nil {
		t.Fatalf("route list of %s: %v", dst, err)
	}
	return rl
}

// TestBuilderGAMMAChanges checks that a route change, consumer routes coming and going included,
// rebuilds only the capture route table: the clusters and every pod's listeners are kept.
func TestBuilderGAMMAChanges(t *testing.T) {
	bl := NewBuilder(Options{})
	plain := gammaMesh(t, nil)
	r1, err := bl.Build(plain, fakeSVIDs(plain), fakeBundles(plain))
	if err != nil {
		t.Fatal(err)
	}
	routed := gammaMesh(t, gammaRoutes())
	r2, err := bl.Build(routed, fakeSVIDs(routed), fakeBundles(routed))
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	// same reports whether b kept a's outbound clusters and every listener (the same values,
	// not rebuilt) and its capture route table.
	same := func(a, b *Resources) (kept, routes bool) {
		old := map[string]any{}
		for _, c := range a.Clusters {
			old[c.Name] = c
		}
		for _, l := range a.Listeners {
			old[l.Name] = l
		}
		kept = len(a.Listeners) == len(b.Listeners)
		for _, c := range b.Clusters {
			if strings.Contains(c.Name, ".mesh:") && !strings.HasPrefix(c.Name, mirrorClusterPrefix) {
				kept = kept && old[c.Name] == any(c)
			}
		}
		for _, l := range b.Listeners {
			kept = kept && old[l.Name] == any(l)
		}
		return kept, routeNamed(a, CaptureRouteName) == routeNamed(b, CaptureRouteName)
	}
	if k, rts := same(r1, r2); !k || rts {
		t.Errorf("adding routes: clusters and listeners kept %t (want true), capture route kept %t (want false)", k, rts)
	}
	full, err := Build(routed, fakeSVIDs(routed), fakeBundles(routed), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := stableJSON(t, asMessages(r2.Routes)), stableJSON(t, asMessages(full.Routes)); string(got) != string(want) {
		t.Errorf("incremental route tables differ from a full build")
	}
	if got, want := stableJSON(t, asMessages(r2.Listeners)), stableJSON(t, asMessages(full.Listeners)); string(got) != string(want) {
		t.Errorf("incremental listeners differ from a full build")
	}
	again := gammaMesh(t, gammaRoutes())
	r3, err := bl.Build(again, fakeSVIDs(again), fakeBundles(again))
	if err != nil {
		t.Fatal(err)
	}
	if routeNamed(r3, CaptureRouteName) != routeNamed(r2, CaptureRouteName) {
		t.Errorf("the same routes again rebuilt the route table")
	}
	// One route changes: only its frontend's route list is built again (web's is reused), and
	// the result is a full build's.
	changed := gammaRoutes()
	changed[2].Rules[0].Filters[0].Headers = &model.HeaderModifier{Set: []model.Header{{Name: "x-consumer", Value: "changed"}}}
	cm := gammaMesh(t, changed)
	r5, err := bl.Build(cm, fakeSVIDs(cm), fakeBundles(cm))
	if err != nil {
		t.Fatal(err)
	}
	act := func(r *Resources, dst string) any {
		return routeNamed(r, CaptureRouteName).GetVirtualHosts()[0].GetMatcher().GetMatcherTree().GetExactMatchMap().GetMap()[dst]
	}
	if act(r5, "10.96.0.10:80") != act(r3, "10.96.0.10:80") || act(r5, "10.97.0.5:80") == act(r3, "10.97.0.5:80") {
		t.Errorf("one route changed: web's route list reused %t (want true), api's %t (want false)",
			act(r5, "10.96.0.10:80") == act(r3, "10.96.0.10:80"), act(r5, "10.97.0.5:80") == act(r3, "10.97.0.5:80"))
	}
	full5, err := Build(cm, fakeSVIDs(cm), fakeBundles(cm), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := stableJSON(t, asMessages(r5.Routes)), stableJSON(t, asMessages(full5.Routes)); string(got) != string(want) {
		t.Errorf("one route changed: incremental route tables differ from a full build")
	}
	r4, err := bl.Build(gammaMesh(t, nil), fakeSVIDs(plain), fakeBundles(plain))
	if err != nil {
		t.Fatal(err)
	}
	if k, rts := same(r5, r4); !k || rts {
		t.Errorf("removing routes: clusters and listeners kept %t (want true), capture route kept %t (want false)", k, rts)
	}
	if got, want := stableJSON(t, asMessages(r4.Routes)), stableJSON(t, asMessages(r1.Routes)); string(got) != string(want) {
		t.Errorf("routes removed: the route tables are not those without routes")
	}
}

// rdsName is the route configuration the HTTP connection manager of chain fc names.
func rdsName(t *testing.T, fc *listenerv3.FilterChain) string {
	t.Helper()
	h := &hcmv3.HttpConnectionManager{}
	if err := fc.GetFilters()[0].GetTypedConfig().UnmarshalTo(h); err != nil {
		t.Fatalf("chain %s: %v", fc.GetName(), err)
	}
	return h.GetRds().GetRouteConfigName()
}

func routeNamed(r *Resources, name string) *routev3.RouteConfiguration {
	for _, rc := range r.Routes {
		if rc.Name == name {
			return rc
		}
	}
	return nil
}

// TestCORSPolicy checks the policy's header values: joined lists, "*" kept for methods and
// headers (Envoy echoes the request's), exposeHeaders "*" left out with credentials, credentials
// only when set, and preflights from other origins answered, not forwarded.
func TestCORSPolicy(t *testing.T) {
	p := corsPolicy(&model.CORS{AllowOrigins: []string{"*", "https://a.example"}, AllowMethods: []string{"GET", "OPTIONS"},
		AllowHeaders: []string{"x-1", "x-2"}, ExposeHeaders: []string{"x-3", "x-4"}, MaxAge: 3600})
	if p.AllowMethods != "GET, OPTIONS" || p.AllowHeaders != "x-1, x-2" || p.ExposeHeaders != "x-3, x-4" || p.MaxAge != "3600" ||
		p.AllowCredentials != nil || p.ForwardNotMatchingPreflights.GetValue() || p.AllowOriginStringMatch[0].GetExact() != "*" {
		t.Errorf("policy = %v", p)
	}
	p = corsPolicy(&model.CORS{AllowOrigins: []string{"*"}, AllowCredentials: true, AllowMethods: []string{"*"}, AllowHeaders: []string{"*"}, ExposeHeaders: []string{"*"}, MaxAge: 5})
	if p.AllowMethods != "*" || p.AllowHeaders != "*" || p.ExposeHeaders != "" || !p.AllowCredentials.GetValue() || p.MaxAge != "5" {
		t.Errorf("wildcard policy with credentials = %v", p)
	}
	if err := p.ValidateAll(); err != nil {
		t.Error(err)
	}
	if p := corsPolicy(&model.CORS{AllowOrigins: []string{"*"}, AllowCredentials: true, ExposeHeaders: []string{"x-a", "*", "x-b"}}); p.ExposeHeaders != "x-a, x-b" {
		t.Errorf("exposeHeaders x-a, *, x-b with credentials = %q, want the named ones", p.ExposeHeaders)
	}
	// A backslash in a path modifier is a literal one, not a capture group (\0 is the whole path).
	for _, pm := range []model.PathModifier{{Type: model.ReplaceFullPath, Value: `/x\0`}, {Type: model.ReplacePrefixMatch, Value: `/x\0`}} {
		if got := pathRewrite(model.PathMatch{Type: model.MatchPathPrefix, Value: "/a"}, &pm).Substitution; got != `/x\\0` {
			t.Errorf("%s %q: substitution %q, want the backslash doubled", pm.Type, pm.Value, got)
		}
	}
}

// TestBuildGAMMALocalBackend: web is local and imported (an endpoint in cluster c2 too). A
// Service backendRef of web goes to its local cluster, which holds c1's endpoints only, a
// ServiceImport backendRef to the cluster of every exporting cluster's endpoints (GEP-1748); only
// the HTTP ports of a service that is local and imported have a local cluster.
func TestBuildGAMMALocalBackend(t *testing.T) {
	g := goldenMesh()
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	var services []*model.Service
	for _, s := range g.Services {
		if s.Key == web {
			c := *s
			c.Imported, c.ClustersetVIPs = true, []netip.Addr{netip.MustParseAddr("10.97.0.9")}
			s = &c
		}
		services = append(services, s)
	}
	eps := maps.Clone(g.Endpoints)
	eps[web] = append(slices.Clone(eps[web]), model.Endpoint{Service: web, Cluster: "c2", Region: "r2", Zone: "z9", PodName: "web-far", PodUID: "uid-web-far",
		IPs: []netip.Addr{netip.MustParseAddr("10.244.9.9")}, Ports: []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolHTTP}},
		SPIFFEID: model.SPIFFEID(g.TrustDomain, "shop", "web"), Healthy: true})
	m := withRoutes(t, model.New(g.Version, g.Cluster, g.MeshDomain, g.TrustDomain, g.Node, services, eps, g.Pods), []model.Route{{
		RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: "split"},
		Parents:  []model.ParentRef{{Kind: model.ParentService, Service: web, Port: 80}},
		Rules: []model.RouteRule{{
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}},
			Filters: []model.RouteFilter{{Type: model.FilterRequestMirror, Mirror: &model.Mirror{Backend: model.BackendRef{Kind: model.BackendService, Service: web, Port: 80}, Numerator: 1, Denominator: 1}}},
			Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1},
				{Kind: model.BackendServiceImport, Service: web, Port: 80, Weight: 1}},
		}},
	}})
	r := buildValid(t, m, Options{})
	local, all := "local|web.shop.mesh:80", "web.shop.mesh:80"
	pods := func(name string) []string {
		for _, cla := range r.Endpoints {
			if cla.ClusterName == name {
				var out []string
				for _, l := range cla.Endpoints {
					for _, e := range l.LbEndpoints {
						out = append(out, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
					}
				}
				slices.Sort(out)
				return out
			}
		}
		t.Fatalf("no EDS resource %s", name)
		return nil
	}
	if got := strings.Join(pods(local), " "); got != "10.244.1.7 10.244.2.7" {
		t.Errorf("%s endpoints = %s, want c1's only", local, got)
	}
	if got := strings.Join(pods(all), " "); got != "10.244.1.7 10.244.2.7 10.244.9.9" {
		t.Errorf("%s endpoints = %s, want every cluster's", all, got)
	}
	for _, c := range r.Clusters {
		if strings.HasPrefix(c.Name, "local|") && c.Name != local && c.Name != "local|web.shop.mesh:9090" {
			t.Errorf("cluster %s: only web's HTTP and gRPC ports (local and imported) get a local cluster", c.Name)
		}
	}
	rl := &routev3.RouteList{}
	if err := routeNamed(r, CaptureRouteName).GetVirtualHosts()[0].GetMatcher().GetMatcherTree().GetExactMatchMap().GetMap()["10.96.0.10:80"].GetAction().GetTypedConfig().UnmarshalTo(rl); err != nil {
		t.Fatalf("route list of web's VIP: %v", err)
	}
	ra := rl.Routes[0].GetRoute()
	var got []string
	for _, w := range ra.GetWeightedClusters().GetClusters() {
		got = append(got, w.Name)
	}
	if strings.Join(got, " ") != local+" "+all {
		t.Errorf("backends %v; want the Service backend on %s, the ServiceImport on %s", got, local, all)
	}
	// The mirror: the route names the caller's mirror cluster of the local cluster in a header
	// the mirror policy reads; each local identity has one, over local's endpoints.
	h := rl.Routes[0].RequestHeadersToAdd[0]
	if ra.RequestMirrorPolicies[0].ClusterHeader != MirrorHeader(0) || h.Header.Key != MirrorHeader(0) ||
		h.Header.Value != "mirror|%FILTER_STATE("+CertMapperFilterStateKey+":PLAIN)%|"+local || h.AppendAction != core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
		t.Errorf("mirror policy %v, header %v", ra.RequestMirrorPolicies[0], h)
	}
	for _, p := range m.Pods {
		name := mirrorClusterName(p.SPIFFEID(m.TrustDomain), local)
		if !slices.ContainsFunc(r.Clusters, func(c *clusterv3.Cluster) bool { return c.Name == name }) {
			t.Errorf("no mirror cluster %s", name)
		}
		if got := strings.Join(pods(name), " "); got != "10.244.1.7 10.244.2.7" {
			t.Errorf("%s endpoints = %s, want those of %s", name, got, local)
		}
	}
}

// TestGAMMAWeights checks the Envoy action of backend weights at their edges
// (HTTPBackendRef.weight, 0 to 1,000,000, at most 16 backendRefs): every weight 0 or no backend
// answers 500; a single backend with weight is a plain cluster; a zero weight is left out; the
// largest weights over 16 backends pass validation with their sum; an invalid backend keeps its
// share, sent to a cluster that does not exist (500).
func TestGAMMAWeights(t *testing.T) {
	m := goldenMesh()
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	b := func(w int32) model.BackendRef {
		return model.BackendRef{Kind: model.BackendService, Service: web, Port: 80, Weight: w}
	}
	invalid := model.BackendRef{Kind: model.BackendService, Service: model.ServiceKey{Namespace: "shop", Name: "gone"}, Port: 80, Weight: 3,
		Invalid: &model.Condition{Reason: "BackendNotFound"}}
	max16 := make([]model.BackendRef, 16)
	for i := range max16 {
		max16[i] = b(1_000_000)
	}
	for _, tc := range []struct {
		name     string
		backends []model.BackendRef
		// want is "500" for a direct 500, "cluster <name>", or the weighted clusters "<name>=<w> ...".
		want string
	}{
		{"no backend", nil, "500"},
		{"every weight 0", []model.BackendRef{b(0), b(0)}, "500"},
		{"one backend", []model.BackendRef{b(1)}, "cluster web.shop.mesh:80"},
		{"zero weight left out", []model.BackendRef{b(0), b(7)}, "cluster web.shop.mesh:80"},
		{"1 and 1000000", []model.BackendRef{b(1), b(1_000_000)}, "web.shop.mesh:80=1 web.shop.mesh:80=1000000"},
		{"16 backends of 1000000", max16, strings.TrimSpace(strings.Repeat("web.shop.mesh:80=1000000 ", 16))},
		{"invalid backend keeps its share", []model.BackendRef{b(1), invalid}, "web.shop.mesh:80=1 invalid|Service/shop/gone=3"},
		{"only an invalid backend", []model.BackendRef{invalid}, "cluster invalid|Service/shop/gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := &model.RouteRule{Backends: tc.backends}
			r := gammaRoute(m, 80, model.RouteEntry{Route: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: "w"}, Rule: rule,
				Match: model.RouteMatch{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}})
			if err := r.ValidateAll(); err != nil {
				t.Fatalf("ValidateAll: %v", err)
			}
			var got string
			switch {
			case r.GetDirectResponse() != nil:
				got = fmt.Sprint(r.GetDirectResponse().Status)
			case r.GetRoute().GetCluster() != "":
				got = "cluster " + r.GetRoute().GetCluster()
				if r.GetRoute().ClusterNotFoundResponseCode != routev3.RouteAction_INTERNAL_SERVER_ERROR {
					t.Errorf("cluster_not_found_response_code = %v, want 500", r.GetRoute().ClusterNotFoundResponseCode)
				}
			default:
				var ws []string
				for _, w := range r.GetRoute().GetWeightedClusters().GetClusters() {
					ws = append(ws, fmt.Sprintf("%s=%d", w.Name, w.Weight.GetValue()))
				}
				got = strings.Join(ws, " ")
			}
			if got != tc.want {
				t.Errorf("action = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestGAMMAErrorsAndRedirectFilters: a rule that fails closed answers 500 (a GRPCRoute's 503,
// gRPC UNAVAILABLE, GRPCRouteRule.backendRefs); a GRPCRoute's invalid backend share and a rule
// without backends answer 503; a redirect keeps the rule's response headers and CORS policy.
func TestGAMMAErrorsAndRedirectFilters(t *testing.T) {
	m := goldenMesh()
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	entry := func(kind model.RouteKind, rule *model.RouteRule) model.RouteEntry {
		return model.RouteEntry{Route: model.RouteRef{Kind: kind, Namespace: "shop", Name: "r"}, Rule: rule,
			Match: model.RouteMatch{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}}
	}
	closed := &model.RouteRule{Unsupported: []string{"x"}, FailClosed: true, Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}},
		Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}}}
	for _, tc := range []struct {
		name string
		e    model.RouteEntry
		want string
	}{
		{"HTTPRoute rule fails closed", entry(model.KindHTTPRoute, closed), "direct 500"},
		{"GRPCRoute rule fails closed", entry(model.KindGRPCRoute, closed), "direct 503"},
		{"GRPCRoute without backends", entry(model.KindGRPCRoute, &model.RouteRule{}), "direct 503"},
		{"GRPCRoute invalid backend", entry(model.KindGRPCRoute, &model.RouteRule{Backends: []model.BackendRef{
			{Kind: model.BackendService, Service: web, Port: 9090, Weight: 1, Invalid: &model.Condition{Reason: "BackendNotFound"}}}}), "cluster not found SERVICE_UNAVAILABLE"},
		{"HTTPRoute invalid backend", entry(model.KindHTTPRoute, &model.RouteRule{Backends: []model.BackendRef{
			{Kind: model.BackendService, Service: web, Port: 80, Weight: 1, Invalid: &model.Condition{Reason: "BackendNotFound"}}}}), "cluster not found INTERNAL_SERVER_ERROR"},
	} {
		r := gammaRoute(m, 80, tc.e)
		got := ""
		if d := r.GetDirectResponse(); d != nil {
			got = fmt.Sprint("direct ", d.Status)
		} else {
			got = "cluster not found " + r.GetRoute().GetClusterNotFoundResponseCode().String()
		}
		if got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	redirect := &model.RouteRule{Filters: []model.RouteFilter{
		{Type: model.FilterRequestRedirect, Redirect: &model.Redirect{Hostname: "new.example", StatusCode: 301}},
		{Type: model.FilterResponseHeaderModifier, Headers: &model.HeaderModifier{Set: []model.Header{{Name: "x-moved", Value: "yes"}}}},
		{Type: model.FilterCORS, CORS: &model.CORS{AllowOrigins: []string{"*"}, MaxAge: 5}},
	}}
	r := gammaRoute(m, 80, entry(model.KindHTTPRoute, redirect))
	if r.GetRedirect().GetHostRedirect() != "new.example" || len(r.ResponseHeadersToAdd) != 1 || r.ResponseHeadersToAdd[0].Header.Key != "x-moved" ||
		r.TypedPerFilterConfig[CORSFilterName] == nil {
		t.Errorf("redirect route = %v, want the redirect with the response header and the CORS policy", r)
	}
	if err := r.ValidateAll(); err != nil {
		t.Error(err)
	}
}

// TestGAMMARouteListGuards: a route list Envoy's validation refuses (here a retry back-off of 0,
// which the model never makes) is served as a 500 for its frontend only, with a warning; a
// route on a ServiceImport whose clusterset VIP another service holds does not take that VIP;
// the table is the same from build to build.
func TestGAMMARouteListGuards(t *testing.T) {
	g := goldenMesh()
	web, api := model.ServiceKey{Namespace: "shop", Name: "web"}, model.ServiceKey{Namespace: "edge", Name: "api"}
	var services []*model.Service
	for _, s := range g.Services {
		if s.Key == api {
			c := *s
			// web's VIP too: web comes later in model order, so the VIP is web's.
			c.ClustersetVIPs = []netip.Addr{netip.MustParseAddr("10.96.0.10")}
			s = &c
		}
		services = append(services, s)
	}
	zero := time.Duration(0)
	mesh := func() *model.Mesh {
		m := model.New(g.Version, g.Cluster, g.MeshDomain, g.TrustDomain, g.Node, services, g.Endpoints, g.Pods)
		byKey := map[model.ServiceKey]*model.Service{}
		for _, s := range m.Services {
			byKey[s.Key] = s
		}
		m.Routing, _ = model.ResolveRoutes(byKey, []model.Route{{
			RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: "bad"},
			Parents:  []model.ParentRef{{Kind: model.ParentService, Service: web, Port: 9090}},
			Rules: []model.RouteRule{{Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}},
				Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 9090, Weight: 1}},
				Retry:    &model.RouteRetry{Backoff: &zero}}},
		}, {
			RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "edge", Name: "clash"},
			Parents:  []model.ParentRef{{Kind: model.ParentServiceImport, Service: api, Port: 80}},
			Rules: []model.RouteRule{{Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}},
				Filters: []model.RouteFilter{{Type: model.FilterRequestRedirect, Redirect: &model.Redirect{Hostname: "elsewhere", StatusCode: 302}}}}},
		}})
		return m
	}
	r := buildValid(t, mesh(), Options{})
	if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "Service shop/web:9090") {
		t.Errorf("warnings = %q, want one for web:9090's refused route list", r.Warnings)
	}
	if rl := routeListOf(t, r, "10.96.0.10:9090"); len(rl.Routes) != 1 || rl.Routes[0].GetDirectResponse().GetStatus() != 500 {
		t.Errorf("web:9090's list = %v, want one route answering 500", rl)
	}
	if act := routeNamed(r, CaptureRouteName).GetVirtualHosts()[0].GetMatcher().GetMatcherTree().GetExactMatchMap().GetMap()["10.96.0.10:80"].GetAction(); act.GetName() != "route" ||
		!strings.Contains(act.GetTypedConfig().GetTypeUrl(), "config.route.v3.Route") || strings.Contains(act.GetTypedConfig().GetTypeUrl(), "RouteList") {
		t.Errorf("10.96.0.10:80 = %v, want web's default route (api's route on the clashing clusterset VIP is not web's)", act)
	}
	again := buildValid(t, mesh(), Options{})
	if got, want := stableJSON(t, asMessages(again.Routes)), stableJSON(t, asMessages(r.Routes)); string(got) != string(want) {
		t.Error("the same model built twice gives different route tables")
	}
}

// TestGAMMAMirrorScopeAndBound: a consumer route's mirror gets mirror clusters for its
// namespace's identities only, a producer route's for every local identity; no more than
// maxMirrorClusters are built, the rest counted.
func TestGAMMAMirrorScopeAndBound(t *testing.T) {
	m := goldenMesh()
	bl := NewBuilder(Options{})
	var entries []*svcEntry
	if _, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m)); err != nil {
		t.Fatal(err)
	}
	for _, e := range bl.svcs {
		entries = append(entries, e)
	}
	const target = "web.shop.mesh:80"
	ids := localIDsByNamespace(m) // shop: client, db, web; edge: none in goldenMesh
	ids["edge"] = []string{"spiffe://aether.internal/ns/edge/sa/x"}
	out, omitted, err := mirrorResources(ids, []mirrorTarget{{cluster: target, ns: "edge"}}, entries, nil)
	if err != nil || omitted != 0 || len(out) != 1 || out[mirrorClusterName("spiffe://aether.internal/ns/edge/sa/x", target)] == nil {
		t.Errorf("consumer mirror of edge: %d clusters (%v), omitted %d, %v; want edge's identity only", len(out), slices.Collect(maps.Keys(out)), omitted, err)
	}
	out, _, _ = mirrorResources(ids, []mirrorTarget{{cluster: target}}, entries, nil)
	if len(out) != 4 {
		t.Errorf("producer mirror: %d clusters, want one per local identity (4)", len(out))
	}
	many := map[string][]string{}
	for i := range maxMirrorClusters + 10 {
		many["ns"] = append(many["ns"], fmt.Sprintf("spiffe://aether.internal/ns/ns/sa/%05d", i))
	}
	out, omitted, err = mirrorResources(many, []mirrorTarget{{cluster: target, ns: "ns"}}, entries, nil)
	if err != nil || len(out) != maxMirrorClusters || omitted != 10 {
		t.Errorf("%d identities: %d clusters, omitted %d, %v; want %d and 10", maxMirrorClusters+10, len(out), omitted, err, maxMirrorClusters)
	}
}

// TestBuilderGAMMALocalClusterFollowsImport: when a Service backend's service becomes imported
// too (and so gets a local cluster) with nothing else of the routing changing, the Builder
// builds the route lists again: they name the local cluster, as a full build does.
func TestBuilderGAMMALocalClusterFollowsImport(t *testing.T) {
	g := goldenMesh()
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	mesh := func(imported bool) *model.Mesh {
		var services []*model.Service
		for _, s := range g.Services {
			if s.Key == web {
				c := *s
				c.Imported = imported
				s = &c
			}
			services = append(services, s)
		}
		return withRoutes(t, model.New(g.Version, g.Cluster, g.MeshDomain, g.TrustDomain, g.Node, services, g.Endpoints, g.Pods), []model.Route{{
			RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: "r"},
			Parents:  []model.ParentRef{{Kind: model.ParentService, Service: web, Port: 80}},
			Rules: []model.RouteRule{{Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}},
				Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}}}},
		}})
	}
	bl := NewBuilder(Options{})
	for _, imported := range []bool{false, true, false} {
		m := mesh(imported)
		r, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
		if err != nil {
			t.Fatal(err)
		}
		want := "web.shop.mesh:80"
		if imported {
			want = "local|web.shop.mesh:80"
		}
		if got := routeListOf(t, r, "10.96.0.10:80").Routes[0].GetRoute().GetCluster(); got != want {
			t.Errorf("imported %t: the route sends to %s, want %s", imported, got, want)
		}
		full := buildValid(t, m, Options{})
		if a, b := stableJSON(t, asMessages(r.Routes)), stableJSON(t, asMessages(full.Routes)); string(a) != string(b) {
			t.Errorf("imported %t: incremental route tables differ from a full build", imported)
		}
	}
}
