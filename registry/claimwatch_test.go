package registry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// startClaimWatch runs r.WatchClaim with a safety re-read an hour away (so only the watch can
// see a change within a test) until the test ends.
func startClaimWatch(t *testing.T, r *Registry) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.WatchClaim(ctx, time.Hour) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchClaim: %v", err)
		}
	})
}

// waitClaimStatus waits until r's recorded claim state matches want (nil, or an error it must
// match with errors.Is) and, for a conflict, names the claiming cluster ID.
func waitClaimStatus(t *testing.T, r *Registry, what string, want error, claimID string) {
	t.Helper()
	testenv.Eventually(t, converge, what, func() error {
		_, err := r.ClaimStatus()
		switch {
		case want == nil && err != nil:
			return fmt.Errorf("claim status %v, want nil", err)
		case want != nil && !errors.Is(err, want):
			return fmt.Errorf("claim status %v, want %v", err, want)
		case claimID != "" && (err == nil || !strings.Contains(err.Error(), `"`+claimID+`"`)):
			return fmt.Errorf("claim status %v does not name %s", err, claimID)
		}
		return nil
	})
}

// An agent's claim watch (a non-claimer, no safety re-read within the test) records every
// change of its partition's claim as etcd reports it: another cluster re-claiming the
// partition, this cluster re-claiming it back, a value that is no claim, its deletion. Each
// change wakes ClaimStatus's channel; the writes follow the recorded state (refused in
// conflict, accepted again afterwards without a failed first attempt).
func TestWatchClaimFollowsChanges(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge*2)
	a := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID = "uid-a" })
	if _, err := a.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	agent := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID, c.Claimer = "uid-a", false })
	if ch, err := agent.ClaimStatus(); !errors.Is(err, ErrClaimNotChecked) || ch == nil {
		t.Fatalf("claim status before any check: %v, want ErrClaimNotChecked", err)
	}
	startClaimWatch(t, agent)
	waitClaimStatus(t, agent, "agent sees its own cluster's claim", nil, "")
	changed, _ := agent.ClaimStatus()

	b := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID = "uid-b" })
	if _, _, err := b.Reclaim(ctx, "uid-a"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(converge):
		t.Fatal("ClaimStatus's channel not closed after another cluster re-claimed the partition")
	}
	waitClaimStatus(t, agent, "conflict seen through the watch", ErrPartitionClaimed, "uid-b")
	if err := agent.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p1", "10.0.0.1")); !errors.Is(err, ErrPartitionClaimed) {
		t.Fatalf("write in conflict: %v, want ErrPartitionClaimed", err)
	}

	if _, _, err := a.Reclaim(ctx, "uid-b"); err != nil {
		t.Fatal(err)
	}
	waitClaimStatus(t, agent, "claim is this cluster's again", nil, "")
	if err := agent.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p1", "10.0.0.1")); err != nil {
		t.Fatalf("write after the re-claim: %v", err)
	}

	key := agent.Origin().ClaimKey()
	if _, err := agent.Client().Put(ctx, key, "not a claim"); err != nil {
		t.Fatal(err)
	}
	waitClaimStatus(t, agent, "unreadable claim", ErrClaimUnreadable, "")
	if _, err := agent.Client().Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	waitClaimStatus(t, agent, "no claim: an agent may write", nil, "")
	if got := counterValue(t, agent.m.claimWatchRestarts); got != 0 {
		t.Errorf("aether_registry_claim_watch_restarts_total = %v with etcd up throughout, want 0", got)
	}
}

// The claim watch falls behind a compaction (its writer cut off from etcd while another cluster
// re-claims the partition and the history is compacted past the change): it reads the claim
// again and records the conflict, with no safety re-read within the test; restored, it follows
// later changes through the new watch.
func TestWatchClaimRecoversFromCompaction(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge*2)
	proxy := testenv.NewCutProxy(t, etcd.Endpoints[0][len("http://"):])
	a := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID = "uid-a" })
	if _, err := a.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	agent := newTestRegistry(t, []string{proxy.URL()}, "eu", "east", func(c *Config) { c.ClusterID, c.Claimer = "uid-a", false })
	startClaimWatch(t, agent)
	waitClaimStatus(t, agent, "agent sees its own cluster's claim", nil, "")

	proxy.Cut()
	b := newTestRegistry(t, etcd.Endpoints, "eu", "east", func(c *Config) { c.ClusterID = "uid-b" })
	if _, _, err := b.Reclaim(ctx, "uid-a"); err != nil {
		t.Fatal(err)
	}
	// More revisions after the change, then compact past all of them.
	for i := range 3 {
		if _, err := a.Client().Put(ctx, "/compact-probe", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := a.Client().Get(ctx, "/compact-probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client().Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()

	waitClaimStatus(t, agent, "conflict found after the compaction", ErrPartitionClaimed, "uid-b")
	if got := counterValue(t, agent.m.claimWatchRestarts.WithLabelValues(claimRestartCompacted)); got < 1 {
		t.Fatalf("aether_registry_claim_watch_restarts_total{reason=compacted} = %v, want >= 1 (the watch's revision was compacted)", got)
	}
	// The new watch follows the next change.
	if _, _, err := a.Reclaim(ctx, "uid-b"); err != nil {
		t.Fatal(err)
	}
	waitClaimStatus(t, agent, "re-claim seen through the new watch", nil, "")
}
