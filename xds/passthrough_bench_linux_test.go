package xds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// BenchmarkPassthroughLatency measures what a passthrough connection (a meshed pod's connection to
// a host outside the mesh) costs, before and after the passthrough moved into the pod's netns, in
// one run: two meshes side by side, one building the old passthrough (one cluster bound in the
// node's netns, passthroughFromNode) and one the new (a cluster per pod, its sockets opened in
// the pod's netns with the bypass mark), and a direct path from a pod outside the mesh as the
// floor. Each sample is a new connection: connect, a 1 KB echo, close, at 300 connections per
// second over the three paths interleaved (paceInterleaved). It prints p50/p90/p99/p99.9 per
// path and the added values against the direct path; AETHER_BENCH_SAMPLES sets the samples per
// path (default 3000), AETHER_BENCH_ENVOY_CPUS / AETHER_BENCH_LOAD_CPUS pin both Envoys and this
// process. bench/latency.sh passthrough runs it.
func BenchmarkPassthroughLatency(b *testing.B) {
	testenv.RequireRoot(b)
	samples := testenv.BenchEnv(b, "AETHER_BENCH_SAMPLES", 3000)
	before := startTrafficFixture(b, time.Hour, false, Options{passthroughFromNode: true})
	after := startTrafficFixture(b, time.Hour, false, Options{})
	pin := pinBench(b, before.sup.PID(), after.sup.PID())
	direct, _ := after.addPod("direct", false)
	body := bytes.Repeat([]byte("x"), 1024)
	path := func(name string, ns *testenv.Netns, f *meshFixture) pacePath {
		addr := f.ips["outside"].String() + ":7000"
		buf := make([]byte, len(body))
		return pacePath{name, func() error { return dialEcho(ns, addr, body, buf) }}
	}
	paths := []pacePath{
		path("direct", direct, after),
		path("before", before.pods["alpha"], before),
		path("after", after.pods["alpha"], after),
	}
	fmt.Printf("BenchmarkPassthroughLatency: %d new connections per path at 300/s, %s, loadavg %s\n", samples, pin, loadavg())
	if _, err := paceInterleaved(300, 300, 10, paths); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	r, err := paceInterleaved(300, samples, 10, paths)
	if err != nil {
		b.Fatal(err)
	}
	reportPaced(b, "passthrough-", paths, r)
}

// BenchmarkPassthroughClusterCost measures what the per-pod passthrough clusters cost against the
// one shared cluster they replaced, at a node's default pod limit (110, the kubelet's maxPods):
// the CDS bytes of the built resources (proto size of every cluster) and Envoy's allocated memory
// (/memory "allocated") once it applied the snapshot, for each way, one Envoy after the other in
// one run. AETHER_BENCH_PODS sets the pod count.
//
//	go test ./xds/ -run '^$' -bench BenchmarkPassthroughClusterCost -benchtime 1x
func BenchmarkPassthroughClusterCost(b *testing.B) {
	testenv.RequireRoot(b)
	n := testenv.BenchEnv(b, "AETHER_BENCH_PODS", 110)
	for _, c := range []struct {
		name string
		opts Options
	}{{"shared-node-netns", Options{passthroughFromNode: true}}, {"per-pod-netns", Options{}}} {
		b.Run(c.name, func(b *testing.B) {
			f := newMeshFixture(b, time.Hour, true, c.opts)
			var pods []*model.LocalPod
			for i := 0; i < n; i++ {
				ns := testenv.NewNetns(b)
				pods = append(pods, &model.LocalPod{UID: fmt.Sprintf("uid-%d", i), Namespace: "bench", Name: fmt.Sprintf("pod-%d", i),
					ServiceAccount: fmt.Sprintf("sa-%d", i), NetnsPath: ns.Path,
					IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 45, byte(i >> 8), byte(i)})}, Ready: true})
			}
			m := model.New(1, "c1", "mesh", f.td, model.Node{Name: "node-1", IP: netip.MustParseAddr("10.44.0.1")}, nil, nil, pods)
			idle := envoyAllocated(b, f)
			f.set(m)
			withPods := envoyAllocated(b, f)
			var ids []string
			for _, p := range pods {
				ids = append(ids, p.SPIFFEID(f.td))
			}
			list, _, err := f.rot.SVIDs(context.Background(), ids)
			if err != nil {
				b.Fatal(err)
			}
			svids := map[string]*identity.SVID{}
			for i, id := range ids {
				svids[id] = list[i]
			}
			r, err := Build(m, svids, nil, c.opts)
			if err != nil {
				b.Fatal(err)
			}
			cds := 0
			for _, cl := range r.Clusters {
				cds += proto.Size(cl)
			}
			fmt.Printf("%s, %d pods: %d clusters, CDS %d bytes; Envoy allocated %.1f MB idle, %.1f MB with the pods (+%.1f MB)\n",
				c.name, n, len(r.Clusters), cds, idle/1e6, withPods/1e6, (withPods-idle)/1e6)
			b.ReportMetric(float64(cds), "cds-bytes")
			b.ReportMetric(float64(len(r.Clusters)), "clusters")
			b.ReportMetric((withPods-idle)/1e6, "envoy-pods-MB")
		})
	}
}

// envoyAllocated reads the fixture Envoy's /memory "allocated" in bytes.
func envoyAllocated(b *testing.B, f *meshFixture) float64 {
	b.Helper()
	s, err := f.admin("/memory")
	if err != nil {
		b.Fatal(err)
	}
	var mem struct {
		Allocated string `json:"allocated"`
	}
	if err := json.Unmarshal([]byte(s), &mem); err != nil {
		b.Fatalf("/memory: %v: %s", err, s)
	}
	v, err := strconv.ParseFloat(mem.Allocated, 64)
	if err != nil {
		b.Fatalf("/memory allocated %q: %v", mem.Allocated, err)
	}
	return v
}
