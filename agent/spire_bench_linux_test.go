//go:build linux

package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
)

// BenchmarkAddToFirstSVID measures a pod's CNI ADD through the real agent, from the pod's
// creation to the ADD's answer, which comes once the node's Envoy serves the pod's SVID (and its listeners): with the
// development CA (the agent signs at once) and with SPIRE (the SPIRE Controller Manager registers
// the new pod, the node's SPIRE agent fetches its entry and SVID at its next sync with the server,
// then pushes it to the agent's subscription). Each pod is created (scheduled to the node, with its
// own service account, so a new identity) right before its ADD, as a kubelet sees it. It reports
// the p50 and p99 of the ADDs, and the agent's Go heap in use per identity after b.N pods
// (heap-B/identity, from the agent's go_memstats_heap_inuse_bytes before and after). SPIRE runs
// with its defaults (spire/defaults: the agent syncs every 5 s, the server reloads its entry
// cache every 5 s) and tuned (spire/sync=500ms: the agent's sync_interval and the server's
// cache_reload_interval, with events_based_cache, at 500 ms and at 200 ms).
//
//	go test ./agent -run '^$' -bench BenchmarkAddToFirstSVID -benchtime 20x
func BenchmarkAddToFirstSVID(b *testing.B) {
	for _, c := range []struct {
		name  string
		spire bool
		sync  time.Duration // 0: SPIRE's defaults
	}{{"dev-ca", false, 0}, {"spire/defaults", true, 0}, {"spire/sync=500ms", true, 500 * time.Millisecond}, {"spire/sync=200ms", true, 200 * time.Millisecond}} {
		b.Run(c.name, func(b *testing.B) {
			testenv.RequireRoot(b)
			api, etcd, cs := startSources(b)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			createNodeAndMeshNamespace(b, ctx, cs)
			var opts agentOpts
			if c.spire {
				_, sa := startNodeSPIRE(b, api, testenv.SPIREOptions{Cluster: "a", AgentSyncInterval: c.sync}, map[string]any{
					"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "shop"}}})
				opts.spireAdmin = sa.Admin
			}
			a := startAgentWith(b, opts, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0])
			a.waitReady(b, 90*time.Second, "agent ready")
			cl := plugin.NewClient(a.cniSocket)
			heap0 := a.metric("go_memstats_heap_inuse_bytes")
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				name := "p" + strconv.Itoa(i)
				if _, err := cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				pod := createReadyPod(b, ctx, cs, name, name)
				_, req := podAttachment(b, pod, "ctr-"+name, netip.AddrFrom4([4]byte{10, 251, byte(i / 250), byte(1 + i%250)}))
				if _, err := cl.Add(ctx, req); err != nil {
					b.Fatalf("ADD %s: %v", name, err)
				}
				took = append(took, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[(len(took)*99)/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(0, "ns/op")
			heap1 := a.metric("go_memstats_heap_inuse_bytes")
			b.ReportMetric((heap1-heap0)/float64(b.N), "heap-B/identity")
			b.Logf("%s: %d ADDs (pod created, then ADD), sorted: %v", c.name, len(took), fmt.Sprint(took))
		})
	}
}
