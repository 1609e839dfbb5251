package registry

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/internal/testenv"
)

// A writer that dies (its lease is no longer renewed) loses its endpoints once the TTL passes;
// another writer's endpoints stay.
func TestDeadWriterEndpointsExpire(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge*2)
	reader := newTestRegistry(t, etcd.Endpoints, "eu", "reader", nil)
	alive := newTestRegistry(t, etcd.Endpoints, "eu", "alive", nil)
	dying := newTestRegistry(t, etcd.Endpoints, "eu", "dying", nil)
	v := startViewer(t, reader.WatchEndpoints(ctx))

	for _, w := range []*Registry{alive, dying} {
		for _, uid := range []string{"p1", "p2"} {
			if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", uid, "10.0.0.1")); err != nil {
				t.Fatal(err)
			}
		}
	}
	aliveKeys := []string{alive.Origin().EndpointKey("shop", "cart", "p1"), alive.Origin().EndpointKey("shop", "cart", "p2")}
	dyingKeys := []string{dying.Origin().EndpointKey("shop", "cart", "p1"), dying.Origin().EndpointKey("shop", "cart", "p2")}
	v.waitKeys(t, append(append([]string{}, aliveKeys...), dyingKeys...)...)

	// Death: keepalives stop, the lease is not revoked.
	if err := dying.Close(); err != nil {
		t.Fatal(err)
	}
	v.waitKeys(t, aliveKeys...)
	// The endpoints went away as Deleted events, not by re-listing.
	for _, b := range v.allBatches() {
		if b.Relisted {
			t.Fatal("expiry was seen through a re-list, want Deleted events")
		}
	}
}

// A writer cut off from etcd for longer than the TTL loses its endpoints (readers see them
// deleted); when it is back it notices the lost lease and re-registers everything under a new
// lease, including endpoints registered and deregistered before the cut.
func TestCutOffWriterReregisters(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge*3)
	proxy := testenv.NewCutProxy(t, etcd.Endpoints[0][len("http://"):])
	reader := newTestRegistry(t, etcd.Endpoints, "eu", "reader", nil)
	w := newTestRegistry(t, []string{proxy.URL()}, "eu", "alpha", nil)
	v := startViewer(t, reader.WatchEndpoints(ctx))

	var want []string
	for _, uid := range []string{"p1", "p2", "p3"} {
		if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", uid, "10.0.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.DeregisterEndpoint(ctx, "shop", "cart", "p2"); err != nil {
		t.Fatal(err)
	}
	want = []string{w.Origin().EndpointKey("shop", "cart", "p1"), w.Origin().EndpointKey("shop", "cart", "p3")}
	v.waitKeys(t, want...)
	lease1, changed := w.Lease()

	proxy.Cut()
	v.waitKeys(t) // the lease expired server-side: everything is gone
	proxy.Restore()

	v.waitKeys(t, want...)
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("lease never replaced")
	}
	lease2, _ := w.Lease()
	if lease2 == 0 || lease2 == lease1 {
		t.Fatalf("lease after re-registration = %x, before %x: want a new one", lease2, lease1)
	}
	if got := counterValue(t, w.m.leaseLost); got < 1 {
		t.Fatalf("aether_registry_lease_lost_total = %v, want >= 1", got)
	}
	// The re-registered endpoints are bound to the new lease and kept alive by it.
	ttl, err := reader.Client().TimeToLive(ctx, lease2, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if len(ttl.Keys) != 2 || ttl.TTL <= 0 {
		t.Fatalf("new lease holds %d keys with TTL %d, want 2 keys alive", len(ttl.Keys), ttl.TTL)
	}
	// New registrations work under the new lease.
	if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p4", "10.0.0.4")); err != nil {
		t.Fatal(err)
	}
	v.waitKeys(t, append(want, w.Origin().EndpointKey("shop", "cart", "p4"))...)
}

// RevokeEndpoints removes every endpoint at once.
func TestRevokeEndpoints(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge)
	w := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(c *Config) { c.LeaseTTL = time.Hour })
	for _, uid := range []string{"p1", "p2"} {
		if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", uid, "10.0.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.RevokeEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	recs, _, err := w.ListEndpoints(ctx)
	if err != nil || len(recs) != 0 {
		t.Fatalf("after revoke: %d endpoints, %v", len(recs), err)
	}
	if got := counterValue(t, w.m.leaseLost); got != 0 {
		t.Fatalf("a revoke counted as a lost lease (%v)", got)
	}
	if err := w.RegisterEndpoint(context.Background(), testEndpoint("shop", "cart", "p3", "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
}

// A lease that vanished before the keeper noticed (here revoked behind the writer's back) is
// replaced by the next RegisterEndpoint, which re-registers everything instead of failing.
func TestRegisterReplacesVanishedLease(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge)
	// A long TTL: keepalives are 20 s apart, so the keeper cannot notice first.
	w := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(c *Config) { c.LeaseTTL = time.Minute })
	if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	lease, _ := w.Lease()
	other := newTestRegistry(t, etcd.Endpoints, "eu", "other", nil)
	if _, err := other.Client().Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p2", "10.0.0.2")); err != nil {
		t.Fatalf("register after the lease vanished: %v", err)
	}
	recs, _, err := other.ListEndpoints(ctx)
	if err != nil || len(recs) != 2 {
		t.Fatalf("after replacement: %d endpoints, %v; want p1 and p2", len(recs), err)
	}
	if got := counterValue(t, w.m.leaseLost); got != 1 {
		t.Fatalf("aether_registry_lease_lost_total = %v, want 1", got)
	}
}

// KeepAliveStatus follows the lease's keepalives against a real etcd: no lease before the first
// registration; answered every third of the TTL while etcd answers; missing while the writer is
// cut off, and, once it is back, not missing with the missed stretch ending after the cut; no
// lease again after RevokeEndpoints, with the missed stretch remembered.
func TestKeepAliveStatus(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge*3)
	proxy := testenv.NewCutProxy(t, etcd.Endpoints[0][len("http://"):])
	w := newTestRegistry(t, []string{proxy.URL()}, "eu", "alpha", func(c *Config) { c.LeaseTTL = 3 * time.Second })
	status := func() KeepAliveStatus { return w.KeepAliveStatus(time.Now()) }
	if s := status(); s.Lease != 0 || s.Missing || !s.Missed.IsZero() {
		t.Fatalf("before the first registration: %+v, want no lease, nothing missed", s)
	}
	if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	granted := status()
	if lease, _ := w.Lease(); granted.Lease != lease || granted.Lease == 0 || granted.Answered.IsZero() ||
		granted.Period != 2*time.Second || granted.Missing || !granted.Missed.IsZero() {
		t.Fatalf("after the first registration (lease %x): %+v, want the lease answered, period 3s/3+1s, nothing missed", lease, granted)
	}
	testenv.Eventually(t, converge, "a keepalive answered", func() error {
		if s := status(); !s.Answered.After(granted.Answered) || s.Missing {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})

	cut := time.Now()
	proxy.Cut()
	testenv.Eventually(t, converge, "the keepalive missing while cut off", func() error {
		if s := status(); !s.Missing || s.Missed.Before(cut) {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})
	restored := time.Now()
	proxy.Restore()
	testenv.Eventually(t, converge, "answered again after the cut", func() error {
		if s := status(); s.Missing || s.Lease == 0 || !s.Answered.After(restored) || s.Missed.Before(restored) {
			return fmt.Errorf("status %+v, want answered and the missed stretch ended after %v", s, restored)
		}
		return nil
	})

	missed := status().Missed
	if err := w.RevokeEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if s := status(); s.Lease != 0 || s.Missing || !s.Answered.IsZero() || !s.Missed.Equal(missed) {
		t.Fatalf("after RevokeEndpoints: %+v, want no lease, the last missed stretch (%v) kept", s, missed)
	}
}
