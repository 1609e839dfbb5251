package registry

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
)

// BenchmarkPutToWatchEvent measures the latency from a write to its event at every watcher, with
// 1, 100 and 1000 watchers on one embedded etcd: "bare" is a raw etcd Put seen by raw clientv3
// watches on Root; "registry" is RegisterEndpoint (validate, marshal, leased put) seen by
// WatchEndpoints (decode, validate, typed event). Each iteration writes one new endpoint and
// waits until every watcher has seen it; p50 and p99 are over all watcher deliveries. All
// watchers share one client connection (one gRPC watch stream), as in one process.
//
//	go test -run '^$' -bench PutToWatchEvent -benchtime 200x ./registry/
func BenchmarkPutToWatchEvent(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		for _, mode := range []string{"bare", "registry"} {
			b.Run(fmt.Sprintf("watchers=%d/%s", n, mode), func(b *testing.B) { benchPutToWatch(b, n, mode) })
		}
	}
}

func benchPutToWatch(b *testing.B, watchers int, mode string) {
	etcd := testenv.StartEmbeddedEtcd(b, nil)
	r := newTestRegistry(b, etcd.Endpoints, "eu", "bench", func(c *Config) { c.LeaseTTL = time.Minute })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		mu      sync.Mutex
		sent    []time.Time
		lats    []time.Duration
		arrived = make(chan struct{}, watchers*4)
	)
	seen := func(key string) {
		i, err := strconv.Atoi(key[strings.LastIndexByte(key, '/')+2:])
		if err != nil {
			return
		}
		now := time.Now()
		mu.Lock()
		lats = append(lats, now.Sub(sent[i]))
		mu.Unlock()
		arrived <- struct{}{}
	}
	ready := make(chan struct{}, watchers)
	for range watchers {
		if mode == "bare" {
			wch := r.Client().Watch(ctx, Root, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			go func() {
				for resp := range wch {
					if resp.Created {
						ready <- struct{}{}
					}
					for _, ev := range resp.Events {
						seen(string(ev.Kv.Key))
					}
				}
			}()
		} else {
			ch := r.WatchEndpoints(ctx)
			go func() {
				for batch := range ch {
					if batch.Snapshot {
						ready <- struct{}{}
						continue
					}
					for _, ev := range batch.Events {
						seen(ev.Key)
					}
				}
			}()
		}
	}
	for range watchers {
		<-ready
	}
	// Let the last watches reach the server before the clock starts.
	time.Sleep(200 * time.Millisecond)
	lease, err := r.Client().Grant(ctx, 60)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		ep := testEndpoint("shop", "cart", "p"+strconv.Itoa(i), "10.0.0.1")
		mu.Lock()
		sent = append(sent, time.Now())
		mu.Unlock()
		if mode == "bare" {
			ep.ClusterName, ep.Region = "bench", "eu"
			v, _ := proto.Marshal(ep)
			if _, err := r.Client().Put(ctx, r.Origin().EndpointKey("shop", "cart", "p"+strconv.Itoa(i)), string(v), clientv3.WithLease(lease.ID)); err != nil {
				b.Fatal(err)
			}
		} else if err := r.RegisterEndpoint(ctx, ep); err != nil {
			b.Fatal(err)
		}
		for range watchers {
			<-arrived
		}
	}
	b.StopTimer()
	slices.Sort(lats)
	pct := func(p float64) float64 { return float64(lats[int(p*float64(len(lats)-1))].Microseconds()) }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkListEndpoints100k measures listing 100,000 endpoints (10 clusters x 10,000) from one
// embedded etcd: "registry" is ListEndpoints (paged range reads at one revision, decode, origin
// stamp, validate); "bare" is the same paged range read without decoding. B/op is the memory
// allocated per list; retained-MB the heap still held by the returned records.
//
//	go test -run '^$' -bench ListEndpoints100k -benchtime 5x -benchmem ./registry/
func BenchmarkListEndpoints100k(b *testing.B) {
	etcd := testenv.StartEmbeddedEtcd(b, func(c *embed.Config) { c.QuotaBackendBytes = 4 << 30 })
	r := newTestRegistry(b, etcd.Endpoints, "eu", "reader", nil)
	ctx := context.Background()
	const clusters, perCluster = 10, 10000
	for c := range clusters {
		o := Origin{Region: "eu", Cluster: fmt.Sprintf("c%d", c)}
		ops := make([]clientv3.Op, 0, maxTxnOps)
		for i := range perCluster {
			uid := fmt.Sprintf("pod-%06d", i)
			ep := testEndpoint("ns"+strconv.Itoa(i%50), "svc"+strconv.Itoa(i%500), uid, fmt.Sprintf("10.%d.%d.%d", c, i/256, i%256))
			ep.ClusterName, ep.Region = o.Cluster, o.Region
			v, _ := proto.Marshal(ep)
			ops = append(ops, clientv3.OpPut(o.EndpointKey(ep.Service.Namespace, ep.Service.Name, uid), string(v)))
			if len(ops) == maxTxnOps || i == perCluster-1 {
				if _, err := r.Client().Txn(ctx).Then(ops...).Commit(); err != nil {
					b.Fatal(err)
				}
				ops = ops[:0]
			}
		}
	}
	b.Run("registry", func(b *testing.B) {
		b.ReportAllocs()
		var recs []Record[*registryv1.ServiceEndpoint]
		for b.Loop() {
			var err error
			recs, _, err = r.ListEndpoints(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(recs) != clusters*perCluster {
				b.Fatalf("listed %d endpoints, want %d", len(recs), clusters*perCluster)
			}
		}
		b.StopTimer()
		b.ReportMetric(retainedMB(func() { recs = nil }), "retained-MB")
	})
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			if _, err := r.scan(ctx, func(string, []byte, int64) { n++ }); err != nil {
				b.Fatal(err)
			}
			if n != clusters*perCluster {
				b.Fatalf("scanned %d keys", n)
			}
		}
	})
}

// retainedMB returns how many MiB the heap shrinks by when release drops a result.
func retainedMB(release func()) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	release()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return float64(int64(before.HeapAlloc)-int64(after.HeapAlloc)) / (1 << 20)
}
