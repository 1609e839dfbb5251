package registry

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/internal/testenv"
)

// partitionState returns every key under o's prefix with its value and mod revision, to show
// that refused writes changed nothing.
func partitionState(t testing.TB, cli *clientv3.Client, o Origin) map[string]string {
	t.Helper()
	resp, err := cli.Get(ctxT(t, converge), o.Prefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = fmt.Sprintf("%d:%x", kv.ModRevision, kv.Value)
	}
	return out
}

func sameState(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Two clusters with one cluster name: the first registrar claims the partition with its
// cluster ID; a writer of another cluster ID (registrar or agent) is refused every write
// (export, unexport, endpoint, deregistration, config) with ErrPartitionClaimed, and nothing in
// the partition changes; the first cluster restarting keeps its claim; readers skip the claim
// key without counting it as bad.
func TestPartitionClaimRefusesAnotherCluster(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge)
	metrics := prometheus.NewRegistry()
	claimer := func(id string) func(*Config) {
		return func(c *Config) { c.ClusterID, c.Claimer, c.ClaimedBy, c.Metrics = id, true, "registrar "+id, metrics }
	}
	agent := func(id string) func(*Config) {
		return func(c *Config) { c.ClusterID, c.Claimer, c.Metrics = id, false, metrics }
	}
	a := newTestRegistry(t, etcd.Endpoints, "eu", "east", claimer("uid-a"))
	c, err := a.EnsureClaim(ctx)
	if err != nil || c.GetClusterId() != "uid-a" || c.GetClaimedBy() != "registrar uid-a" || c.GetClaimTime() == "" {
		t.Fatalf("first claim = %v, %v", c, err)
	}
	if err := a.Export(ctx, testExport()); err != nil {
		t.Fatal(err)
	}
	if err := a.PutConfig(ctx, testConfig()); err != nil {
		t.Fatal(err)
	}
	aAgent := newTestRegistry(t, etcd.Endpoints, "eu", "east", agent("uid-a"))
	if err := aAgent.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "pod-a", "10.0.0.1")); err != nil {
		t.Fatalf("agent of the claiming cluster: %v", err)
	}
	before := partitionState(t, a.Client(), a.Origin())

	b := newTestRegistry(t, etcd.Endpoints, "eu", "east", claimer("uid-b"))
	bAgent := newTestRegistry(t, etcd.Endpoints, "eu", "east", agent("uid-b"))
	_, err = b.EnsureClaim(ctx)
	var ce *ClaimConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrPartitionClaimed) {
		t.Fatalf("second cluster's claim: %v, want a ClaimConflictError", err)
	}
	for _, want := range []string{`eu/east`, `"uid-a"`, `"uid-b"`, "registrar uid-a"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("conflict error %q does not name %s", err, want)
		}
	}
	if got := gaugeValue(t, metrics, "aether_registry_partition_claim_conflict"); got != 1 {
		t.Errorf("aether_registry_partition_claim_conflict = %v, want 1", got)
	}
	for name, err := range map[string]error{
		"export":          b.Export(ctx, testExport()),
		"unexport":        b.Unexport(ctx, "shop", "cart"),
		"put config":      b.PutConfig(ctx, testConfig()),
		"delete config":   b.DeleteConfig(ctx, "shop", "cart"),
		"register":        bAgent.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "pod-b", "10.0.0.2")),
		"deregister":      bAgent.DeregisterEndpoint(ctx, "shop", "cart", "pod-a"),
		"agent's check":   func() error { _, err := bAgent.EnsureClaim(ctx); return err }(),
		"registrar again": func() error { _, err := b.EnsureClaim(ctx); return err }(),
	} {
		if !errors.Is(err, ErrPartitionClaimed) {
			t.Errorf("%s by the second cluster: %v, want ErrPartitionClaimed", name, err)
		}
	}
	if after := partitionState(t, a.Client(), a.Origin()); !sameState(before, after) {
		t.Fatalf("refused writes changed the partition:\nbefore %v\nafter  %v", before, after)
	}

	// The first cluster restarting (a new writer, the same cluster ID) keeps its claim as it was.
	a2 := newTestRegistry(t, etcd.Endpoints, "eu", "east", claimer("uid-a"))
	c2, err := a2.EnsureClaim(ctx)
	if err != nil || !proto.Equal(c, c2) {
		t.Fatalf("restart: claim %v, %v; want the first claim %v unchanged", c2, err, c)
	}
	if err := a2.Unexport(ctx, "shop", "cart"); err != nil {
		t.Fatalf("restarted registrar unexports: %v", err)
	}
	if got := gaugeValue(t, metrics, "aether_registry_partition_claim_conflict"); got != 0 {
		t.Errorf("aether_registry_partition_claim_conflict = %v after a good check, want 0", got)
	}

	// Readers skip the claim key silently.
	if eps, _, err := a.ListEndpoints(ctx); err != nil || len(eps) != 1 {
		t.Fatalf("ListEndpoints = %d, %v; want the one endpoint", len(eps), err)
	}
	if _, _, err := a.ListConfigs(ctx); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, a.m.badRecords); got != 0 {
		t.Errorf("aether_registry_bad_records_total = %v with a claim key in the store, want 0", got)
	}
}

// gaugeValue reads one gauge from a Prometheus registry.
func gaugeValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// Re-claim after a rebuild: it needs the cluster ID holding the claim (a wrong one changes
// nothing), replaces it atomically, records it as previous_cluster_id and is idempotent; the old
// cluster ID's writers are refused from then on, and an agent of the new cluster ID that was
// refused writes again without a restart.
func TestPartitionReclaim(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge)
	old := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID = "uid-old" })
	if _, err := old.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	if err := old.Export(ctx, testExport()); err != nil {
		t.Fatal(err)
	}
	agent := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID, c.Claimer = "uid-new", false })
	if err := agent.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "pod-1", "10.0.0.1")); !errors.Is(err, ErrPartitionClaimed) {
		t.Fatalf("agent of the rebuilt cluster before the re-claim: %v, want ErrPartitionClaimed", err)
	}

	rebuilt := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID, c.ClaimedBy = "uid-new", "reclaim-partition" })
	before := partitionState(t, old.Client(), old.Origin())
	if _, changed, err := rebuilt.Reclaim(ctx, "uid-typo"); !errors.Is(err, ErrPartitionClaimed) || changed ||
		!strings.Contains(err.Error(), `"uid-old"`) || !strings.Contains(err.Error(), `"uid-typo"`) {
		t.Fatalf("re-claim naming the wrong previous cluster ID: changed %v, %v", changed, err)
	}
	if after := partitionState(t, old.Client(), old.Origin()); !sameState(before, after) {
		t.Fatal("a refused re-claim changed the partition")
	}
	c, changed, err := rebuilt.Reclaim(ctx, "uid-old")
	if err != nil || !changed || c.GetClusterId() != "uid-new" || c.GetPreviousClusterId() != "uid-old" || c.GetClaimedBy() != "reclaim-partition" {
		t.Fatalf("re-claim: %v, changed %v, %v", c, changed, err)
	}
	again, changed, err := rebuilt.Reclaim(ctx, "uid-old")
	if err != nil || changed || !proto.Equal(again, c) {
		t.Fatalf("second re-claim: %v, changed %v, %v; want the claim unchanged", again, changed, err)
	}
	// The old cluster's writer had verified the claim before; its next write is refused.
	if err := old.Unexport(ctx, "shop", "cart"); !errors.Is(err, ErrPartitionClaimed) {
		t.Fatalf("old cluster's write after the re-claim: %v, want ErrPartitionClaimed", err)
	}
	if err := agent.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "pod-1", "10.0.0.1")); err != nil {
		t.Fatalf("agent of the rebuilt cluster after the re-claim: %v", err)
	}
	// A registrar of the rebuilt cluster restarting keeps the new claim.
	if c2, err := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID = "uid-new" }).EnsureClaim(ctx); err != nil || !proto.Equal(c2, c) {
		t.Fatalf("registrar of the rebuilt cluster: %v, %v", c2, err)
	}
	// Re-claiming a partition nobody claimed just claims it.
	fresh := newTestRegistry(t, etcd.Endpoints, "eu", "west", nil)
	if c, changed, err := fresh.Reclaim(ctx, "anything"); err != nil || !changed || c.GetPreviousClusterId() != "" {
		t.Fatalf("re-claim of an unclaimed partition: %v, changed %v, %v", c, changed, err)
	}
}

// Of several clusters claiming one fresh partition at once, exactly one wins (one etcd
// transaction: create if absent, else read) and every other is refused.
func TestPartitionClaimRace(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		r := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID = fmt.Sprintf("uid-%d", i) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.EnsureClaim(ctx)
		}()
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrPartitionClaimed):
			t.Errorf("claimer %d: %v", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d claimers won, want exactly 1", won)
	}
}

// A stored claim that is not a PartitionClaim refuses writes with an error naming its key and
// how to clear it; deleted, the registrar claims the partition again.
func TestPartitionClaimUnreadable(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge)
	r := newTestRegistry(t, etcd.Endpoints, "eu", "east", nil)
	key := r.Origin().ClaimKey()
	if _, err := r.Client().Put(ctx, key, "\xff\xff"); err != nil {
		t.Fatal(err)
	}
	if err := r.Export(ctx, testExport()); !errors.Is(err, ErrClaimUnreadable) || !strings.Contains(err.Error(), "etcdctl del "+key) {
		t.Fatalf("write with an unreadable claim: %v, want ErrClaimUnreadable naming %s", err, key)
	}
	if _, err := r.Client().Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := r.Export(ctx, testExport()); err != nil {
		t.Fatalf("write after the bad claim was deleted: %v", err)
	}
	if c, err := r.EnsureClaim(ctx); err != nil || c.GetClusterId() != "cid-eu-east" {
		t.Fatalf("claim = %v, %v", c, err)
	}
}

// A bad cluster ID is refused when the writer is created, naming the field and value.
func TestClusterIDValidated(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Region: "eu", Cluster: "east", ClusterID: "a b"}, `ClusterID: invalid value "a b"`},
		{Config{Region: "eu", Cluster: "east", ClusterID: strings.Repeat("x", 129)}, "ClusterID: invalid value"},
		{Config{Region: "eu", Cluster: "east", Claimer: true}, "ClusterID: required with Claimer"},
	} {
		if _, err := NewWithClient(nil, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewWithClient(%+v) = %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
}

// With etcd auth on, a cluster's own user (SetupAuth) claims, re-claims and writes its
// partition: the claim key is inside its prefix.
func TestPartitionClaimWithClusterUser(t *testing.T) {
	east := Origin{"eu", "east"}
	etcd := startAuthEtcd(t, ClusterUser{Origin: east, Password: "pw-east"})
	ctx := ctxT(t, converge)
	user := func(id string) func(*Config) {
		return func(c *Config) { c.ClusterID, c.Username, c.Password = id, UserName(east), "pw-east" }
	}
	a := newTestRegistry(t, etcd.Endpoints, "eu", "east", user("uid-a"))
	if _, err := a.EnsureClaim(ctx); err != nil {
		t.Fatalf("claim as the cluster's user: %v", err)
	}
	if err := a.Export(ctx, testExport()); err != nil {
		t.Fatalf("export as the cluster's user: %v", err)
	}
	if err := a.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "pod-1", "10.0.0.1")); err != nil {
		t.Fatalf("endpoint as the cluster's user: %v", err)
	}
	b := newTestRegistry(t, etcd.Endpoints, "eu", "east", user("uid-b"))
	if err := b.Export(ctx, testExport()); !errors.Is(err, ErrPartitionClaimed) {
		t.Fatalf("other cluster ID with the same user: %v, want ErrPartitionClaimed", err)
	}
	if _, _, err := b.Reclaim(ctx, "uid-a"); err != nil {
		t.Fatalf("re-claim as the cluster's user: %v", err)
	}
}

// An agent whose endpoint lease was lost (it expired while the node was cut off from the
// registry) and whose partition was claimed by another cluster meanwhile cannot re-register:
// withdrawing its endpoints (RevokeEndpoints) must still succeed, since the lost lease took
// them with it, and stop the re-registration. Before, the revoke of the lost lease failed with
// "requested lease not found" on every claim check, the endpoints were never forgotten, and the
// lease keeper granted and revoked a lease every few seconds for as long as the conflict lasted.
func TestRevokeEndpointsAfterLostLeaseInClaimedPartition(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge)
	a := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID, c.Claimer = "uid-a", false })
	if err := a.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "pod-a", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	b := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID, c.Claimer = "uid-b", true })
	if _, err := b.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	lost, _ := a.Lease()
	if _, err := a.Client().Revoke(ctx, lost); err != nil { // the lease expires
		t.Fatal(err)
	}
	// The keeper notices and fails to re-register into the claimed partition.
	testenv.Eventually(t, converge, "lease keeper notices the lost lease", func() error {
		if got := counterValue(t, a.m.leaseLost); got < 1 {
			return fmt.Errorf("aether_registry_lease_lost_total = %v", got)
		}
		return nil
	})
	if _, err := a.EnsureClaim(ctx); !errors.Is(err, ErrPartitionClaimed) {
		t.Fatalf("claim check: %v, want ErrPartitionClaimed", err)
	}
	if err := a.RevokeEndpoints(ctx); err != nil {
		t.Fatalf("withdraw after the lease was lost: %v, want nil (the endpoints are gone with the lease)", err)
	}
	if id, _ := a.Lease(); id != 0 {
		t.Fatalf("lease after withdrawing = %x, want 0 (nothing kept)", int64(id))
	}
	a.wmu.Lock()
	n := len(a.desired)
	a.wmu.Unlock()
	if n != 0 {
		t.Fatalf("%d endpoints still kept for re-registration after withdrawing, want 0", n)
	}
	if resp, err := a.Client().Get(ctx, a.Origin().Prefix()+string(KindEndpoint), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("endpoints in the partition = %v, %v; want none", resp, err)
	}
}

// Two claim checks of one writer overlap (the agent's periodic check and a write's re-check):
// the one that read the claim earlier must not overwrite what the later one found. Here the
// first check reads this cluster's claim, another cluster re-claims the partition, a second
// check finds the conflict, and only then does the first check finish. Before, the first check
// reported the partition as this cluster's (nil error, so the agent's readiness passed),
// logged "claim is this cluster's again" and set aether_registry_partition_claim_conflict to 0
// while another cluster held the claim.
func TestPartitionClaimStaleCheckDoesNotWin(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge)
	metrics := prometheus.NewRegistry()
	a := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID, c.Claimer = "uid-a", true })
	if _, err := a.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	agent := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID, c.Claimer, c.Metrics = "uid-a", false, metrics })
	b := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID, c.Claimer = "uid-b", true })
	calls := 0 // EnsureClaim runs on this goroutine only
	agent.afterClaimRead = func() {
		if calls++; calls != 1 {
			return
		}
		if _, _, err := b.Reclaim(ctx, "uid-a"); err != nil {
			t.Error(err)
		}
		if _, err := agent.EnsureClaim(ctx); !errors.Is(err, ErrPartitionClaimed) {
			t.Errorf("second check: %v, want ErrPartitionClaimed", err)
		}
	}
	if _, err := agent.EnsureClaim(ctx); !errors.Is(err, ErrPartitionClaimed) {
		t.Errorf("first check, finishing last: %v, want ErrPartitionClaimed (another cluster holds the claim)", err)
	}
	if got := gaugeValue(t, metrics, "aether_registry_partition_claim_conflict"); got != 1 {
		t.Errorf("aether_registry_partition_claim_conflict = %v, want 1", got)
	}
}
