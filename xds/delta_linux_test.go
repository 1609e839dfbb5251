package xds

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"

	"github.com/aethermesh/aether/model"
)

// TestPrivilegedDeltaSendsOnlyChanges: with delta xDS and a real Envoy, a new model that differs
// in one endpoint's health (a fresh copy of every part, as the assembler makes it) sends that
// service port's EDS resource and nothing else: no cluster, listener or route, because their
// delta versions are the same values' hashes as before (aether_xds_resources_sent_total).
func TestPrivilegedDeltaSendsOnlyChanges(t *testing.T) {
	f := newMeshFixture(t, time.Hour, true, Options{})
	model1 := func(version uint64, healthy bool) *model.Mesh {
		m := goldenMesh()
		for _, p := range m.Pods {
			if f.pods[p.Name] == nil {
				f.addPod(p.Name, false)
			}
			p.NetnsPath, p.IPs = f.pods[p.Name].Path, []netip.Addr{f.ips[p.Name]}
		}
		m.Endpoints[webKey][1].Healthy = healthy // web-2, zone z2, web.shop.mesh:80 only
		return model.New(version, m.Cluster, m.MeshDomain, f.td, m.Node, m.Services, m.Endpoints, m.Pods)
	}
	f.set(model1(2, false))
	sent := func(url string) float64 {
		var mf dto.Metric
		if err := f.srv.sent.WithLabelValues(url).Write(&mf); err != nil {
			t.Fatal(err)
		}
		return mf.GetCounter().GetValue()
	}
	types := []string{resource.ListenerType, resource.ClusterType, resource.EndpointType, resource.RouteType}
	before := map[string]float64{}
	for _, u := range types {
		before[u] = sent(u)
	}
	if before[resource.ClusterType] == 0 || before[resource.EndpointType] == 0 {
		t.Fatalf("first snapshot sent no clusters or endpoints: %v", before)
	}
	f.set(model1(3, true))
	waitFor(t, "the changed EDS resource sent", func() error {
		if n := sent(resource.EndpointType) - before[resource.EndpointType]; n < 1 {
			return fmt.Errorf("%v EDS resources sent", n)
		}
		return nil
	})
	for _, u := range types {
		want := 0.0
		if u == resource.EndpointType {
			want = 1
		}
		if got := sent(u) - before[u]; got != want {
			t.Errorf("%s: %v resources sent for a one-endpoint change, want %v", u, got, want)
		}
	}
}
