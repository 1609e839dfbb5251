package routestatus

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

func added(recs ...registry.Record[*registryv1.ServiceEndpoint]) registry.Batch[*registryv1.ServiceEndpoint] {
	var b registry.Batch[*registryv1.ServiceEndpoint]
	for _, r := range recs {
		b.Events = append(b.Events, registry.Event[*registryv1.ServiceEndpoint]{Type: registry.Added, Record: r})
	}
	return b
}

func deleted(recs ...registry.Record[*registryv1.ServiceEndpoint]) registry.Batch[*registryv1.ServiceEndpoint] {
	b := added(recs...)
	for i := range b.Events {
		b.Events[i].Type = registry.Deleted
	}
	return b
}

var (
	epTCP  = endpointPort{"db", 5432, registryv1.Protocol_PROTOCOL_TCP}
	epHTTP = endpointPort{"db", 5432, registryv1.Protocol_PROTOCOL_HTTP}
	epGRPC = endpointPort{"rpc", 9090, registryv1.Protocol_PROTOCOL_GRPC}
)

// TestEndpointViewChanges: the view reports a service as changed exactly when a port protocol
// model.Assemble derives may change for some set of clusters: a protocol appears or goes, a
// cluster gets its first or loses its last endpoint of a port, or the counts change while a port
// has several protocols; pods coming and going with the same protocol change nothing.
func TestEndpointViewChanges(t *testing.T) {
	db := model.ServiceKey{Namespace: "shop", Name: "db"}
	other := model.ServiceKey{Namespace: "shop", Name: "other"}
	v := newEndpointView()
	rec := func(cluster, svc, uid string, ports ...endpointPort) registry.Record[*registryv1.ServiceEndpoint] {
		return endpointRecord(cluster, "shop", svc, uid, ports...)
	}
	for _, c := range []struct {
		what      string
		batch     registry.Batch[*registryv1.ServiceEndpoint]
		changed   []model.ServiceKey
		endpoints int
	}{
		{"snapshot", added(rec("east", "db", "a", epTCP), rec("east", "db", "b", epTCP), rec("east", "other", "o", epGRPC)), []model.ServiceKey{db, other}, 3},
		{"one more TCP pod in east", added(rec("east", "db", "c", epTCP)), nil, 4},
		{"an update with the same ports", added(rec("east", "db", "c", epTCP)), nil, 4},
		{"a TCP pod in west: west's first", added(rec("west", "db", "w1", epTCP)), []model.ServiceKey{db}, 5},
		{"another TCP pod in west", added(rec("west", "db", "w2", epTCP)), nil, 6},
		{"an east pod turns HTTP", added(rec("east", "db", "c", epHTTP)), []model.ServiceKey{db}, 6},
		{"an HTTP pod more while mixed: counts matter", added(rec("east", "db", "d", epHTTP)), []model.ServiceKey{db}, 7},
		{"a TCP pod less while mixed", deleted(rec("east", "db", "a", epTCP)), []model.ServiceKey{db}, 6},
		{"the HTTP pods go: TCP only again", deleted(rec("east", "db", "c", epHTTP), rec("east", "db", "d", epHTTP)), []model.ServiceKey{db}, 4},
		{"a west TCP pod goes, one left", deleted(rec("west", "db", "w2", epTCP)), nil, 3},
		{"west's last goes", deleted(rec("west", "db", "w1", epTCP)), []model.ServiceKey{db}, 2},
		{"a pod with a second port name", added(rec("east", "db", "e", epTCP, epGRPC)), []model.ServiceKey{db}, 3},
		{"an unknown key deleted", deleted(rec("east", "db", "nope", epTCP)), nil, 3},
		{"every endpoint of both services goes", deleted(rec("east", "db", "b", epTCP), rec("east", "db", "e", epTCP), rec("east", "other", "o", epGRPC)), []model.ServiceKey{db, other}, 0},
	} {
		changed, first := v.apply(c.batch)
		if !slices.Equal(changed, c.changed) {
			t.Errorf("%s: changed %v, want %v", c.what, changed, c.changed)
		}
		if first != (c.what == "snapshot") {
			t.Errorf("%s: first %v", c.what, first)
		}
		if synced, _, n := v.state(); !synced || n != c.endpoints {
			t.Errorf("%s: synced %v, %d endpoints, want %d", c.what, synced, n, c.endpoints)
		}
	}
	if len(v.bySvc) != 0 {
		t.Errorf("services left in an empty view: %v", v.bySvc)
	}

	// Only the services asked for, with the fields the status needs.
	v.apply(added(rec("east", "db", "a", epTCP), rec("east", "other", "o", epGRPC)))
	got := v.endpoints(map[model.ServiceKey]bool{db: true, {Namespace: "shop", Name: "missing"}: true})
	want := model.Endpoint{Service: db, Cluster: "east", PodUID: "a", Ports: []model.EndpointPort{{Name: "db", Port: 5432, Protocol: model.ProtocolTCP}}}
	if len(got) != 1 || got[0].Service != want.Service || got[0].Cluster != want.Cluster || got[0].PodUID != want.PodUID || !slices.Equal(got[0].Ports, want.Ports) {
		t.Errorf("endpoints of db: %+v, want [%+v]", got, want)
	}
}

// fakeEndpoints is the registry's endpoint watch at a test's boundary: the batches sent on it.
type fakeEndpoints chan registry.Batch[*registryv1.ServiceEndpoint]

func (f fakeEndpoints) WatchEndpoints(context.Context) <-chan registry.Batch[*registryv1.ServiceEndpoint] {
	return f
}

// subscribedExports is an export view that records its subscriber and is synced once synced is
// closed.
type subscribedExports struct {
	fakeExports
	synced chan struct{}
	sub    chan func([]model.ServiceKey)
}

func (e subscribedExports) Subscribe(fn func([]model.ServiceKey)) { e.sub <- fn }
func (e subscribedExports) WaitSynced(ctx context.Context) error {
	select {
	case <-e.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestFollowRegistryAsksForPasses: the registry's records ask for a pass once the endpoints are
// first read and once the export view is synced, then only for a change that may change the
// protocol of a port of a service the last pass's routes named, or for export marks of such a
// service; other changes ask for none.
func TestFollowRegistryAsksForPasses(t *testing.T) {
	named := model.ServiceKey{Namespace: "shop", Name: "db"}
	ch := make(fakeEndpoints)
	ex := subscribedExports{synced: make(chan struct{}), sub: make(chan func([]model.ServiceKey), 1)}
	c := &Controller{Log: slog.New(slog.DiscardHandler), Endpoints: ch, Exports: ex, eps: newEndpointView(),
		refs: map[model.ServiceKey]bool{named: true}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	passes := make(chan struct{}, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.followRegistry(ctx, func() { passes <- struct{}{} })
	}()
	// wantPasses waits for n passes asked for, then checks that no more were.
	wantPasses := func(what string, n int) {
		t.Helper()
		for i := range n {
			select {
			case <-passes:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: %d passes asked for, want %d", what, i, n)
			}
		}
		if len(passes) != 0 {
			t.Fatalf("%s: %d more passes asked for than %d", what, len(passes), n)
		}
	}
	rec := func(svc, uid string, p endpointPort) registry.Record[*registryv1.ServiceEndpoint] {
		return endpointRecord("east", "shop", svc, uid, p)
	}
	// A send returns once the loop took the batch, and the loop takes one only after it handled
	// the one before: after an empty batch (which asks for nothing), every batch sent before it
	// has asked for whatever it asks for.
	flush := func() { ch <- registry.Batch[*registryv1.ServiceEndpoint]{} }
	snap := added(rec("db", "a", epTCP), rec("web", "w", epTCP))
	snap.Snapshot = true
	ch <- snap
	flush()
	wantPasses("first endpoint read", 1)
	close(ex.synced)
	wantPasses("export view synced", 1)
	ch <- added(rec("web", "w", epHTTP)) // not named
	ch <- added(rec("db", "b", epTCP))   // named, the same protocol
	flush()
	wantPasses("changes that cannot change a named service's protocol", 0)
	ch <- added(rec("db", "b", epHTTP)) // named, a protocol more
	flush()
	wantPasses("a named service's protocol change", 1)
	sub := <-ex.sub
	sub([]model.ServiceKey{{Namespace: "shop", Name: "web"}})
	sub([]model.ServiceKey{{Namespace: "shop", Name: "web"}, named})
	wantPasses("export marks", 1)
	cancel()
	close(ch)
	<-done
}

// TestNoPassBeforeRegistryRead: a pass writes nothing before the registry's endpoint records and
// export marks were both read, and writes once they are.
func TestNoPassBeforeRegistryRead(t *testing.T) {
	const ns = "shop"
	rd := cacheReader{
		nss: []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}},
		svcs: []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"},
				Ports: []corev1.ServicePort{{Name: "db", Port: 5432, Protocol: corev1.ProtocolTCP}}}}},
	}
	r := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Generation: 1}}
	r.Spec.ParentRefs = []gwv1.ParentReference{{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: "db", Port: ptr(gwv1.PortNumber(5432))}}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(r); err != nil {
		t.Fatal(err)
	}
	gw := gwfake.NewSimpleClientset(r)
	ex := subscribedExports{synced: make(chan struct{})}
	c := &Controller{Client: rd, Gateway: gw, Log: slog.New(slog.DiscardHandler), Cluster: "east", Exports: ex, eps: newEndpointView()}
	c.http = gwlisters.NewHTTPRouteLister(idx)
	ctx := context.Background()
	pass := func() {
		t.Helper()
		if _, err := c.Reconcile(ctx, syncAll); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	c.eps.apply(added(endpointRecord("east", ns, "db", "a", epTCP)))
	pass()
	if n := len(gw.Actions()); n != 0 {
		t.Fatalf("%d API calls before the registry's records were read: %v", n, gw.Actions())
	}
	close(ex.synced)
	pass()
	got, err := gw.GatewayV1().HTTPRoutes(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Parents) != 1 || len(got.Status.Parents[0].Conditions) == 0 ||
		got.Status.Parents[0].Conditions[0].Reason != string(gwv1.RouteReasonNoMatchingParent) {
		t.Fatalf("status once the records are read: %+v, want Accepted=False/NoMatchingParent (port 5432 is TCP)", got.Status.Parents)
	}
}

func (e subscribedExports) Synced() bool {
	select {
	case <-e.synced:
		return true
	default:
		return false
	}
}
