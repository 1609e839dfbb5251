package xds

import (
	"fmt"
	"testing"

	"github.com/aethermesh/aether/model"
)

// BenchmarkSnapshotBuildL4Routes measures what an L4 route change costs a Builder at 10k services
// (10k endpoints, 20 local pods), against an endpoint change: every build is Build, ValidateAll
// and the snapshot, alternating between two models, each a fresh copy. "endpoint-change" flips
// one endpoint's health (with a TCPRoute and a TLSRoute in place); "tcproute-change" flips a
// TCPRoute's split; "tlsroute-change" moves a TLSRoute's hostname (the port keeps its TLSRoute,
// so the capture listeners keep their listener filters). A route change assembles the capture
// matcher and chains again and rebuilds every pod's listeners, as a Service's VIP change does.
//
//	go test ./xds/ -run '^$' -bench BenchmarkSnapshotBuildL4Routes -benchtime 5x
func BenchmarkSnapshotBuildL4Routes(b *testing.B) {
	const services, endpoints = 10_000, 10_000
	key := func(i int) model.ServiceKey {
		return model.ServiceKey{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i)}
	}
	// Services 4, 9, 14, ... are TCP (benchMesh); their routes must be in their namespaces.
	routes := func(weight int32, host string) []model.Route {
		to := func(i int, w int32) model.BackendRef {
			return model.BackendRef{Kind: model.BackendService, Service: key(i), Port: 80, Weight: w}
		}
		route := func(kind model.RouteKind, on int, hosts []string, bs ...model.BackendRef) model.Route {
			return model.Route{RouteRef: model.RouteRef{Kind: kind, Namespace: key(on).Namespace, Name: fmt.Sprintf("r%d", on)},
				Parents: []model.ParentRef{{Kind: model.ParentService, Service: key(on), Port: 80}}, Hostnames: hosts,
				Rules: []model.RouteRule{{Backends: bs}}}
		}
		return []model.Route{
			route(model.KindTCPRoute, 4, nil, to(54, weight), to(104, 1)),
			route(model.KindTLSRoute, 9, []string{host}, to(59, 1)),
		}
	}
	for _, change := range []string{"endpoint-change", "tcproute-change", "tlsroute-change"} {
		b.Run(fmt.Sprintf("build=%s/services=%d", change, services), func(b *testing.B) {
			mesh := func(weight int32, host string) *model.Mesh {
				return withL4Routes(b, benchMesh(services, endpoints, 20), routes(weight, host))
			}
			var models []*model.Mesh
			switch change {
			case "endpoint-change":
				models = []*model.Mesh{mesh(3, "a.example"), mesh(3, "a.example")}
				first := models[1].Endpoints[models[1].Services[0].Key]
				first[0].Healthy = !first[0].Healthy
			case "tcproute-change":
				models = []*model.Mesh{mesh(3, "a.example"), mesh(1, "a.example")}
			case "tlsroute-change":
				models = []*model.Mesh{mesh(3, "a.example"), mesh(3, "b.example")}
			}
			svids := fakeSVIDs(models[0])
			bl, memo := NewBuilder(Options{}), &hashMemo{}
			for _, m := range models {
				serveBuild(b, bl, m, svids, memo)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				serveBuild(b, bl, models[i%len(models)], svids, memo)
			}
		})
	}
}
