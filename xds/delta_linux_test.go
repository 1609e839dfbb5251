package xds

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"

	"github.com/aethermesh/aether/internal/testenv"
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
	testenv.Eventually(t, time.Minute, "the changed EDS resource sent", func() error {
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

// TestPrivilegedChangedClusterGetsItsEndpoints: with a real Envoy, over delta and state-of-the-
// world ADS, a model that changes an EDS cluster (here the service port's protocol, so the
// cluster gains HTTP/2 options) while its endpoints stay the same takes effect at once: Envoy
// replaces the cluster with a new one that warms only when an EDS response arrives after the
// cluster's, so the server sends the ClusterLoadAssignment again, after the cluster. Without it
// the new cluster would wait for Envoy's initial fetch timeout (15 s) and Envoy would hold the
// CDS ACK until then; the wait below (10 s) stays under that fallback, and the expected time is
// milliseconds.
func TestPrivilegedChangedClusterGetsItsEndpoints(t *testing.T) {
	for _, delta := range []bool{true, false} {
		t.Run(map[bool]string{true: "delta", false: "sotw"}[delta], func(t *testing.T) {
			f := newMeshFixture(t, time.Hour, delta, Options{})
			mesh := func(version uint64, proto model.Protocol) *model.Mesh {
				m := goldenMesh()
				for _, p := range m.Pods {
					if f.pods[p.Name] == nil {
						f.addPod(p.Name, false)
					}
					p.NetnsPath, p.IPs = f.pods[p.Name].Path, []netip.Addr{f.ips[p.Name]}
				}
				for _, s := range m.Services {
					for i := range s.Ports {
						if s.Key == webKey && s.Ports[i].Port == 80 {
							s.Ports[i].Protocol = proto
						}
					}
				}
				return model.New(version, m.Cluster, m.MeshDomain, f.td, m.Node, m.Services, m.Endpoints, m.Pods)
			}
			f.set(mesh(2, model.ProtocolHTTP))
			for i, p := range []model.Protocol{model.ProtocolHTTP2, model.ProtocolHTTP, model.ProtocolHTTP2} {
				if _, err := f.srv.SetMesh(context.Background(), mesh(uint64(3+i), p)); err != nil {
					t.Fatal(err)
				}
				var last error
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					if last = clusterActive(f, p == model.ProtocolHTTP2); last == nil {
						break
					}
					if time.Now().After(deadline) {
						w, _ := f.admin("/config_dump?resource=dynamic_warming_clusters")
						st, _ := f.admin("/stats?filter=web.shop.mesh:80")
						var mf dto.Metric
						_ = f.srv.sent.WithLabelValues(resource.EndpointType).Write(&mf)
						t.Logf("at the deadline: warming clusters %s\nweb:80 stats: %s\nEDS resources sent so far: %v", w, st, mf.GetCounter().GetValue())
						t.Fatalf("change %d (web:80 to %s): %v", i+1, p, last)
					}
				}
			}
		})
	}
}

// clusterActive reports whether Envoy's active web.shop.mesh:80 cluster has HTTP/2 options as
// want says and no cluster is warming.
func clusterActive(f *meshFixture, http2 bool) error {
	q := url.Values{"resource": {"dynamic_active_clusters"}, "name_regex": {`^web\.shop\.mesh:80$`}}
	dump, err := f.admin("/config_dump?" + q.Encode())
	if err != nil {
		return err
	}
	if !strings.Contains(dump, `"name": "web.shop.mesh:80"`) {
		return fmt.Errorf("no active cluster web.shop.mesh:80: %s", dump)
	}
	if got := strings.Contains(dump, "http2_protocol_options"); got != http2 {
		return fmt.Errorf("active cluster has HTTP/2 options: %v, want %v", got, http2)
	}
	st, err := f.admin("/stats?filter=^cluster_manager.warming_clusters$")
	if err != nil {
		return err
	}
	if !strings.Contains(st, ": 0") {
		return fmt.Errorf("clusters warming: %s", strings.TrimSpace(st))
	}
	return nil
}
