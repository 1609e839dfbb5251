package xds

import (
	"fmt"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
)

// benchRoutePath is the path the GAMMA benchmarks request: of benchRoute's ten rules only the
// last one Envoy tries (the RegularExpression rule, which the spec's precedence puts after every
// PathPrefix) matches it, so every request is checked against all ten.
const benchRoutePath = "/orders/checkout"

// benchRoute is the GAMMA benchmarks' HTTPRoute: a producer route in parent's namespace on its
// port 80 with ten rules of the kinds a real route has (exact, prefix and regex paths, header,
// method and query matches, a canary split, header modifiers, a rewrite, a timeout, retries),
// sending to stable and canary (port 80). A request for benchRoutePath without headers matches
// the last rule only: 90/10 to stable/canary, with a RequestHeaderModifier (set and add) and a
// retry policy. Envoy tries the rules in the spec's precedence order (model.ResolveRoutes):
//
//	Exact /healthz
//	PathPrefix /api/v2 + header x-version, /orders + method GET, /legacy, /static
//	PathPrefix /admin + header x-admin
//	PathPrefix /api + header x-user (regex)
//	PathPrefix / + header x-canary, PathPrefix / + query debug
//	RegularExpression /orders/[a-z0-9]+
func benchRoute(name string, parent, stable, canary model.ServiceKey) model.Route {
	d := func(v time.Duration) *time.Duration { return &v }
	n := func(v int) *int { return &v }
	to := func(k model.ServiceKey, w int32) model.BackendRef {
		return model.BackendRef{Kind: model.BackendService, Service: k, Port: 80, Weight: w}
	}
	prefix := func(p string) model.PathMatch { return model.PathMatch{Type: model.MatchPathPrefix, Value: p} }
	header := func(t model.MatchType, name, value string) []model.StringMatch {
		return []model.StringMatch{{Type: t, Name: name, Value: value}}
	}
	return model.Route{
		RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: parent.Namespace, Name: name},
		Parents:  []model.ParentRef{{Kind: model.ParentService, Service: parent, Port: 80}},
		Rules: []model.RouteRule{{
			Matches:  []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchExact, Value: "/healthz"}}},
			Backends: []model.BackendRef{to(stable, 1)},
		}, {
			Matches:  []model.RouteMatch{{Path: prefix("/api/v2"), Headers: header(model.MatchExact, "x-version", "v2")}},
			Backends: []model.BackendRef{to(canary, 1)},
		}, {
			Matches: []model.RouteMatch{{Path: prefix("/api"), Headers: header(model.MatchRegex, "x-user", "test-.*")}},
			Filters: []model.RouteFilter{{Type: model.FilterRequestHeaderModifier,
				Headers: &model.HeaderModifier{Set: []model.Header{{Name: "x-tester", Value: "1"}}}}},
			Backends: []model.BackendRef{to(canary, 1)},
		}, {
			Matches:  []model.RouteMatch{{Path: prefix("/orders"), Method: "GET"}},
			Backends: []model.BackendRef{to(stable, 1)},
		}, {
			Matches: []model.RouteMatch{{Path: prefix("/static")}},
			Filters: []model.RouteFilter{{Type: model.FilterResponseHeaderModifier,
				Headers: &model.HeaderModifier{Set: []model.Header{{Name: "cache-control", Value: "max-age=60"}}}}},
			Backends: []model.BackendRef{to(stable, 1)},
		}, {
			Matches:  []model.RouteMatch{{Path: prefix("/admin"), Headers: header(model.MatchExact, "x-admin", "true")}},
			Backends: []model.BackendRef{to(stable, 1)},
			Timeouts: model.RouteTimeouts{Request: d(5 * time.Second)},
		}, {
			Matches: []model.RouteMatch{{Path: prefix("/legacy")}},
			Filters: []model.RouteFilter{{Type: model.FilterURLRewrite,
				Rewrite: &model.Rewrite{Path: &model.PathModifier{Type: model.ReplacePrefixMatch, Value: "/v1"}}}},
			Backends: []model.BackendRef{to(stable, 1)},
		}, {
			Matches:  []model.RouteMatch{{Path: prefix("/"), Query: header(model.MatchExact, "debug", "1")}},
			Backends: []model.BackendRef{to(canary, 1)},
		}, {
			Matches:  []model.RouteMatch{{Path: prefix("/"), Headers: header(model.MatchExact, "x-canary", "true")}},
			Backends: []model.BackendRef{to(canary, 1)},
		}, {
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchRegex, Value: "/orders/[a-z0-9]+"}}},
			Filters: []model.RouteFilter{{Type: model.FilterRequestHeaderModifier, Headers: &model.HeaderModifier{
				Set: []model.Header{{Name: "x-route", Value: "orders"}}, Add: []model.Header{{Name: "x-mesh", Value: "gamma"}}}}},
			Backends: []model.BackendRef{to(stable, 90), to(canary, 10)},
			Retry:    &model.RouteRetry{Attempts: n(2), Codes: []int{503}},
		}},
	}
}

// withRoutes sets m.Routing to routes resolved against m's services and returns m. Every route
// must be accepted on every parent and every backend valid: a benchmark of routes that are not
// served would measure nothing.
func withRoutes(tb testing.TB, m *model.Mesh, routes []model.Route) *model.Mesh {
	tb.Helper()
	var st []model.RouteStatus
	m.Routing, st = model.ResolveRoutes(servicesOf(m), routes)
	mustAccept(tb, st, true)
	return m
}

// servicesOf indexes m's services by key, as ResolveRoutes and ResolveL4Routes take them.
func servicesOf(m *model.Mesh) map[model.ServiceKey]*model.Service {
	byKey := make(map[model.ServiceKey]*model.Service, len(m.Services))
	for _, s := range m.Services {
		byKey[s.Key] = s
	}
	return byKey
}

// mustAccept fails when a parent of st is not Accepted, or, with refs, has ResolvedRefs False.
func mustAccept(tb testing.TB, st []model.RouteStatus, refs bool) {
	tb.Helper()
	for _, s := range st {
		for _, p := range s.Parents {
			if !p.Accepted.Status || (refs && !p.ResolvedRefs.Status) {
				tb.Fatalf("%s: Accepted %+v, ResolvedRefs %+v", s.Route, p.Accepted, p.ResolvedRefs)
			}
		}
	}
}

// benchMeshRoutes are n benchRoutes over benchMesh's services (n at most services/10): route i
// is on service 10i (an HTTP service in benchMesh) with stable 10i and canary 10i+1. flip sends
// route 0's split the other way (10/90), the change a canary rollout makes.
func benchMeshRoutes(n int, flip bool) []model.Route {
	key := func(i int) model.ServiceKey {
		return model.ServiceKey{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i)}
	}
	routes := make([]model.Route, 0, n)
	for i := 0; i < n; i++ {
		r := benchRoute(fmt.Sprintf("route%d", i), key(10*i), key(10*i), key(10*i+1))
		if i == 0 && flip {
			last := &r.Rules[len(r.Rules)-1]
			last.Backends[0].Weight, last.Backends[1].Weight = 10, 90
		}
		routes = append(routes, r)
	}
	return routes
}

// BenchmarkSnapshotBuildRoutes compares what SetMesh does per model change (Build, ValidateAll,
// the snapshot; as BenchmarkSnapshotBuild) at 10k services and 10k endpoints without GAMMA routes
// and with 1000 benchRoutes (ten rules each, on 1000 of the services): the sub-benchmark key
// routes=0 or routes=1000, so that `benchstat -col /routes` puts the two side by side.
//
//   - build=cold: a new Builder every time (the first model of an agent);
//   - build=endpoint-change: one Builder, the models alternating in one endpoint's health (each a
//     separate copy with its routes resolved separately, as the model assembler makes them): what
//     the routes cost every unrelated change;
//   - build=route-change: one Builder, the models alternating in one route: with routes=1000 one
//     route's canary split flips (90/10 to 10/90), with routes=0 the cluster's only route comes
//     and goes. ResolveRoutes, which the model assembler runs before the build, is timed apart
//     (resolve-ms; ~0 with routes=0).
//
// Goal (issue #23): with 1000 routes at most 1.5 times the time without.
//
//	go test ./xds/ -run '^$' -bench BenchmarkSnapshotBuildRoutes -benchtime 5x -count 5 | tee build.txt
//	benchstat -col /routes build.txt
func BenchmarkSnapshotBuildRoutes(b *testing.B) {
	const services, endpoints = 10_000, 10_000
	for _, build := range []string{"cold", "endpoint-change", "route-change"} {
		for _, nRoutes := range []int{0, 1000} {
			b.Run(fmt.Sprintf("build=%s/services=%d/routes=%d", build, services, nRoutes), func(b *testing.B) {
				var resolving time.Duration
				mesh := func(routes []model.Route) *model.Mesh {
					m := benchMesh(services, endpoints, 20)
					start := time.Now()
					withRoutes(b, m, routes)
					resolving += time.Since(start)
					return m
				}
				var models []*model.Mesh
				switch build {
				case "cold":
					models = []*model.Mesh{mesh(benchMeshRoutes(nRoutes, false))}
				case "endpoint-change":
					models = []*model.Mesh{mesh(benchMeshRoutes(nRoutes, false)), mesh(benchMeshRoutes(nRoutes, false))}
					first := models[1].Endpoints[models[1].Services[0].Key]
					first[0].Healthy = !first[0].Healthy
				case "route-change":
					if nRoutes == 0 {
						models = []*model.Mesh{mesh(nil), mesh(benchMeshRoutes(1, false))}
					} else {
						models = []*model.Mesh{mesh(benchMeshRoutes(nRoutes, false)), mesh(benchMeshRoutes(nRoutes, true))}
					}
				}
				resolve := resolving / time.Duration(len(models))
				svids := fakeSVIDs(models[0])
				bl, memo := NewBuilder(Options{}), &hashMemo{}
				do := func(m *model.Mesh) *Resources {
					if build == "cold" {
						bl = NewBuilder(Options{})
					}
					return serveBuild(b, bl, m, svids, memo)
				}
				for i, m := range models {
					if got, want := gammaFrontends(b, do(m)), len(m.Routing.Ports); got != want {
						b.Fatalf("model %d: %d frontends routed by GAMMA routes in %s, want %d", i, got, CaptureRouteName, want)
					}
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					do(models[i%len(models)])
				}
				b.StopTimer()
				if build == "route-change" {
					b.ReportMetric(float64(resolve.Microseconds())/1e3, "resolve-ms")
				}
			})
		}
	}
}

// serveBuild is what SetMesh does with a model, without SVID issuing: bl's Build of m,
// ValidateAll, and the snapshot (hashes memoised in memo).
func serveBuild(b *testing.B, bl *Builder, m *model.Mesh, svids map[string]*identity.SVID, memo *hashMemo) *Resources {
	b.Helper()
	r, err := bl.Build(m, svids, fakeBundles(m))
	if err != nil {
		b.Fatal(err)
	}
	if err := r.ValidateAll(); err != nil {
		b.Fatal(err)
	}
	if _, err := newSnapshot("1", r.typed(), memo); err != nil {
		b.Fatal(err)
	}
	return r
}

// gammaFrontends counts the entries of r's capture route table whose action is a GAMMA route
// list (gammaRouteList) rather than the default route: the frontends GAMMA routes are served on.
func gammaFrontends(tb testing.TB, r *Resources) int {
	tb.Helper()
	rc := routeNamed(r, CaptureRouteName)
	if rc == nil {
		tb.Fatalf("no route table %s", CaptureRouteName)
	}
	n := 0
	for _, a := range rc.GetVirtualHosts()[0].GetMatcher().GetMatcherTree().GetExactMatchMap().GetMap() {
		if a.GetAction().GetTypedConfig().MessageIs(&routev3.RouteList{}) {
			n++
		}
	}
	return n
}
