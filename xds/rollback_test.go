package xds

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
)

// TestRollbackYieldsToNewerSnapshot: a NACK of the served snapshot rolls back to the last ACKed
// one in a goroutine; when a SetMesh takes the server's lock before that goroutine does, the newer
// snapshot stays served. Before, the rollback served the old snapshot over it, so the newer
// version was never ACKed (seen with a restarted Envoy rejecting a gone pod netns: the agent's
// next model, without the pod, was replaced by the rejected configuration again).
func TestRollbackYieldsToNewerSnapshot(t *testing.T) {
	s := newTestServer(t)
	ctx := context.Background()
	m := goldenMesh()
	mesh := func(v uint64) *model.Mesh {
		return model.New(v, m.Cluster, m.MeshDomain, m.TrustDomain, m.Node, m.Services, m.Endpoints, m.Pods[:int(v)%2+1])
	}
	if _, err := s.SetMesh(ctx, mesh(1)); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.ack(resource.ListenerType, 1, true, "")
	s.ack(resource.ClusterType, 1, true, "")
	s.mu.Unlock()
	if _, err := s.SetMesh(ctx, mesh(2)); err != nil {
		t.Fatal(err)
	}
	// The NACK of version 2 arrives while a SetMesh already waits for the lock: Go's mutex hands
	// the lock to waiters in arrival order once one has waited over 1 ms (starvation mode), so
	// SetMesh runs before the rollback goroutine.
	var v3 string
	var wg sync.WaitGroup
	s.mu.Lock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		var err error
		if v3, err = s.SetMesh(ctx, mesh(3)); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(20 * time.Millisecond) // ordering only: SetMesh is waiting for the lock
	s.ack(resource.ListenerType, 2, false, "rejected")
	s.mu.Unlock()
	wg.Wait()
	served := func() string {
		snap, err := s.cache.GetSnapshot("n")
		if err != nil {
			t.Fatal(err)
		}
		return snap.GetVersion(resource.ListenerType)
	}
	// Give the rollback goroutine its turns, then the served snapshot must still be version 3.
	for range 100 {
		s.mu.Lock()
		_ = s.seq
		s.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	if got := served(); got != v3 || s.Version() != v3 {
		t.Errorf("served snapshot %q, server version %q after a rollback raced SetMesh; want %q", got, s.Version(), v3)
	}
}

// TestNACKBookkeepingBounded: the record of NACKs already logged and counted (one per type and
// version) is pruned with the versions it refers to, like the server's other per-version maps.
// Before, it grew by an entry per rejected type and version for the life of the agent: an Envoy
// rejecting every configuration of a busy node (a model change a second) kept adding to it.
func TestNACKBookkeepingBounded(t *testing.T) {
	s := newTestServer(t)
	ctx := context.Background()
	m := goldenMesh()
	for v := uint64(1); v <= 300; v++ {
		mesh := model.New(v, m.Cluster, m.MeshDomain, m.TrustDomain, m.Node, m.Services, m.Endpoints, m.Pods[:int(v)%2+1])
		if _, err := s.SetMesh(ctx, mesh); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		s.ack(resource.ListenerType, v, false, "rejected")
		s.ack(resource.ClusterType, v, false, "rejected")
		s.mu.Unlock()
	}
	if n, _ := s.NACKs(); n != 600 {
		t.Errorf("%d NACKs counted, want 600", n)
	}
	s.mu.Lock()
	n := len(s.nacked)
	s.mu.Unlock()
	if n > 2*66 {
		t.Errorf("%d NACK records kept after 300 rejected versions, want at most %d (the last 64 or so versions)", n, 2*66)
	}
}

// newTestServer is a Server for node "n" issuing SVIDs from a test CA (an hour), without
// metrics.
func newTestServer(t *testing.T) *Server {
	t.Helper()
	ca, _ := testCA(t, model.DefaultTrustDomain, time.Hour)
	s, err := NewServer(ServerOptions{NodeID: "n", Identity: identity.NewRotator(ca).Provider()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
