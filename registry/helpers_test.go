package registry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
)

// converge is the generous deadline for anything the tests wait on (several times the expected
// time, which is at most a lease TTL plus client reconnect backoff).
const converge = 45 * time.Second

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newTestRegistry returns a writer of region/cluster that claims its partition as cluster ID
// "cid-<region>-<cluster>" (so every test exercises the claim-guarded writes), after mod.
func newTestRegistry(t testing.TB, endpoints []string, region, cluster string, mod func(*Config)) *Registry {
	t.Helper()
	cfg := Config{Endpoints: endpoints, Region: region, Cluster: cluster, LeaseTTL: 2 * time.Second, Logger: testLogger(t),
		ClusterID: "cid-" + region + "-" + cluster, Claimer: true}
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%s/%s): %v", region, cluster, err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func testEndpoint(ns, svc, uid, ip string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service:   &registryv1.ServiceRef{Namespace: ns, Name: svc},
		Zone:      "zone-1",
		Addresses: []string{ip},
		Ports: []*registryv1.EndpointPort{
			{Name: "http", Port: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP},
			{Name: "db", Port: 5432, Protocol: registryv1.Protocol_PROTOCOL_TCP},
		},
		SpiffeId: "spiffe://aether.internal/ns/" + ns + "/sa/default",
		Health:   registryv1.Health_HEALTH_HEALTHY,
		Kubernetes: &registryv1.KubernetesMetadata{
			NodeName: "node-1", PodName: svc + "-" + uid, PodUid: uid, NodeIp: "192.0.2.10", ServiceAccount: "default",
		},
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// nextBatch returns the next batch of a watch, failing the test when ctx ends first.
func nextBatch[T proto.Message](t testing.TB, ctx context.Context, ch <-chan Batch[T]) Batch[T] {
	t.Helper()
	select {
	case b := <-ch:
		return b
	case <-ctx.Done():
		t.Fatal("no watch batch")
	}
	panic("unreachable")
}

// viewer consumes a watch into a view and keeps every batch.
type viewer[T proto.Message] struct {
	mu      sync.Mutex
	view    map[string]Record[T]
	batches []Batch[T]
	changed chan struct{}
}

func startViewer[T proto.Message](t testing.TB, ch <-chan Batch[T]) *viewer[T] {
	v := &viewer[T]{view: map[string]Record[T]{}, changed: make(chan struct{}, 1)}
	go func() {
		for b := range ch {
			v.mu.Lock()
			b.Apply(v.view)
			v.batches = append(v.batches, b)
			v.mu.Unlock()
			select {
			case v.changed <- struct{}{}:
			default:
			}
		}
	}()
	return v
}

// keys returns the view's keys, sorted.
func (v *viewer[T]) keys() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for _, r := range Snapshot(v.view) {
		out = append(out, r.Key)
	}
	return out
}

func (v *viewer[T]) get(key string) (Record[T], bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	r, ok := v.view[key]
	return r, ok
}

func (v *viewer[T]) allBatches() []Batch[T] {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]Batch[T](nil), v.batches...)
}

// waitKeys waits until the view holds exactly want (sorted).
func (v *viewer[T]) waitKeys(t testing.TB, want ...string) {
	t.Helper()
	testenv.Eventually(t, converge, "watch view", func() error {
		got := v.keys()
		if !slices.Equal(got, want) {
			return fmt.Errorf("view keys %q, want %q", got, want)
		}
		return nil
	})
}

func counterValue(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	c.Collect(ch)
	close(ch)
	var sum float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		sum += d.GetCounter().GetValue()
	}
	return sum
}

// startAuthEtcd starts an embedded etcd (the lowest bcrypt cost, 4, keeps password checks cheap
// under the race detector) and turns authentication on with root password "pw-root" and users,
// as `aether-registrar setup-registry-auth` does.
func startAuthEtcd(t *testing.T, users ...ClusterUser) *testenv.EmbeddedEtcd {
	t.Helper()
	etcd := testenv.StartEmbeddedEtcd(t, func(c *embed.Config) { c.BcryptCost = 4 })
	admin, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := SetupAuth(ctxT(t, converge), admin, "pw-root", users); err != nil {
		t.Fatal(err)
	}
	return etcd
}
