package registry

import (
	"testing"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
)

// A watcher that falls behind a compaction (cut off while keys are added, changed and deleted
// and the history is compacted) re-lists and delivers exactly the difference, deletions
// included, and its view equals the store afterwards.
func TestWatchConvergesAfterCompaction(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx := ctxT(t, converge*2)
	proxy := testenv.NewCutProxy(t, etcd.Endpoints[0][len("http://"):])
	w := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", nil)
	reader := newTestRegistry(t, []string{proxy.URL()}, "eu", "reader", nil)

	key := func(uid string) string { return w.Origin().EndpointKey("shop", "cart", uid) }
	for _, uid := range []string{"keep", "change", "drop"} {
		if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", uid, "10.0.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	v := startViewer(t, reader.WatchEndpoints(ctx))
	v.waitKeys(t, key("change"), key("drop"), key("keep"))

	proxy.Cut()
	changed := testEndpoint("shop", "cart", "change", "10.0.0.1")
	changed.Health = registryv1.Health_HEALTH_UNHEALTHY
	if err := w.RegisterEndpoint(ctx, changed); err != nil {
		t.Fatal(err)
	}
	if err := w.DeregisterEndpoint(ctx, "shop", "cart", "drop"); err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "new", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	// Churn: a key added and removed while cut off must not show up at all.
	if err := w.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "blip", "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	if err := w.DeregisterEndpoint(ctx, "shop", "cart", "blip"); err != nil {
		t.Fatal(err)
	}
	resp, err := w.Client().Get(ctx, "compact-probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Client().Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	relistsBefore := counterValue(t, reader.m.relists)
	proxy.Restore()

	v.waitKeys(t, key("change"), key("keep"), key("new"))
	if got := counterValue(t, reader.m.relists); got <= relistsBefore {
		t.Fatalf("aether_registry_watch_relists_total = %v, want > %v", got, relistsBefore)
	}
	// Exactly the difference: the relisted batch holds change (updated), drop (deleted), new
	// (added) and nothing for keep or blip.
	var relisted *Batch[*registryv1.ServiceEndpoint]
	for _, b := range v.allBatches() {
		if b.Relisted {
			relisted = &b
		}
	}
	if relisted == nil {
		t.Fatal("no re-listed batch")
	}
	got := map[string]EventType{}
	for _, e := range relisted.Events {
		got[e.Key] = e.Type
	}
	want := map[string]EventType{key("change"): Updated, key("drop"): Deleted, key("new"): Added}
	if len(got) != len(want) {
		t.Fatalf("re-listed events %v, want %v", got, want)
	}
	for k, typ := range want {
		if got[k] != typ {
			t.Fatalf("re-listed events %v, want %v", got, want)
		}
	}
	// The view equals the store, value for value.
	recs, _, err := w.ListEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		seen, ok := v.get(rec.Key)
		if !ok || !proto.Equal(seen.Value, rec.Value) || seen.ModRevision != rec.ModRevision {
			t.Fatalf("view of %s differs from the store", rec.Key)
		}
	}
}
