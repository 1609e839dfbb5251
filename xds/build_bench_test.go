package xds

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/aethermesh/aether/model"
)

// benchMesh is a synthetic model: services HTTP services (every fifth one TCP) with one port each,
// endpoints spread evenly over them across two clusters and four zones, and pods local pods.
func benchMesh(services, endpoints, pods int) *model.Mesh {
	td := model.DefaultTrustDomain
	svcs := make([]*model.Service, 0, services)
	eps := make(map[model.ServiceKey][]model.Endpoint, services)
	for i := 0; i < services; i++ {
		k := model.ServiceKey{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i)}
		proto := model.ProtocolHTTP
		if i%5 == 4 {
			proto = model.ProtocolTCP
		}
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		svcs = append(svcs, &model.Service{Key: k, Local: true, VIPs: []netip.Addr{vip},
			Ports: []model.ServicePort{{Name: "p", Port: 80, TargetPort: 8080, Protocol: proto}}})
	}
	for j := 0; j < endpoints; j++ {
		s := svcs[j%services]
		ip := netip.AddrFrom4([4]byte{10, byte(64 + j>>16), byte(j >> 8), byte(j)})
		cl := "c1"
		if j%3 == 0 {
			cl = "c2"
		}
		eps[s.Key] = append(eps[s.Key], model.Endpoint{Service: s.Key, Cluster: cl, Region: "r1", Zone: fmt.Sprintf("z%d", j%4),
			PodName: fmt.Sprintf("pod%d", j), PodUID: fmt.Sprintf("uid%d", j), IPs: []netip.Addr{ip},
			Ports:    []model.EndpointPort{{Name: "p", Port: 8080, Protocol: s.Ports[0].Protocol}},
			SPIFFEID: model.SPIFFEID(td, s.Key.Namespace, "sa"+s.Key.Name), Healthy: true})
	}
	lp := make([]*model.LocalPod, 0, pods)
	for p := 0; p < pods; p++ {
		lp = append(lp, &model.LocalPod{UID: fmt.Sprintf("local%d", p), Namespace: fmt.Sprintf("ns%d", p%50), Name: fmt.Sprintf("local%d", p),
			ServiceAccount: fmt.Sprintf("sa%d", p%10), NetnsPath: fmt.Sprintf("/var/run/netns/cni-%d", p),
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 0, byte(p)})}, Ports: []model.PodPort{{Port: 8080, Protocol: model.ProtocolHTTP}}, Ready: true})
	}
	return model.New(1, "c1", "mesh", td, model.Node{Name: "n1", Region: "r1", Zone: "z0"}, svcs, eps, lp)
}

// BenchmarkSnapshotBuild measures what SetMesh does per model change, without SVID issuing:
// Build, ValidateAll on every resource, and the snapshot with its consistency check. "cold"
// builds the model with a new Builder every time (the package function Build). "incremental"
// keeps one Builder and one hash memo, as the Server does, and alternates between two models that
// differ in one endpoint's health, each a fresh copy (as the model assembler makes them); it also
// computes the delta versions each time (what SetSnapshot does when Envoy uses delta xDS), outside
// the timer, reported as versionmap-ms (BenchmarkSnapshotVersions measures them cold). Both
// report the heap retained by the resulting snapshot per endpoint (retained-B/endpoint) besides
// Go's allocation figures.
//
//	go test ./xds/ -run '^$' -bench BenchmarkSnapshotBuild -benchmem -benchtime 3x
func BenchmarkSnapshotBuild(b *testing.B) {
	for _, mode := range []string{"cold", "incremental"} {
		for _, c := range benchSizes {
			b.Run(fmt.Sprintf("%s/services=%d/endpoints=%d", mode, c.services, c.endpoints), func(b *testing.B) {
				models := []*model.Mesh{benchMesh(c.services, c.endpoints, 20)}
				if mode == "incremental" {
					models = append(models, benchMesh(c.services, c.endpoints, 20))
					first := models[1].Endpoints[models[1].Services[0].Key]
					first[0].Healthy = !first[0].Healthy
				}
				svids := fakeSVIDs(models[0])
				bl, memo := NewBuilder(Options{}), &hashMemo{}
				var hashing time.Duration
				build := func(m *model.Mesh) *snapshot {
					if mode == "cold" {
						bl = NewBuilder(Options{})
					}
					r, err := bl.Build(m, svids, fakeBundles(m))
					if err != nil {
						b.Fatal(err)
					}
					if err := r.ValidateAll(); err != nil {
						b.Fatal(err)
					}
					snap, err := newSnapshot("1", r.typed(), memo)
					if err != nil {
						b.Fatal(err)
					}
					if mode == "incremental" {
						b.StopTimer()
						start := time.Now()
						if err := snap.ConstructVersionMap(); err != nil {
							b.Fatal(err)
						}
						hashing += time.Since(start)
						b.StartTimer()
					}
					return snap
				}
				keep := build(models[0])
				hashing = 0
				var with, without runtime.MemStats
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					keep = nil
					keep = build(models[(i+1)%len(models)])
				}
				b.StopTimer()
				if mode == "incremental" {
					b.ReportMetric(float64(hashing.Microseconds())/1e3/float64(b.N), "versionmap-ms")
				}
				// The heap the last snapshot holds: live heap with it minus live heap without it.
				bl, memo = nil, nil
				runtime.GC()
				runtime.ReadMemStats(&with)
				runtime.KeepAlive(keep)
				keep = nil
				runtime.GC()
				runtime.ReadMemStats(&without)
				b.ReportMetric(float64(int64(with.HeapAlloc)-int64(without.HeapAlloc))/float64(c.endpoints), "retained-B/endpoint")
			})
		}
	}
}

var benchSizes = []struct{ services, endpoints int }{
	{100, 10_000}, {1_000, 10_000}, {10_000, 10_000},
	{100, 100_000}, {1_000, 100_000}, {10_000, 100_000},
}

// BenchmarkSnapshotVersions measures the delta versions of a whole snapshot computed from
// nothing (a new Server's first snapshot, or the Builder's first): "library" is
// cache.Snapshot.ConstructVersionMap (every resource encoded whole, as before this package had
// its own snapshot), "memo" the snapshot's own (shared capture parts encoded once, in parallel).
//
//	go test ./xds/ -run '^$' -bench BenchmarkSnapshotVersions -benchtime 3x
func BenchmarkSnapshotVersions(b *testing.B) {
	for _, c := range benchSizes[3:] {
		m := benchMesh(c.services, c.endpoints, 20)
		r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
		if err != nil {
			b.Fatal(err)
		}
		for _, kind := range []string{"library", "memo"} {
			b.Run(fmt.Sprintf("%s/services=%d/endpoints=%d", kind, c.services, c.endpoints), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					var s interface{ ConstructVersionMap() error }
					var err error
					if kind == "library" {
						s, err = cache.NewSnapshot("1", r.typed())
					} else {
						s, err = newSnapshot("1", r.typed(), nil)
					}
					if err != nil {
						b.Fatal(err)
					}
					if err := s.ConstructVersionMap(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
