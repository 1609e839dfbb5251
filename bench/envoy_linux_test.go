package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/xds"
)

// envoyRig is the agent's xDS server and a real Envoy fed by it (admin on a free loopback port).
type envoyRig struct {
	srv   *xds.Server
	envoy *testenv.Envoy
}

func startRig(b *testing.B, build xds.Options, m *model.Mesh) *envoyRig {
	b.Helper()
	ca, err := testenv.NewCA("bench CA")
	if err != nil {
		b.Fatal(err)
	}
	dev, err := identity.NewDevCA(ca.CertPEM, ca.KeyPEM, m.TrustDomain, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := xds.NewServer(xds.ServerOptions{NodeID: "bench", Identity: identity.NewRotator(dev).Provider(), Build: build,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "aetb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "xds.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, l); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	rig := &envoyRig{srv: srv}
	rig.set(b, m) // served before Envoy starts, so Envoy's initial fetch finds it
	boot, err := envoy.Bootstrap(envoy.BootstrapConfig{NodeID: "bench", XDSAddress: "unix://" + sock, AdminAddress: "127.0.0.1:0",
		StateOfTheWorld: os.Getenv("AETHER_BENCH_SOTW") != ""})
	if err != nil {
		b.Fatal(err)
	}
	rig.envoy = testenv.StartEnvoy(b, string(boot), testenv.EnvoyOptions{SkipReadyWait: true})
	if err := rig.envoy.WaitReady(context.Background(), 20*time.Minute); err != nil {
		b.Fatal(err)
	}
	rig.waitApplied(b, srv.Version(), m)
	return rig
}

func (r *envoyRig) set(b *testing.B, m *model.Mesh) string {
	b.Helper()
	v, err := r.srv.SetMesh(context.Background(), m)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// waitApplied waits until Envoy ACKed version v and every pod listener of m is active. Active
// listeners come from the admin API's /listeners (ListenerManager::listeners(), which lists
// ACTIVE ones only: a warming listener is not there yet). /stats is not used: with 10k clusters
// one /stats request takes about a second, which is not the cost being measured.
func (r *envoyRig) waitApplied(b *testing.B, v string, m *model.Mesh) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := r.srv.WaitForAck(ctx, v); err != nil {
		b.Fatal(err)
	}
	for {
		s, err := r.envoy.Admin(ctx, "/listeners")
		if err == nil && allActive(s, m) {
			return
		}
		if ctx.Err() != nil {
			b.Fatalf("listeners not active: %s %v", s, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// allActive reports whether the /listeners text output ("<name>::<address>" lines) lists the
// capture and lane listeners of every pod of m.
func allActive(listeners string, m *model.Mesh) bool {
	for _, p := range m.Pods {
		for _, kind := range []string{"capture|", "lane|"} {
			if !strings.Contains(listeners, kind+p.Namespace+"/"+p.Name+"::") {
				return false
			}
		}
	}
	return true
}

// allocatedBytes reads Envoy's /memory "allocated" (bytes in use by the allocator).
func (r *envoyRig) allocatedBytes(b *testing.B) float64 {
	b.Helper()
	body, err := r.envoy.Admin(context.Background(), "/memory")
	if err != nil {
		b.Fatal(err)
	}
	var mem struct {
		Allocated string `json:"allocated"`
	}
	if err := json.Unmarshal([]byte(body), &mem); err != nil {
		b.Fatal(err)
	}
	var n float64
	fmt.Sscan(mem.Allocated, &n)
	return n
}

// clusterMesh has services one-port services (every fifth TCP) with two endpoints each and pods
// local pods with distinct service accounts.
func clusterMesh(services int, pods []*model.LocalPod) *model.Mesh {
	td := model.DefaultTrustDomain
	svcs := make([]*model.Service, 0, services)
	eps := map[model.ServiceKey][]model.Endpoint{}
	for i := 0; i < services; i++ {
		k := model.ServiceKey{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i)}
		proto := model.ProtocolHTTP
		if i%5 == 4 {
			proto = model.ProtocolTCP
		}
		svcs = append(svcs, &model.Service{Key: k, Local: true, VIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports: []model.ServicePort{{Port: 80, TargetPort: 8080, Protocol: proto}}})
		for e := 0; e < 2; e++ {
			eps[k] = append(eps[k], model.Endpoint{Service: k, Cluster: "c1", PodName: fmt.Sprintf("p%d-%d", i, e), PodUID: fmt.Sprintf("u%d-%d", i, e),
				IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 100 + byte(e), byte(i >> 8), byte(i)})}, Ports: []model.EndpointPort{{Port: 8080, Protocol: proto}},
				SPIFFEID: model.SPIFFEID(td, k.Namespace, "sa"), Healthy: true})
		}
	}
	return model.New(1, "c1", "mesh", td, model.Node{Name: "n1"}, svcs, eps, pods)
}

func benchPods(b *testing.B, n int) []*model.LocalPod {
	var out []*model.LocalPod
	for i := 0; i < n; i++ {
		ns := testenv.NewNetns(b)
		out = append(out, &model.LocalPod{UID: fmt.Sprintf("pod%d", i), Namespace: "bench", Name: fmt.Sprintf("pod%d", i),
			ServiceAccount: fmt.Sprintf("sa%d", i), NetnsPath: ns.Path, Ready: true})
	}
	return out
}

// BenchmarkEnvoyMemory measures, with 10 local identities, Envoy's allocated memory after it
// applied a snapshot of N clusters, and the wall time and memory to add one more pod (a new
// identity: SetMesh until the pod's listeners are active, add-pod-ms; of which SetMesh alone,
// setmesh-ms, and SetMesh until Envoy's ACK, ack-ms, which is what the CNI ADD waits for), for
// each certificate-selection mechanism. On a loaded machine the mean swings with the load;
// add-pod-p50-ms is the median over the b.N additions.
//
//	go test ./bench/ -run '^$' -bench BenchmarkEnvoyMemory -benchtime 1x -timeout 30m
//
// AETHER_BENCH_SOTW=1 makes Envoy use the state-of-the-world ADS protocol instead of delta.
func BenchmarkEnvoyMemory(b *testing.B) {
	testenv.RequireRoot(b)
	for _, clusters := range []int{1000, 10000} {
		for _, mech := range []struct {
			name string
			sel  xds.CertSelection
		}{{"selector", xds.CertSelector}, {"matcher", xds.CertMatcher}} {
			b.Run(fmt.Sprintf("clusters=%d/%s", clusters, mech.name), func(b *testing.B) {
				pods := benchPods(b, 11)
				rig := startRig(b, xds.Options{CertSelection: mech.sel}, clusterMesh(clusters, pods[:10]))
				before := rig.allocatedBytes(b)
				var addTotal, setTotal, ackTotal time.Duration
				var adds []time.Duration
				for i := 0; i < b.N; i++ {
					m := clusterMesh(clusters, pods[:10])
					rig.set(b, m)
					rig.waitApplied(b, rig.srv.Version(), m)
					added := clusterMesh(clusters, pods)
					start := time.Now()
					v := rig.set(b, added)
					setTotal += time.Since(start)
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
					if err := rig.srv.WaitForAck(ctx, v); err != nil {
						b.Fatal(err)
					}
					cancel()
					ackTotal += time.Since(start)
					rig.waitApplied(b, v, added)
					addTotal += time.Since(start)
					adds = append(adds, time.Since(start))
				}
				after := rig.allocatedBytes(b)
				b.ReportMetric(before/1e6, "envoy-MB")
				b.ReportMetric(float64(addTotal.Milliseconds())/float64(b.N), "add-pod-ms")
				b.ReportMetric(float64(setTotal.Milliseconds())/float64(b.N), "setmesh-ms")
				slices.Sort(adds)
				b.ReportMetric(float64(adds[len(adds)/2].Milliseconds()), "add-pod-p50-ms")
				b.ReportMetric(float64(ackTotal.Milliseconds())/float64(b.N), "ack-ms")
				b.ReportMetric((after-before)/1e6, "add-pod-MB")
			})
		}
	}
}
