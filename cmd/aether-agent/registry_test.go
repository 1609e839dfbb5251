package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/registry"
)

func TestDesiredEndpoints(t *testing.T) {
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	db := model.ServiceKey{Namespace: "shop", Name: "db"}
	m := model.New(1, "a", "", "", model.Node{Name: "n1", IP: netip.MustParseAddr("172.30.0.11"), Zone: "z1"},
		[]*model.Service{
			{Key: web, Local: true, Ports: []model.ServicePort{
				{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP},
				{Name: "admin", Port: 9000, TargetPortName: "admin", Protocol: model.ProtocolHTTP},
				{Name: "raw", Port: 7000, TargetPort: 7000, Protocol: model.ProtocolTCP, AppProtocol: true},
			}},
			{Key: db, Local: true, Ports: []model.ServicePort{{Name: "pg", Port: 5432, TargetPortName: "missing"}}},
		}, nil,
		[]*model.LocalPod{
			{UID: "u1", Namespace: "shop", Name: "web-1", ServiceAccount: "web", Ready: true, Protocol: model.ProtocolGRPC,
				IPs:      []netip.Addr{netip.MustParseAddr("10.244.1.5")},
				Ports:    []model.PodPort{{Name: "admin", Port: 9901}},
				Services: []model.ServiceKey{db, web}},
			{UID: "u2", Namespace: "shop", Name: "web-2", Services: []model.ServiceKey{web}}, // no IPs: not registrable
		})
	got := desiredEndpoints(m)
	if len(got) != 1 {
		t.Fatalf("desired endpoints = %v, want only shop/web/u1 (db's named port is missing on the pod; u2 has no IP)", got)
	}
	ep := got["shop/web/u1"]
	if ep == nil {
		t.Fatalf("no shop/web/u1 in %v", got)
	}
	if ep.Health != registryv1.Health_HEALTH_HEALTHY || ep.SpiffeId != "spiffe://aether.internal/ns/shop/sa/web" ||
		ep.Kubernetes.NodeIp != "172.30.0.11" || ep.Zone != "z1" || ep.Addresses[0] != "10.244.1.5" {
		t.Errorf("endpoint = %v", ep)
	}
	// Service ports in model order (by port: 80, 7000, 9000).
	want := []*registryv1.EndpointPort{
		{Name: "http", Port: 8080, Protocol: registryv1.Protocol_PROTOCOL_GRPC}, // the pod annotation wins over the default
		{Name: "raw", Port: 7000, Protocol: registryv1.Protocol_PROTOCOL_TCP},   // appProtocol wins over the annotation
		{Name: "admin", Port: 9901, Protocol: registryv1.Protocol_PROTOCOL_GRPC},
	}
	if len(ep.Ports) != len(want) {
		t.Fatalf("ports = %v", ep.Ports)
	}
	for i, w := range want {
		g := ep.Ports[i]
		if g.Name != w.Name || g.Port != w.Port || g.Protocol != w.Protocol {
			t.Errorf("port %d = %v, want %v", i, g, w)
		}
	}
}

// TestDesiredEndpointsSharedTargetPort: a Service whose two ports reach one container port (80
// and 8080 both to 8080, a common shape) gives an endpoint the registry accepts, with both port
// names (other clusters resolve a port's target by its name). Before, the registry refused the
// record as a duplicate port and no pod of such a Service was ever registered.
func TestDesiredEndpointsSharedTargetPort(t *testing.T) {
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	m := model.New(1, "a", "", "", model.Node{Name: "n1"},
		[]*model.Service{{Key: web, Local: true, Ports: []model.ServicePort{
			{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP},
			{Name: "alt", Port: 8080, TargetPort: 8080, Protocol: model.ProtocolHTTP},
		}}}, nil,
		[]*model.LocalPod{{UID: "u1", Namespace: "shop", Name: "web-1", Ready: true, Protocol: model.ProtocolHTTP,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Services: []model.ServiceKey{web}}})
	ep := desiredEndpoints(m)["shop/web/u1"]
	if ep == nil {
		t.Fatal("no endpoint for shop/web/u1")
	}
	if err := registry.ValidateEndpoint(ep); err != nil {
		t.Fatalf("the registry refuses the endpoint: %v", err)
	}
	var got []string
	for _, p := range ep.Ports {
		got = append(got, fmt.Sprintf("%s/%d", p.Name, p.Port))
	}
	if want := "http/8080 alt/8080"; strings.Join(got, " ") != want {
		t.Errorf("ports = %v, want %s", got, want)
	}
}

func TestRegistryViewAppliesEndpointBatches(t *testing.T) {
	v := newRegistryView(slog.New(slog.DiscardHandler), time.Minute, func() {})
	rec := func(key, addr string) registry.Record[*registryv1.ServiceEndpoint] {
		return registry.Record[*registryv1.ServiceEndpoint]{Key: key, Origin: registry.Origin{Region: "eu", Cluster: "b"},
			Value: &registryv1.ServiceEndpoint{Service: &registryv1.ServiceRef{Namespace: "shop", Name: "web"}, Addresses: []string{addr},
				Kubernetes: &registryv1.KubernetesMetadata{PodUid: key}}}
	}
	ev := func(typ registry.EventType, key, addr string) registry.Event[*registryv1.ServiceEndpoint] {
		return registry.Event[*registryv1.ServiceEndpoint]{Type: typ, Record: rec(key, addr)}
	}
	addrs := func() map[string]string {
		eps, _ := v.Records()
		out := map[string]string{}
		for _, e := range eps {
			out[e.PodUID] = e.IPs[0].String()
		}
		return out
	}
	apply := func(evs ...registry.Event[*registryv1.ServiceEndpoint]) {
		v.mu.Lock()
		v.applyEndpoints(registry.Batch[*registryv1.ServiceEndpoint]{Events: evs}, time.Now())
		v.cacheOK = false
		v.mu.Unlock()
	}
	apply(ev(registry.Added, "p1", "10.0.0.1"), ev(registry.Added, "p2", "10.0.0.2"), ev(registry.Added, "bad", "not-an-ip"))
	if got := addrs(); len(got) != 2 || got["p1"] != "10.0.0.1" || got["p2"] != "10.0.0.2" {
		t.Fatalf("after snapshot: %v, want p1 and p2 (the bad record skipped)", got)
	}
	// An update converts only the changed record; a valid record turning bad leaves the view.
	apply(ev(registry.Updated, "p1", "10.0.0.9"), ev(registry.Updated, "p2", "999.1.1.1"))
	if got := addrs(); len(got) != 1 || got["p1"] != "10.0.0.9" {
		t.Fatalf("after update: %v, want only p1 at 10.0.0.9", got)
	}
	apply(ev(registry.Deleted, "p1", ""))
	if got := addrs(); len(got) != 1 {
		t.Fatalf("after delete, before a probe confirmed it: %v, want p1 still (held)", got)
	}
	after := time.Now().Add(time.Second)
	v.confirmDeletions(after, after, nil)
	if got := addrs(); len(got) != 0 {
		t.Fatalf("after delete: %v, want none", got)
	}
}

func heldTestEndpoint(uid string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service:   &registryv1.ServiceRef{Namespace: "shop", Name: "remote"},
		Addresses: []string{"10.245.1.5"},
		Ports:     []*registryv1.EndpointPort{{Name: "http", Port: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		SpiffeId:  "spiffe://aether.internal/ns/shop/sa/default",
		Health:    registryv1.Health_HEALTH_HEALTHY,
		Kubernetes: &registryv1.KubernetesMetadata{NodeName: "beta-node1", PodName: "remote-" + uid, PodUid: uid,
			NodeIp: "172.30.2.11", ServiceAccount: "default"},
	}
}

// TestRegistryViewHoldsDeletions drives the view's deletion hold with explicit probe times: a
// deletion leaves the view only after a successful probe that started after it arrived, and
// never within the hold after a failed probe; a re-registration cancels a held deletion.
func TestRegistryViewHoldsDeletions(t *testing.T) {
	const hold = 10 * time.Second
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	rec := func(uid string, rev int64) registry.Event[*registryv1.ServiceEndpoint] {
		return registry.Event[*registryv1.ServiceEndpoint]{Type: registry.Added, Record: registry.Record[*registryv1.ServiceEndpoint]{
			Key: "k/" + uid, Value: heldTestEndpoint(uid), ModRevision: rev,
			Origin: registry.Origin{Region: "beta", Cluster: "beta"}}}
	}
	del := func(uid string, rev int64) registry.Event[*registryv1.ServiceEndpoint] {
		e := rec(uid, rev)
		e.Type = registry.Deleted
		return e
	}
	type step struct {
		batch  []registry.Event[*registryv1.ServiceEndpoint] // delivered at t
		probe  *[2]float64                                   // probe from [0] to [1] ...
		err    error                                         // ... with this result
		t      float64
		want   int // endpoints in the view after the step
		reason string
	}
	unreachable := errors.New("context deadline exceeded")
	cases := []struct {
		name  string
		steps []step
	}{
		{"healthy registry: deletion applied after the next probe", []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1), rec("u2", 2)}, want: 2},
			{t: 1, batch: []registry.Event[*registryv1.ServiceEndpoint]{del("u1", 3)}, want: 2, reason: "held until a probe confirms it"},
			{probe: &[2]float64{0.5, 1.5}, want: 2, reason: "the probe started before the deletion arrived"},
			{probe: &[2]float64{2, 2.1}, want: 1, reason: "a probe after the deletion succeeded"},
		}},
		{"registry cut: deletions held through the cut and the hold after it", []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1), rec("u2", 2)}, want: 2},
			{probe: &[2]float64{1, 3}, err: unreachable, want: 2},
			{t: 4, batch: []registry.Event[*registryv1.ServiceEndpoint]{del("u1", 3), del("u2", 3)}, want: 2, reason: "lease expiry seen through a one-way cut"},
			{probe: &[2]float64{5, 7}, err: unreachable, want: 2},
			{probe: &[2]float64{12, 12.1}, want: 2, reason: "reachable again, but within the hold after the last failure (7s)"},
			{t: 13, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 4)}, want: 2, reason: "u1's writer re-registered"},
			{probe: &[2]float64{17.5, 17.6}, want: 1, reason: "hold over: u2 never came back (its node died during the cut)"},
		}},
		{"deletion of an unknown endpoint is ignored", []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1), del("u9", 2)}, want: 1},
			{probe: &[2]float64{1, 1.1}, want: 1},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := newRegistryView(slog.New(slog.DiscardHandler), hold, func() {})
			for i, s := range tc.steps {
				if s.batch != nil {
					v.mu.Lock()
					v.applyEndpoints(registry.Batch[*registryv1.ServiceEndpoint]{Events: s.batch}, at(s.t))
					v.cacheOK = false
					v.mu.Unlock()
				}
				if s.probe != nil {
					v.confirmDeletions(at(s.probe[0]), at(s.probe[1]), s.err)
				}
				if eps, _ := v.Records(); len(eps) != s.want {
					t.Fatalf("step %d (%s): %d endpoints in the view, want %d", i, s.reason, len(eps), s.want)
				}
			}
		})
	}
}

// TestRegistryViewKeepsEndpointsThroughRegistryCut cuts a writer and a reader off a real etcd
// until the writer's lease expires, then restores the reader first: the reader's resumed watch
// delivers the lease-expiry deletion, which must not empty the view (it did before the hold:
// every cluster's EDS went empty during and after a registry cut). The writer comes back and
// re-registers; the endpoint never left the view. Then the writer dies for good: its endpoint
// leaves the view once its lease expired and the hold passed.
func TestRegistryViewKeepsEndpointsThroughRegistryCut(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	target := strings.TrimPrefix(etcd.Endpoints[0], "http://")
	pw, pr := testenv.NewCutProxy(t, target), testenv.NewCutProxy(t, target)
	log := slog.New(slog.DiscardHandler)
	newReg := func(url, cluster string) *registry.Registry {
		r, err := registry.New(registry.Config{Endpoints: []string{url}, Region: cluster, Cluster: cluster,
			LeaseTTL: 2 * time.Second, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	writer, reader := newReg(pw.URL(), "beta"), newReg(pr.URL(), "alpha")
	direct, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The view's endpoint count after every change; gap records that it emptied once it had one.
	var mu sync.Mutex
	seen, gap := false, false
	var view *registryView
	view = newRegistryView(log, 10*time.Second, func() {
		eps, _ := view.Records()
		mu.Lock()
		defer mu.Unlock()
		if len(eps) > 0 {
			seen = true
		} else if seen {
			gap = true
		}
	})
	go view.run(ctx, reader)
	go view.probeRegistry(ctx, func(ctx context.Context) error { return registryHealthy(ctx, reader) }, 200*time.Millisecond, time.Second)
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ep := heldTestEndpoint("u1")
	if err := writer.RegisterEndpoint(ctx, ep); err != nil {
		t.Fatal(err)
	}
	key := registry.Origin{Region: "beta", Cluster: "beta"}.EndpointKey("shop", "remote", "u1")
	// present: the endpoint is in the view; held: its deletion is held.
	present := func() (ok, held bool) {
		view.mu.Lock()
		defer view.mu.Unlock()
		_, ok = view.eps[key]
		_, held = view.pending[key]
		return ok, held
	}
	wait("the reader sees the endpoint", func() bool { ok, _ := present(); return ok })
	deleted := direct.Watch(ctx, key, clientv3.WithFilterPut())

	pw.Cut()
	pr.Cut()
	var delRev int64
	select {
	case resp := <-deleted:
		if len(resp.Events) == 0 {
			t.Fatalf("watch of %s: %v", key, resp.Err())
		}
		delRev = resp.Events[0].Kv.ModRevision
	case <-ctx.Done():
		t.Fatal("the writer's lease did not expire during the cut")
	}
	pr.Restore()
	wait("the reader's watch delivers the deletion", func() bool {
		view.mu.Lock()
		defer view.mu.Unlock()
		return view.epsRev >= delRev
	})
	if ok, held := present(); !ok || !held {
		t.Fatalf("after the reader's watch delivered the lease-expiry deletion of a writer cut off with it: in the view %v, deletion held %v; want the endpoint kept, its deletion held", ok, held)
	}
	pw.Restore()
	// The re-registration cancels the held deletion.
	wait("the writer re-registers under a new lease", func() bool { ok, held := present(); return ok && !held })
	mu.Lock()
	if gap {
		t.Error("the view lost the endpoint during the cut")
	}
	mu.Unlock()

	// The writer dies (no revoke): once its lease expired and the hold passed, the endpoint goes.
	if err := writer.Close(); err != nil {
		t.Fatal(err)
	}
	wait("a dead writer's endpoint leaves the view", func() bool { ok, _ := present(); return !ok })
}

// TestRegistryViewRecordsStaySorted applies random batches (adds, updates, held and confirmed
// deletions, across services and clusters) and checks after each that Records returns exactly
// the view's endpoints, ordered by service, cluster and pod UID (what model.New expects, so it
// need not sort), whether Records merged the changes or re-sorted everything.
func TestRegistryViewRecordsStaySorted(t *testing.T) {
	v := newRegistryView(slog.New(slog.DiscardHandler), 0, func() {})
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string]string{} // key -> address
	for round := 0; round < 300; round++ {
		var evs []registry.Event[*registryv1.ServiceEndpoint]
		n := 1 + rng.IntN(3)
		if round%50 == 0 {
			n = 200 // a large batch: Records re-sorts everything
		}
		for i := 0; i < n; i++ {
			svc, cluster, uid := fmt.Sprintf("svc-%d", rng.IntN(5)), fmt.Sprintf("c%d", rng.IntN(3)), fmt.Sprintf("pod-%d", rng.IntN(40))
			key := cluster + "/" + svc + "/" + uid
			typ, addr := registry.Added, fmt.Sprintf("10.0.%d.%d", round%200, i%200)
			if _, ok := want[key]; ok && rng.IntN(3) == 0 {
				typ = registry.Deleted
			}
			ep := heldTestEndpoint(uid)
			ep.Service.Name, ep.Addresses = svc, []string{addr}
			evs = append(evs, registry.Event[*registryv1.ServiceEndpoint]{Type: typ, Record: registry.Record[*registryv1.ServiceEndpoint]{
				Key: key, Origin: registry.Origin{Region: "eu", Cluster: cluster}, Value: ep}})
			if typ == registry.Deleted {
				delete(want, key)
			} else {
				want[key] = addr
			}
		}
		v.mu.Lock()
		v.applyEndpoints(registry.Batch[*registryv1.ServiceEndpoint]{Events: evs}, time.Now())
		v.cacheOK = false
		v.mu.Unlock()
		after := time.Now().Add(time.Second)
		v.confirmDeletions(after, after, nil)
		eps, _ := v.Records()
		got := map[string]string{}
		for i, e := range eps {
			got[e.Cluster+"/"+e.Service.Name+"/"+e.PodUID] = e.IPs[0].String()
			if i > 0 {
				p := eps[i-1]
				if c := cmp.Or(p.Service.Compare(e.Service), strings.Compare(p.Cluster, e.Cluster), strings.Compare(p.PodUID, e.PodUID)); c >= 0 {
					t.Fatalf("round %d: Records out of order at %d: %v/%s/%s then %v/%s/%s", round, i, p.Service, p.Cluster, p.PodUID, e.Service, e.Cluster, e.PodUID)
				}
			}
		}
		if !maps.Equal(got, want) {
			t.Fatalf("round %d: Records = %v, want %v", round, got, want)
		}
	}
}

// TestSeenSet: an item is reported the first time it appears, not while it stays, and again
// after it went away and came back; a duplicate within one model is reported once.
func TestSeenSet(t *testing.T) {
	var s seenSet
	steps := []struct {
		items []string
		fresh []int
	}{
		{[]string{"a", "b"}, []int{0, 1}},
		{[]string{"b", "a"}, nil},
		{[]string{"a", "c", "c"}, []int{1}},
		{[]string{"a"}, nil},
		{[]string{"c", "a"}, []int{0}},
		{nil, nil},
	}
	for i, st := range steps {
		got := s.update(len(st.items), func(i int) string { return st.items[i] })
		if !slices.Equal(got, st.fresh) {
			t.Errorf("step %d %v: fresh %v, want %v", i, st.items, got, st.fresh)
		}
	}
}
