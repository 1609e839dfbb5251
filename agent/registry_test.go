package agent

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
	"github.com/aethermesh/aether/registry"
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
				SpiffeId: "spiffe://aether.internal/ns/shop/sa/web", Kubernetes: &registryv1.KubernetesMetadata{PodUid: key}}}
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
	v.trustDomains = []string{"aether.internal", "beta.example"}
	foreign := ev(registry.Added, "foreign", "10.0.0.3")
	foreign.Record.Value.SpiffeId = "spiffe://other.example/ns/shop/sa/web"
	peer := ev(registry.Added, "peer", "10.0.0.4")
	peer.Record.Value.SpiffeId = "spiffe://beta.example/ns/shop/sa/web"
	apply(ev(registry.Added, "p1", "10.0.0.1"), ev(registry.Added, "p2", "10.0.0.2"), ev(registry.Added, "bad", "not-an-ip"), foreign, peer)
	if got := addrs(); len(got) != 3 || got["p1"] != "10.0.0.1" || got["p2"] != "10.0.0.2" || got["peer"] != "10.0.0.4" {
		t.Fatalf("after snapshot: %v, want p1, p2 and the clusterset peer's (the bad record and the other trust domain's skipped)", got)
	}
	apply(ev(registry.Deleted, "peer", ""))
	after0 := time.Now().Add(time.Second)
	v.confirmDeletions(after0, after0, nil)
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

// keepAliveAt is a lease keepalive state of a registry view test, in seconds after t0: the
// lease was last answered at answered, and the last missed stretch ended at missed (0: none);
// revoked: the lease is gone (registry.Registry.RevokeEndpoints), the missed stretch is kept.
type keepAliveAt struct {
	answered, missed float64
	revoked          bool
}

// testKeepAlivePeriod is the keepalive period of the view tests' lease (as for a 15 s TTL).
const testKeepAlivePeriod = 6 * time.Second

// fakeKeepAlive returns a registryView.keepAlive that reports *state at t0 as
// registry.KeepAliveStatus would (nil state: no lease).
func fakeKeepAlive(t0 time.Time, state **keepAliveAt) func(time.Time) registry.KeepAliveStatus {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	return func(now time.Time) registry.KeepAliveStatus {
		k := *state
		if k == nil {
			return registry.KeepAliveStatus{}
		}
		s := registry.KeepAliveStatus{Lease: 1, Answered: at(k.answered), Period: testKeepAlivePeriod}
		if k.missed != 0 {
			s.Missed = at(k.missed)
		}
		if k.revoked {
			return registry.KeepAliveStatus{Missed: s.Missed}
		}
		if now.Sub(s.Answered) > s.Period {
			s.Missing, s.Missed = true, now
		}
		return s
	}
}

// TestRegistryViewHoldsDeletions drives the view's deletion hold with explicit read times and
// lease keepalive states: a deletion leaves the view only after a successful read that started
// after it arrived, and never within the hold after a failed read or a missed keepalive (also
// while one is overdue, however the reads go); a re-registration cancels a held deletion.
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
		ka     *keepAliveAt                                  // the lease's keepalives from now on (nil: unchanged)
		read   *[2]float64                                   // a read from [0] to [1] ...
		err    error                                         // ... with this result
		t      float64
		want   int // endpoints in the view after the step
		reason string
	}
	unreachable := errors.New("context deadline exceeded")
	cases := []struct {
		name  string
		lease *keepAliveAt // the lease's keepalives at the start (nil: no lease)
		steps []step
	}{
		{"healthy registry, no lease: deletion applied after the next read", nil, []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1), rec("u2", 2)}, want: 2},
			{t: 1, batch: []registry.Event[*registryv1.ServiceEndpoint]{del("u1", 3)}, want: 2, reason: "held until a read confirms it"},
			{read: &[2]float64{0.5, 1.5}, want: 2, reason: "the read started before the deletion arrived"},
			{read: &[2]float64{2, 2.1}, want: 1, reason: "a read after the deletion succeeded"},
		}},
		{"registry cut, no lease: deletions held through the cut and the hold after it", nil, []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1), rec("u2", 2)}, want: 2},
			{read: &[2]float64{1, 3}, err: unreachable, want: 2},
			{t: 4, batch: []registry.Event[*registryv1.ServiceEndpoint]{del("u1", 3), del("u2", 3)}, want: 2, reason: "lease expiry seen through a one-way cut"},
			{read: &[2]float64{5, 7}, err: unreachable, want: 2},
			{read: &[2]float64{12, 12.1}, want: 2, reason: "reachable again, but within the hold after the last failure (7s)"},
			{t: 13, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 4)}, want: 2, reason: "u1's writer re-registered"},
			{read: &[2]float64{17.5, 17.6}, want: 1, reason: "hold over: u2 never came back (its node died during the cut)"},
		}},
		{"deletion of an unknown endpoint is ignored", nil, []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1), del("u9", 2)}, want: 1},
			{read: &[2]float64{1, 1.1}, want: 1},
		}},
		{"keepalives answered: an on-demand read confirms a held deletion", &keepAliveAt{answered: 0}, []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1), rec("u2", 2)}, want: 2},
			{t: 1, batch: []registry.Event[*registryv1.ServiceEndpoint]{del("u1", 3)}, want: 2, reason: "held until a read confirms it"},
			{read: &[2]float64{0.5, 1.5}, want: 2, reason: "the read started before the deletion arrived"},
			{ka: &keepAliveAt{answered: 5}, read: &[2]float64{5.2, 5.3}, want: 1, reason: "a read after the deletion succeeded, keepalives answered"},
		}},
		{"keepalive overdue: deletions held whatever the reads say, then for the hold after the gap", &keepAliveAt{answered: 0}, []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1), rec("u2", 2)}, want: 2},
			{t: 7, batch: []registry.Event[*registryv1.ServiceEndpoint]{del("u1", 3), del("u2", 3)}, want: 2, reason: "lease expiry seen while the keepalive is overdue (since 6s)"},
			{read: &[2]float64{7.5, 7.6}, want: 2, reason: "the read succeeded, but the keepalive is still overdue"},
			{ka: &keepAliveAt{answered: 9, missed: 9}, read: &[2]float64{10, 10.1}, want: 2, reason: "answered again at 9s: within the hold after the gap"},
			{t: 11, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 4)}, want: 2, reason: "u1's writer re-registered"},
			{ka: &keepAliveAt{answered: 15, missed: 9}, read: &[2]float64{18.8, 18.9}, want: 2, reason: "hold not over (10s after 9s)"},
			{read: &[2]float64{19.1, 19.2}, want: 1, reason: "hold over: u2 never came back"},
		}},
		{"keepalive missed before the deletion arrived, every read succeeded: held for the hold", &keepAliveAt{answered: 0}, []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1)}, want: 1},
			{read: &[2]float64{1, 1.1}, want: 1},
			{ka: &keepAliveAt{answered: 8, missed: 8}, t: 8.5, batch: []registry.Event[*registryv1.ServiceEndpoint]{del("u1", 2)}, want: 1,
				reason: "deletion arrives after a keepalive gap (0s to 8s) the reads did not see"},
			{read: &[2]float64{9, 9.1}, want: 1, reason: "within the hold after the gap"},
			{ka: &keepAliveAt{answered: 17, missed: 8}, read: &[2]float64{18, 18.1}, want: 0, reason: "hold over, keepalives answered"},
		}},
		{"lease revoked: a missed keepalive still counts for the hold", &keepAliveAt{missed: 4, revoked: true}, []step{
			{t: 0, batch: []registry.Event[*registryv1.ServiceEndpoint]{rec("u1", 1)}, want: 1},
			{t: 5, batch: []registry.Event[*registryv1.ServiceEndpoint]{del("u1", 2)}, want: 1},
			{read: &[2]float64{6, 6.1}, want: 1, reason: "within the hold after the gap that ended at 4s"},
			{read: &[2]float64{14.5, 14.6}, want: 0, reason: "hold over"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := newRegistryView(slog.New(slog.DiscardHandler), hold, func() {})
			ka := tc.lease
			v.keepAlive = fakeKeepAlive(t0, &ka)
			for i, s := range tc.steps {
				if s.ka != nil {
					ka = s.ka
				}
				if s.batch != nil {
					v.mu.Lock()
					v.applyEndpoints(registry.Batch[*registryv1.ServiceEndpoint]{Events: s.batch}, at(s.t))
					v.cacheOK = false
					v.mu.Unlock()
				}
				if s.read != nil {
					v.confirmDeletions(at(s.read[0]), at(s.read[1]), s.err)
				}
				if eps, _ := v.Records(); len(eps) != s.want {
					t.Fatalf("step %d (%s): %d endpoints in the view, want %d", i, s.reason, len(eps), s.want)
				}
			}
		})
	}
}

// TestRegistryViewReadDue: when the view reads the registry. With a lease and nothing deleted,
// never (the keepalives are its round trips); without a lease, every interval; with a deletion
// held, at once (at most one read per gap), or once the hold after the last failed read or
// missed keepalive has passed.
func TestRegistryViewReadDue(t *testing.T) {
	const hold = 10 * time.Second
	tm := readTiming{interval: 5 * time.Second, timeout: 2 * time.Second, gap: time.Second}
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	now := 20.0
	cases := []struct {
		name      string
		ka        *keepAliveAt // nil: no lease
		readStart float64      // 0: never read
		failed    float64      // end of the last failed read (0: none)
		held      bool         // a deletion is held
		want      float64      // -1: no read due; else due at (<= now: at once)
	}{
		{"lease held, nothing deleted: no read", &keepAliveAt{answered: 18}, 10, 0, false, -1},
		{"lease held, never read: no read", &keepAliveAt{answered: 18}, 0, 0, false, -1},
		{"lease held, keepalive overdue, nothing deleted: no read", &keepAliveAt{answered: 1}, 10, 0, false, -1},
		{"no lease, never read: at once", nil, 0, 0, false, now},
		{"no lease: an interval after the last read", nil, 18, 0, false, 23},
		{"no lease, after a failed read: an interval after it", nil, 18, 19, false, 23},
		{"deletion held, lease held: at once", &keepAliveAt{answered: 18}, 10, 0, true, now},
		{"deletion held right after a read: a gap after it", &keepAliveAt{answered: 18}, 19.5, 0, true, 20.5},
		{"deletion held, read failed: when the hold after it ends", &keepAliveAt{answered: 18}, 15, 17, true, 27},
		{"deletion held, keepalive missed: when the hold after the gap ends", &keepAliveAt{answered: 18, missed: 14}, 10, 0, true, 24},
		{"deletion held, keepalive overdue now: not before the hold from now", &keepAliveAt{answered: 10, missed: 3}, 10, 0, true, now + 10},
		{"deletion held, old failures: at once", &keepAliveAt{answered: 18, missed: 5}, 8, 9, true, now},
		{"deletion held, no lease, read failed: the interval read comes first", nil, 18, 19, true, 23},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := newRegistryView(slog.New(slog.DiscardHandler), hold, func() {})
			ka := tc.ka
			v.keepAlive = fakeKeepAlive(t0, &ka)
			if tc.readStart != 0 {
				v.readStart = at(tc.readStart)
			}
			if tc.failed != 0 {
				v.failed = at(tc.failed)
			}
			if tc.held {
				v.pending["k/u1"] = at(tc.readStart + 0.1)
			}
			got := v.nextRead(at(now), tm)
			switch {
			case tc.want < 0 && !got.IsZero():
				t.Fatalf("read due at %v, want none", got.Sub(t0))
			case tc.want >= 0 && got.IsZero():
				t.Fatalf("no read due, want one at %vs", tc.want)
			case tc.want == now && got.After(at(now)):
				t.Fatalf("read due at %v, want at once (%vs)", got.Sub(t0), now)
			case tc.want >= 0 && tc.want != now && !got.Equal(at(tc.want)):
				t.Fatalf("read due at %v, want %vs", got.Sub(t0), tc.want)
			}
		})
	}
}

// TestRegistryViewHealth: the registry readiness part follows the newest evidence: with a
// lease, an overdue keepalive fails it and an answer newer than a failed read passes it;
// without a lease, the last read.
func TestRegistryViewHealth(t *testing.T) {
	now := time.Now()
	ago := func(s float64) time.Time { return now.Add(-time.Duration(s * float64(time.Second))) }
	failed := errors.New("registry unreachable: context deadline exceeded")
	cases := []struct {
		name    string
		lease   bool
		answer  float64 // seconds ago
		readAgo float64 // seconds ago (0: never read)
		readErr error
		wantErr string
	}{
		{"no lease, never read", false, 0, 0, nil, "not read yet"},
		{"no lease, last read succeeded", false, 0, 2, nil, ""},
		{"no lease, last read failed", false, 0, 2, failed, "context deadline exceeded"},
		{"lease answered, never read", true, 1, 0, nil, ""},
		{"lease answered after a failed read", true, 1, 3, failed, ""},
		{"read failed after the last answer", true, 3, 1, failed, "context deadline exceeded"},
		{"keepalive overdue, reads succeed", true, 10, 1, nil, "no answer to this node's lease keepalive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := newRegistryView(slog.New(slog.DiscardHandler), time.Minute, func() {})
			v.keepAlive = func(at time.Time) registry.KeepAliveStatus {
				if !tc.lease {
					return registry.KeepAliveStatus{}
				}
				s := registry.KeepAliveStatus{Lease: 1, Answered: ago(tc.answer), Period: testKeepAlivePeriod}
				s.Missing = at.Sub(s.Answered) > s.Period
				return s
			}
			if tc.readAgo != 0 {
				v.confirmDeletions(ago(tc.readAgo+0.1), ago(tc.readAgo), tc.readErr)
			}
			err := v.health(context.Background())
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("health = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestRegistryViewKeepsEndpointsThroughRegistryCut cuts a writer and a reader off a real etcd
// until the writer's lease expires and the reader noticed its cut, then restores the reader
// first: the reader's resumed watch delivers the lease-expiry deletion, which must not empty the
// view (it did before the hold: every cluster's EDS went empty during and after a registry
// cut). The writer comes back and re-registers; the endpoint never left the view. Then the
// writer dies for good: its endpoint leaves the view once its lease expired and the hold
// passed. The reader runs as the agent wires it (followRegistry), once without a lease of its
// own (it notices the cut by its reads, every TTL/3) and once holding one (by its missed
// keepalives; it sends no periodic read).
func TestRegistryViewKeepsEndpointsThroughRegistryCut(t *testing.T) {
	for _, withLease := range []bool{false, true} {
		name := "reader without a lease"
		if withLease {
			name = "reader holding a lease"
		}
		t.Run(name, func(t *testing.T) { testRegistryCut(t, withLease) })
	}
}

func testRegistryCut(t *testing.T, readerLease bool) {
	const ttl = 2 * time.Second
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	target := strings.TrimPrefix(etcd.Endpoints[0], "http://")
	pw, pr := testenv.NewCutProxy(t, target), testenv.NewCutProxy(t, target)
	log := slog.New(slog.DiscardHandler)
	newReg := func(url, cluster string) *registry.Registry {
		r, err := registry.New(registry.Config{Endpoints: []string{url}, Region: cluster, Cluster: cluster,
			LeaseTTL: ttl, Logger: log})
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
	ep := heldTestEndpoint("u1")
	key := registry.Origin{Region: "beta", Cluster: "beta"}.EndpointKey("shop", "remote", "u1")

	// Whether the writer's endpoint is in the view after every change; gap records that it
	// left once it had been there.
	var mu sync.Mutex
	seen, gap := false, false
	var view *registryView
	view = newRegistryView(log, 10*time.Second, func() {
		eps, _ := view.Records()
		in := slices.ContainsFunc(eps, func(e model.Endpoint) bool { return e.Cluster == "beta" && e.PodUID == "u1" })
		mu.Lock()
		defer mu.Unlock()
		if in {
			seen = true
		} else if seen {
			gap = true
		}
	})
	followRegistry(ctx, view, reader, ttl)
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
	if readerLease {
		own := heldTestEndpoint("own")
		own.Kubernetes.NodeName, own.Kubernetes.NodeIp = "alpha-node1", "172.30.1.11"
		if err := reader.RegisterEndpoint(ctx, own); err != nil {
			t.Fatal(err)
		}
	}
	if err := writer.RegisterEndpoint(ctx, ep); err != nil {
		t.Fatal(err)
	}
	// present: the endpoint is in the view; held: its deletion is held.
	present := func() (ok, held bool) {
		view.mu.Lock()
		defer view.mu.Unlock()
		_, ok = view.eps[key]
		_, held = view.pending[key]
		return ok, held
	}
	wait("the reader sees the endpoint", func() bool { ok, _ := present(); return ok })
	wait("the registry healthy for the reader", func() bool { return view.health(ctx) == nil })
	if got := reader.KeepAliveStatus(time.Now()).Lease != 0; got != readerLease {
		t.Fatalf("reader holds a lease: %v, want %v", got, readerLease)
	}
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
	// A cut long enough to expire a lease is one the reader notices (its read fails, or its
	// keepalive is overdue): wait for that, as with a real TTL it comes first.
	wait("the reader notices its cut", func() bool { return view.health(ctx) != nil })
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
	wait("the registry healthy for the reader again", func() bool { return view.health(ctx) == nil })
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

// TestAgentRegistryIdleReads counts the etcd range requests of one agent's registry view, wired
// as Run wires it (followRegistry, the default --registry-lease-ttl and its hold), through a
// counting interceptor on its etcd client: first over an idle time (AETHER_REGISTRY_IDLE,
// default 10s), then while another cluster deregisters an endpoint three times. Holding a lease
// (an endpoint of its own registered), the agent sends no read while idle, and one at most per
// held deletion, which confirms it (the endpoint leaves the view). Without a lease it reads
// every TTL/3 (5 s), deletions included. Before, every agent read once a second whatever
// happened: 1000 nodes sent the registry 1000 linearizable reads a second.
func TestAgentRegistryIdleReads(t *testing.T) {
	idle := idleFromEnv(t, "AETHER_REGISTRY_IDLE")
	const ttl = 15 * time.Second // --registry-lease-ttl's default
	const deletions = 3
	for _, lease := range []bool{true, false} {
		name := "lease held"
		if !lease {
			name = "no lease"
		}
		t.Run(name, func(t *testing.T) {
			etcd := testenv.StartEmbeddedEtcd(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), idle+3*time.Minute)
			defer cancel()
			log := slog.New(slog.DiscardHandler)
			cli, counter := countingClient(t, etcd.Endpoints)
			reg, err := registry.NewWithClient(cli, registry.Config{Region: "eu", Cluster: "east", LeaseTTL: ttl, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			other, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: "west", LeaseTTL: ttl, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			view := newRegistryView(log, 2*ttl, func() {})
			followRegistry(ctx, view, reg, ttl)
			if lease {
				if err := reg.RegisterEndpoint(ctx, heldTestEndpoint("own")); err != nil {
					t.Fatal(err)
				}
			}
			westKey := func(uid string) string { return other.Origin().EndpointKey("shop", "remote", uid) }
			inView := func(uid string, want bool) func() error {
				return func() error {
					view.mu.Lock()
					defer view.mu.Unlock()
					if _, ok := view.eps[westKey(uid)]; ok != want {
						return fmt.Errorf("%s in the view: %v, want %v", westKey(uid), ok, want)
					}
					return nil
				}
			}
			for i := range deletions {
				if err := other.RegisterEndpoint(ctx, heldTestEndpoint(fmt.Sprint("w", i))); err != nil {
					t.Fatal(err)
				}
				testenv.Eventually(t, 30*time.Second, "the other cluster's endpoint in the view", inView(fmt.Sprint("w", i), true))
			}
			testenv.Eventually(t, 30*time.Second, "registry healthy", func() error { return view.health(ctx) })
			// count returns the range requests sent while phase ran, and how long it took.
			count := func(phase func()) (int, time.Duration) {
				start, begin := counter.snapshot()[rangeMethod], time.Now()
				phase()
				return counter.snapshot()[rangeMethod] - start, time.Since(begin)
			}
			// periodic is the most reads an agent without a lease sends in d.
			periodic := func(d time.Duration) int {
				if lease {
					return 0
				}
				return int(d/(ttl/3)) + 1
			}

			idleReads, idleTook := count(func() { time.Sleep(idle) })
			t.Logf("idle agent (%s) over %s: %d etcd range requests (%.2f/s); the 1 s probe sent about %d",
				name, idleTook.Round(time.Millisecond), idleReads, float64(idleReads)/idleTook.Seconds(), int(idleTook/time.Second))
			if idleReads > periodic(idleTook) {
				t.Errorf("idle agent (%s): %d range requests in %s, want at most %d", name, idleReads, idleTook, periodic(idleTook))
			}

			delReads, delTook := count(func() {
				for i := range deletions {
					if err := other.DeregisterEndpoint(ctx, "shop", "remote", fmt.Sprint("w", i)); err != nil {
						t.Fatal(err)
					}
					testenv.Eventually(t, 30*time.Second, "the deregistered endpoint leaves the view", inView(fmt.Sprint("w", i), false))
				}
			})
			t.Logf("agent (%s) confirming %d deletions over %s: %d etcd range requests", name, deletions, delTook.Round(time.Millisecond), delReads)
			if delReads > deletions+periodic(delTook) {
				t.Errorf("agent (%s): %d range requests for %d deletions in %s, want at most %d", name, delReads, deletions, delTook, deletions+periodic(delTook))
			}
			if err := view.health(ctx); err != nil {
				t.Fatalf("registry unhealthy after the idle time: %v", err)
			}
		})
	}
}
