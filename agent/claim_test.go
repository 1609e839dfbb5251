package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/internal/clusterid"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// TestAgentRespectsPartitionClaim: an agent's endpoint registration (the agent's own
// endpointRegistrar and claim watch, its cluster ID read from a real kube-apiserver) against a
// real etcd whose partition of the agent's cluster name is claimed by another cluster: nothing
// is written and readiness part partition-claim fails naming the claim and the fix. After the
// partition is re-claimed for the agent's cluster the endpoint is registered and the part
// passes, without a restart; when another cluster takes the partition back, the node's
// endpoints are withdrawn. The claim's safety re-read is an hour away: every change is seen
// through the claim watch.
func TestAgentRespectsPartitionClaim(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id, err := clusterid.Get(ctx, kubernetes.NewForConfigOrDie(api.Config))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func(clusterID string, claimer bool) *registry.Registry {
		return openEast(t, etcd.Endpoints, log, clusterID, claimer)
	}
	other := open("uid-other", true)
	if _, err := other.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	east := other.Origin()
	keys := func() ([]string, error) {
		resp, err := other.Client().Get(ctx, east.Prefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		var out []string
		for _, kv := range resp.Kvs {
			out = append(out, string(kv.Key))
		}
		return out, nil
	}
	epKey := east.EndpointKey("shop", "web", "u1")
	wantKeys := func(want ...string) func() error {
		return func() error {
			got, err := keys()
			if err != nil {
				return err
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("partition keys %v, want %v", got, want)
			}
			return nil
		}
	}

	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	m := model.New(1, "east", "", "", model.Node{Name: "n1"},
		[]*model.Service{{Key: web, Local: true, Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP}}}}, nil,
		[]*model.LocalPod{{UID: "u1", Namespace: "shop", Name: "web-1", Ready: true, Protocol: model.ProtocolHTTP,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Services: []model.ServiceKey{web}}})
	agentReg := open(id, false)
	e := newEndpointRegistrar(agentReg, log)
	ready := newReadiness(partitionClaimPart)
	go watchClaim(ctx, agentReg, e, ready, time.Hour) // no safety re-read: only the watch sees changes

	if err := e.sync(ctx, m); !errors.Is(err, registry.ErrPartitionClaimed) {
		t.Fatalf("sync into another cluster's partition: %v, want ErrPartitionClaimed", err)
	}
	testenv.Eventually(t, 30*time.Second, "readiness names the claim", func() error {
		err := ready.state()
		if err == nil || !strings.Contains(err.Error(), `"uid-other"`) || !strings.Contains(err.Error(), id) ||
			!strings.Contains(err.Error(), "reclaim-partition") || !strings.Contains(err.Error(), partitionClaimPart) {
			return fmt.Errorf("readiness %v", err)
		}
		return nil
	})
	if err := wantKeys(east.ClaimKey())(); err != nil {
		t.Fatalf("refused agent: %v", err)
	}

	// Re-claimed for the agent's cluster: the next sync registers, readiness passes.
	if _, _, err := open(id, true).Reclaim(ctx, "uid-other"); err != nil {
		t.Fatal(err)
	}
	if err := e.sync(ctx, m); err != nil {
		t.Fatalf("sync after the re-claim: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "ready after the re-claim", ready.state)
	if err := wantKeys(east.ClaimKey(), epKey)(); err != nil {
		t.Fatal(err)
	}

	// Another cluster takes the partition (back): the agent withdraws its endpoints.
	if _, _, err := other.Reclaim(ctx, id); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "endpoint withdrawn", wantKeys(east.ClaimKey()))
	if err := ready.state(); err == nil {
		t.Fatal("ready while another cluster holds the partition")
	}
}

// TestAgentUnreadableClaimNotReady: a claim that is not a PartitionClaim (written by hand, by
// an old tool) refuses every write of the agent as a conflicting one does, so readiness part
// partition-claim must fail too, naming the key, and pass again once the key is deleted.
// Before, the part kept its last state: an agent that had been ready stayed ready while it
// registered nothing. Both changes are seen through the claim watch (no safety re-read within
// the test).
func TestAgentUnreadableClaimNotReady(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: "east", LeaseTTL: 5 * time.Second,
		Logger: log, ClusterID: "uid-east"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ready := newReadiness(partitionClaimPart)
	go watchClaim(ctx, reg, newEndpointRegistrar(reg, log), ready, time.Hour)
	testenv.Eventually(t, 30*time.Second, "ready with no claim", ready.state)

	key := reg.Origin().ClaimKey()
	if _, err := reg.Client().Put(ctx, key, "not a claim"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "not ready with an unreadable claim", func() error {
		if err := ready.state(); err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), partitionClaimPart) {
			return fmt.Errorf("readiness %v, want %s failing naming %s", err, partitionClaimPart, key)
		}
		return nil
	})
	if _, err := reg.Client().Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "ready after the claim key is deleted", ready.state)
}

// rangeCounter counts the unary etcd requests a client sends, by gRPC method: a counting
// wrapper at the client's boundary.
type rangeCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *rangeCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.n[method]++
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *rangeCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// TestAgentClaimWatchIdleReads counts the etcd requests one agent's claim watch (watchClaim with
// the agent's own safety interval, claimSafetyInterval) sends while nothing changes, through a
// counting interceptor on its etcd client: after the first read it sends no range request (and
// no other unary request); the claim is followed by one etcd watch. The idle time is
// AETHER_CLAIM_IDLE (default 10s). Before, the agent read the claim every 5 s: 2 range
// requests per agent in 10 s, 200 a second for 1000 nodes.
func TestAgentClaimWatchIdleReads(t *testing.T) {
	idle := idleFromEnv(t, "AETHER_CLAIM_IDLE")
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), idle+2*time.Minute)
	defer cancel()
	cli, counter := countingClient(t, etcd.Endpoints)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := registry.NewWithClient(cli, registry.Config{Region: "eu", Cluster: "east", Logger: log, ClusterID: "uid-east"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ready := newReadiness(partitionClaimPart)
	go watchClaim(ctx, reg, newEndpointRegistrar(reg, log), ready, claimSafetyInterval)
	testenv.Eventually(t, 30*time.Second, "ready after the first claim read", ready.state)
	start := counter.snapshot()
	time.Sleep(idle)
	end := counter.snapshot()
	ranges := end[rangeMethod] - start[rangeMethod]
	unary := 0
	for m, n := range end {
		unary += n - start[m]
	}
	t.Logf("claim watch of one idle agent over %s: %d etcd range requests, %d unary requests in all (first read: %d range requests); the 5 s poll sent %d",
		idle, ranges, unary, start[rangeMethod], int(idle/(5*time.Second)))
	if ranges != 0 || unary != 0 {
		t.Fatalf("idle claim watch sent %d range and %d unary requests in %s, want 0 (%v)", ranges, unary, idle, end)
	}
	if err := ready.state(); err != nil {
		t.Fatalf("not ready after %s idle: %v", idle, err)
	}
}

// rangeMethod is the gRPC method of an etcd range request (a Get).
const rangeMethod = "/etcdserverpb.KV/Range"

// countingClient returns an etcd client of endpoints whose unary requests the returned counter
// counts; it is closed when the test ends.
func countingClient(t *testing.T, endpoints []string) (*clientv3.Client, *rangeCounter) {
	t.Helper()
	counter := &rangeCounter{n: map[string]int{}}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(counter.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, counter
}

// idleFromEnv returns the idle time of a request-counting test: the duration in environment
// variable name, 10 s when it is unset.
func idleFromEnv(t *testing.T, name string) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return 10 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s %q: want a positive duration (%v)", name, v, err)
	}
	return d
}

// TestAgentReregistersAfterReclaim runs the agent's claim watch and endpoint sync loop
// (watchClaim, syncEndpointsLoop) as Run wires them, with one model and nothing else changing,
// against a real etcd: the node's endpoint is registered; another cluster takes the partition
// and the endpoint is withdrawn; once the partition is re-claimed for this cluster the endpoint
// is registered again without a new model. Before, the withdrawal cleared what the sync loop
// had registered but left the loop idle (its last sync had succeeded), so readiness passed
// again while the node's endpoints stayed out of the registry until the next model change.
func TestAgentReregistersAfterReclaim(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func(clusterID string, claimer bool) *registry.Registry {
		return openEast(t, etcd.Endpoints, log, clusterID, claimer)
	}
	registrar := open("uid-east", true)
	if _, err := registrar.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	east := registrar.Origin()
	epKey := east.EndpointKey("shop", "web", "u1")
	registered := func(want bool) func() error {
		return func() error {
			resp, err := registrar.Client().Get(ctx, epKey, clientv3.WithKeysOnly())
			if err != nil {
				return err
			}
			if got := len(resp.Kvs) == 1; got != want {
				return fmt.Errorf("endpoint %s registered: %v, want %v", epKey, got, want)
			}
			return nil
		}
	}

	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	m := model.New(1, "east", "", "", model.Node{Name: "n1"},
		[]*model.Service{{Key: web, Local: true, Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP}}}}, nil,
		[]*model.LocalPod{{UID: "u1", Namespace: "shop", Name: "web-1", Ready: true, Protocol: model.ProtocolHTTP,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Services: []model.ServiceKey{web}}})
	agentReg := open("uid-east", false)
	e := newEndpointRegistrar(agentReg, log)
	ready := newReadiness(partitionClaimPart)
	go watchClaim(ctx, agentReg, e, ready, time.Hour) // no safety re-read: only the watch sees changes
	latest := make(chan *model.Mesh, 1)
	go syncEndpointsLoop(ctx, e, latest, log)
	latest <- m
	testenv.Eventually(t, 30*time.Second, "endpoint registered", registered(true))
	testenv.Eventually(t, 30*time.Second, "ready", ready.state)

	other := open("uid-other", true)
	if _, _, err := other.Reclaim(ctx, "uid-east"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "endpoint withdrawn from the partition another cluster holds", registered(false))

	if _, _, err := registrar.Reclaim(ctx, "uid-other"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "ready after the re-claim", ready.state)
	testenv.Eventually(t, 30*time.Second, "endpoint registered again after the re-claim, with no new model", registered(true))
}

// openEast opens a registry client of partition eu/east on endpoints with clusterID (a claimer
// when claimer is set, as the registrar is), closed when the test ends.
func openEast(t *testing.T, endpoints []string, log *slog.Logger, clusterID string, claimer bool) *registry.Registry {
	t.Helper()
	r, err := registry.New(registry.Config{Endpoints: endpoints, Region: "eu", Cluster: "east", LeaseTTL: 5 * time.Second,
		Logger: log, ClusterID: clusterID, Claimer: claimer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestAgentClaimConflictSyncWaits runs the claim watch and the endpoint sync loop as Run wires
// them, with an etcd client that counts its unary requests, against a partition another cluster
// holds: once the refusal is known the agent sends the registry nothing for the idle time
// (AETHER_CLAIM_IDLE, default 10s), and once the partition is re-claimed for its cluster it
// registers its endpoint with no new model. Before, the sync loop retried the refused sync every
// 2 s, each retry a write the registry refused and a warning in the log.
func TestAgentClaimConflictSyncWaits(t *testing.T) {
	idle := idleFromEnv(t, "AETHER_CLAIM_IDLE")
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), idle+2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	other := openEast(t, etcd.Endpoints, log, "uid-other", true)
	if _, err := other.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	cli, counter := countingClient(t, etcd.Endpoints)
	agentReg, err := registry.NewWithClient(cli, registry.Config{Region: "eu", Cluster: "east", LeaseTTL: 5 * time.Second,
		Logger: log, ClusterID: "uid-east"})
	if err != nil {
		t.Fatal(err)
	}
	defer agentReg.Close()
	epKey := agentReg.Origin().EndpointKey("shop", "web", "u1")

	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	m := model.New(1, "east", "", "", model.Node{Name: "n1"},
		[]*model.Service{{Key: web, Local: true, Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP}}}}, nil,
		[]*model.LocalPod{{UID: "u1", Namespace: "shop", Name: "web-1", Ready: true, Protocol: model.ProtocolHTTP,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Services: []model.ServiceKey{web}}})
	e := newEndpointRegistrar(agentReg, log)
	ready := newReadiness(partitionClaimPart)
	go watchClaim(ctx, agentReg, e, ready, time.Hour) // no safety re-read within the test
	latest := make(chan *model.Mesh, 1)
	// The sync loop's log tells when its sync of m was refused.
	var syncLog testenv.Buffer
	go syncEndpointsLoop(ctx, e, latest, slog.New(slog.NewTextHandler(&syncLog, nil)))
	latest <- m
	testenv.Eventually(t, 30*time.Second, "readiness names the claim", func() error {
		if err := ready.state(); err == nil || !strings.Contains(err.Error(), `"uid-other"`) {
			return fmt.Errorf("readiness %v", err)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "the sync refused", func() error {
		if !strings.Contains(syncLog.String(), "waits for the partition claim") {
			return fmt.Errorf("sync loop log %q", syncLog.String())
		}
		return nil
	})
	start := counter.snapshot()
	time.Sleep(idle)
	end := counter.snapshot()
	unary := 0
	for method, n := range end {
		unary += n - start[method]
	}
	t.Logf("agent during a claim conflict over %s: %d unary etcd requests (%v before the idle time); the 2 s retry sent about %d writes",
		idle, unary, start, int(idle/(2*time.Second)))
	if unary != 0 {
		t.Fatalf("agent sent %d unary requests in %s of a claim conflict, want 0 (%v -> %v)", unary, idle, start, end)
	}

	if _, _, err := openEast(t, etcd.Endpoints, log, "uid-east", true).Reclaim(ctx, "uid-other"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "endpoint registered after the re-claim, with no new model", func() error {
		resp, err := other.Client().Get(ctx, epKey, clientv3.WithKeysOnly())
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 {
			return fmt.Errorf("endpoint %s not registered", epKey)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "ready after the re-claim", ready.state)
}
