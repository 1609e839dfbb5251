package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// BenchmarkEndpointPutToEnvoy measures the time from a registry endpoint put (by another cluster)
// to the endpoint being present in the node's Envoy (admin API: the cluster's host count), with 100 and
// 10k other endpoints in the model. It reports p50 and p99 in milliseconds.
//
//	go test ./agent/ -run '^$' -bench EndpointPutToEnvoy -benchtime 100x
func BenchmarkEndpointPutToEnvoy(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) { benchPutToEnvoy(b, n) })
	}
}

func benchPutToEnvoy(b *testing.B, endpoints int) {
	api, etcd, cs := startSources(b)
	mcs := mcsclient.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop",
		Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	remote, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: "b", LeaseTTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer remote.Close()
	// 100 exported services share the background endpoints; "probe" gets the measured ones.
	services := 100
	names := []string{"probe"}
	for i := 0; i < services; i++ {
		names = append(names, fmt.Sprintf("svc-%d", i))
	}
	for i, name := range names {
		if err := remote.Export(ctx, &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: "shop", Name: name},
			Ports:      []*registryv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
			CreateTime: time.Now().UTC().Format(time.RFC3339Nano)}); err != nil {
			b.Fatal(err)
		}
		if _, err := mcs.MulticlusterV1beta1().ServiceImports("shop").Create(ctx, &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{fmt.Sprintf("10.97.%d.%d", i/250, i%250+1)},
				Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	ep := func(svc, uid, ip string) *registryv1.ServiceEndpoint {
		return &registryv1.ServiceEndpoint{Service: &registryv1.ServiceRef{Namespace: "shop", Name: svc}, Addresses: []string{ip},
			Ports:    []*registryv1.EndpointPort{{Name: "http", Port: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
			SpiffeId: "spiffe://aether.internal/ns/shop/sa/" + svc, Health: registryv1.Health_HEALTH_HEALTHY,
			Kubernetes: &registryv1.KubernetesMetadata{NodeName: "b-node", PodName: uid, PodUid: uid, NodeIp: "172.30.1.11"}}
	}
	for i := 0; i < endpoints; i++ {
		if err := remote.RegisterEndpoint(ctx, ep(names[1+i%services], fmt.Sprintf("bg-%d", i), fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256))); err != nil {
			b.Fatal(err)
		}
	}
	a := startAgent(b, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0], "--log-level", "warn")
	testenv.Eventually(b, 5*time.Minute, "agent ready with every background endpoint", func() error {
		if code, body := a.get("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		if !strings.Contains(a.envoy("/clusters"), fmt.Sprintf("svc-%d.shop.mesh:80::", services-1)) {
			return fmt.Errorf("background clusters not in Envoy yet")
		}
		return nil
	})
	// Presence is read from the probe cluster's host count (the stat membership_total), polled
	// every 2 ms: the stat filter costs Envoy little at any size, unlike an EDS config dump, and
	// it counts the hosts Envoy load-balances over, not only the resource it received. An anchor
	// endpoint keeps the cluster non-empty (Envoy 1.40 leaves the membership stats unchanged when
	// a cluster's last host goes), so each put moves the count from 1 to 2 and its removal back.
	if err := remote.RegisterEndpoint(ctx, ep("probe", "probe-anchor", "10.251.0.1")); err != nil {
		b.Fatal(err)
	}
	hosts := func() int {
		body := a.envoy(`/stats?filter=^cluster\.probe\.shop\.mesh_80\.membership_total$`)
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(body), "cluster.probe.shop.mesh_80.membership_total:")))
		if err != nil {
			return -1
		}
		return n
	}
	waitHosts := func(want int, since time.Time, limit time.Duration) {
		for hosts() != want {
			if time.Since(since) > limit {
				b.Fatalf("probe cluster hosts = %d after %v, want %d: %s", hosts(), limit, want, a.envoy("/stats?filter=probe"))
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	waitHosts(1, time.Now(), time.Minute)
	lat := make([]time.Duration, 0, b.N)
	// AETHER_BENCH_PPROF=<file>: a 5 s CPU profile of the agent while the puts run.
	if out := os.Getenv("AETHER_BENCH_PPROF"); out != "" {
		go func() {
			_, prof := a.debug("/debug/pprof/profile?seconds=5")
			if err := os.WriteFile(fmt.Sprintf("%s.%d", out, endpoints), []byte(prof), 0o644); err != nil {
				b.Error(err)
			}
		}()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ip := fmt.Sprintf("10.250.%d.%d", i/250, i%250+1)
		uid := fmt.Sprintf("probe-%d", i)
		start := time.Now()
		if err := remote.RegisterEndpoint(ctx, ep("probe", uid, ip)); err != nil {
			b.Fatal(err)
		}
		waitHosts(2, start, time.Minute)
		lat = append(lat, time.Since(start))
		b.StopTimer()
		if err := remote.DeregisterEndpoint(ctx, "shop", "probe", uid); err != nil {
			b.Fatal(err)
		}
		waitHosts(1, time.Now(), time.Minute)
		// Measure isolated puts: let the coalescer's quiet period (50 ms) pass, as between
		// unrelated changes in a cluster (back-to-back changes are coalesced on purpose).
		time.Sleep(100 * time.Millisecond)
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
