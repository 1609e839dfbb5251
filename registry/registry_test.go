package registry

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// Two clusters writing to one etcd see each other's endpoints with the right origin; identical
// pod IPs coexist (the key holds the pod UID); a value claiming a foreign origin is stamped with
// its key's origin.
func TestTwoClustersShareOneEtcd(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", nil)
	b := newTestRegistry(t, etcd.Endpoints, "us", "beta", nil)
	ctx := ctxT(t, converge)

	if err := a.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "uid-a", "10.244.1.5")); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "uid-b", "10.244.1.5")); err != nil {
		t.Fatal(err)
	}
	// A value under alpha's prefix that claims to come from beta in another region.
	forged := testEndpoint("shop", "cart", "uid-forged", "10.244.1.9")
	forged.ClusterName, forged.Region = "beta", "us"
	forged.Service = &registryv1.ServiceRef{Namespace: "other", Name: "thing"}
	raw, _ := proto.Marshal(forged)
	forgedKey := a.Origin().EndpointKey("shop", "cart", "uid-forged")
	if _, err := a.Client().Put(ctx, forgedKey, string(raw)); err != nil {
		t.Fatal(err)
	}

	for _, r := range []*Registry{a, b} {
		recs, _, err := r.ListEndpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]Origin{}
		for _, rec := range recs {
			got[rec.Value.Kubernetes.PodUid] = rec.Origin
			if rec.Value.ClusterName != rec.Origin.Cluster || rec.Value.Region != rec.Origin.Region {
				t.Errorf("%s: value origin %s/%s differs from key origin %s", rec.Key, rec.Value.Region, rec.Value.ClusterName, rec.Origin)
			}
			if rec.Value.Service.Namespace != "shop" || rec.Value.Service.Name != "cart" {
				t.Errorf("%s: service %v not taken from the key", rec.Key, rec.Value.Service)
			}
		}
		want := map[string]Origin{"uid-a": {"eu", "alpha"}, "uid-b": {"us", "beta"}, "uid-forged": {"eu", "alpha"}}
		if len(got) != len(want) {
			t.Fatalf("%s lists %v, want %v", r.Origin(), got, want)
		}
		for uid, o := range want {
			if got[uid] != o {
				t.Errorf("%s: endpoint %s has origin %v, want %v", r.Origin(), uid, got[uid], o)
			}
		}
	}

	// The model conversion keeps the key's origin.
	recs, _, err := b.ListEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if rec.Value.Kubernetes.PodUid != "uid-forged" {
			continue
		}
		m, err := ToModelEndpoint(rec)
		if err != nil {
			t.Fatal(err)
		}
		want := model.Endpoint{
			Service: model.ServiceKey{Namespace: "shop", Name: "cart"}, Cluster: "alpha", Region: "eu", Zone: "zone-1",
			PodName: "cart-uid-forged", PodUID: "uid-forged", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.9")},
			NodeName: "node-1", NodeIP: netip.MustParseAddr("192.0.2.10"),
			Ports:    []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolHTTP}, {Name: "db", Port: 5432, Protocol: model.ProtocolTCP}},
			SPIFFEID: "spiffe://aether.internal/ns/shop/sa/default", Healthy: true,
		}
		if !reflect.DeepEqual(m, want) {
			t.Fatalf("ToModelEndpoint = %+v\nwant %+v", m, want)
		}
	}
}

// The client refuses every write outside its own prefix and every invalid record, naming the
// field.
func TestWriterRefusesForeignOriginAndInvalidRecords(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", nil)
	ctx := ctxT(t, converge)

	foreignCluster := testEndpoint("shop", "cart", "uid-1", "10.0.0.1")
	foreignCluster.ClusterName = "beta"
	foreignRegion := testEndpoint("shop", "cart", "uid-1", "10.0.0.1")
	foreignRegion.Region = "us"
	foreignExport := testExport()
	foreignExport.ClusterName = "beta"
	foreignConfig := testConfig()
	foreignConfig.OriginCluster = "beta"
	for name, err := range map[string]error{
		"endpoint cluster": a.RegisterEndpoint(ctx, foreignCluster),
		"endpoint region":  a.RegisterEndpoint(ctx, foreignRegion),
		"export":           a.Export(ctx, foreignExport),
		"config":           a.PutConfig(ctx, foreignConfig),
		"raw put":          a.put(ctx, Origin{"eu", "beta"}.ExportKey("shop", "cart"), testExport()),
		"raw delete":       a.del(ctx, Origin{"us", "alpha"}.ExportKey("shop", "cart")),
	} {
		if !errors.Is(err, ErrOutsidePrefix) {
			t.Errorf("%s: error = %v, want ErrOutsidePrefix", name, err)
		}
	}

	bad := testEndpoint("shop", "cart", "uid-1", "10.0.0.1")
	bad.Ports[0].Port = 0
	var ve *ValidationError
	if err := a.RegisterEndpoint(ctx, bad); !errors.As(err, &ve) || ve.Field != "ports[0].port" {
		t.Errorf("invalid endpoint: error = %v, want a ValidationError for ports[0].port", err)
	}
	badCfg := testConfig()
	badCfg.Routes[0].Rules[0].Backends[0].Weight = 2000000
	if err := a.PutConfig(ctx, badCfg); !errors.As(err, &ve) || ve.Field != "routes[0].rules[0].backends[0].weight" {
		t.Errorf("invalid config: error = %v, want a ValidationError for the weight", err)
	}
	resp, err := a.Client().Get(ctx, Root, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("refused writes left %d keys in the store", resp.Count)
	}
}

// A record over a list limit (MaxEndpointPorts, MaxEndpointAddresses, MaxExportPorts) is refused
// with an error naming the field and the count, and the record already stored under its key is
// left as it was: in etcd, and (for an endpoint) among the records re-registered after a lost
// lease.
func TestOversizedRecordRefusedKeepsStored(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", nil)
	ctx := ctxT(t, converge)
	ep := testEndpoint("shop", "cart", "uid-1", "10.0.0.1")
	if err := a.RegisterEndpoint(ctx, ep); err != nil {
		t.Fatal(err)
	}
	x := testExport()
	if err := a.Export(ctx, x); err != nil {
		t.Fatal(err)
	}
	stored := func() map[string][]byte {
		resp, err := a.Client().Get(ctx, Root, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]byte{}
		for _, kv := range resp.Kvs {
			out[string(kv.Key)] = kv.Value
		}
		return out
	}
	before := stored()
	desiredBefore := len(a.desired)

	morePorts := proto.Clone(ep).(*registryv1.ServiceEndpoint)
	morePorts.Ports = manyEndpointPorts(MaxEndpointPorts + 1)
	moreAddrs := proto.Clone(ep).(*registryv1.ServiceEndpoint)
	moreAddrs.Addresses = manyAddresses(MaxEndpointAddresses + 1)
	moreExport := proto.Clone(x).(*registryv1.ExportMark)
	moreExport.Ports = manyServicePorts(MaxExportPorts + 1)
	for _, tc := range []struct {
		name, field, count string
		err                error
	}{
		{"endpoint ports", "ports", "101 items", a.RegisterEndpoint(ctx, morePorts)},
		{"endpoint addresses", "addresses", "101 items", a.RegisterEndpoint(ctx, moreAddrs)},
		{"export ports", "ports", "101 items", a.Export(ctx, moreExport)},
	} {
		var ve *ValidationError
		if !errors.As(tc.err, &ve) || ve.Field != tc.field || ve.Value != tc.count {
			t.Errorf("%s: error = %v, want a ValidationError for %s with value %q", tc.name, tc.err, tc.field, tc.count)
		}
	}
	if after := stored(); !reflect.DeepEqual(after, before) {
		t.Errorf("refused writes changed the store:\nbefore %d keys\nafter  %d keys", len(before), len(after))
	}
	if len(a.desired) != desiredBefore {
		t.Errorf("refused writes changed the endpoints kept registered: %d, want %d", len(a.desired), desiredBefore)
	}
	if got := a.desired[a.origin.EndpointKey("shop", "cart", "uid-1")]; got == nil {
		t.Error("the stored endpoint is no longer kept registered")
	}
}

// Malformed keys and values are skipped, logged and counted; they hide nothing else and never
// stop a reader or watcher. A record that turns bad is delivered as Deleted.
func TestBadDataIsSkippedAndCounted(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	reg := prometheus.NewRegistry()
	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(c *Config) { c.Metrics = reg })
	ctx := ctxT(t, converge)
	cli := a.Client()

	if err := a.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "good-1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	v := startViewer(t, a.WatchEndpoints(ctx))
	good1 := a.Origin().EndpointKey("shop", "cart", "good-1")
	v.waitKeys(t, good1)

	invalid, _ := proto.Marshal(&registryv1.ServiceEndpoint{Addresses: []string{"not-an-ip"}})
	bad := map[string]string{
		Root + "eu/clusters/alpha/endpoints/shop/cart":              "x",             // key: missing uid
		Root + "EU/clusters/alpha/endpoints/shop/cart/u1":           "x",             // key: bad region
		Root + "eu/clusters/alpha/endpoints/shop/cart/garbage":      "\xff\xff\xff",  // value: not protobuf
		Root + "eu/clusters/alpha/endpoints/shop/cart/invalid":      string(invalid), // value: invalid record
		Root + "eu/clusters/alpha/config/%%%":                       "x",             // key: bad base64
		Root + "eu/clusters/alpha/endpoints/shop/cart/good-2/extra": "x",             // key: extra segment
	}
	for k, val := range bad {
		if _, err := cli.Put(ctx, k, val); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "good-2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	good2 := a.Origin().EndpointKey("shop", "cart", "good-2")
	v.waitKeys(t, good1, good2)

	recs, _, err := a.ListEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Key != good1 || recs[1].Key != good2 {
		t.Fatalf("ListEndpoints returned %d records, want exactly the two good ones", len(recs))
	}
	// Each bad key was skipped by the watcher (events) and by the list: counted at least twice.
	if got := counterValue(t, a.m.badRecords); got < float64(2*len(bad)) {
		t.Fatalf("aether_registry_bad_records_total = %v, want >= %d", got, 2*len(bad))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		found = found || mf.GetName() == "aether_registry_bad_records_total"
	}
	if !found {
		t.Fatal("aether_registry_bad_records_total is not registered")
	}

	// good-1 turns bad: watchers drop it.
	if _, err := cli.Put(ctx, good1, "\x00garbage"); err != nil {
		t.Fatal(err)
	}
	v.waitKeys(t, good2)
	// Other kinds' readers are not disturbed either.
	if exps, _, err := a.ListExports(ctx); err != nil || len(exps) != 0 {
		t.Fatalf("ListExports = %d records, %v; want none", len(exps), err)
	}
}

// Watchers get a snapshot first, then typed add, update and delete events.
func TestWatchSnapshotThenTypedEvents(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", nil)
	ctx := ctxT(t, converge)
	if err := a.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "uid-1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	ch := a.WatchEndpoints(ctx)
	next := func() Batch[*registryv1.ServiceEndpoint] { t.Helper(); return nextBatch(t, ctx, ch) }
	k1 := a.Origin().EndpointKey("shop", "cart", "uid-1")
	k2 := a.Origin().EndpointKey("shop", "cart", "uid-2")
	b := next()
	if !b.Snapshot || len(b.Events) != 1 || b.Events[0].Type != Added || b.Events[0].Key != k1 {
		t.Fatalf("first batch = %+v, want a snapshot with uid-1 added", b)
	}
	if err := a.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "uid-2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	changed := testEndpoint("shop", "cart", "uid-1", "10.0.0.1")
	changed.Health = registryv1.Health_HEALTH_UNHEALTHY
	if err := a.RegisterEndpoint(ctx, changed); err != nil {
		t.Fatal(err)
	}
	if err := a.DeregisterEndpoint(ctx, "shop", "cart", "uid-2"); err != nil {
		t.Fatal(err)
	}
	type ev struct {
		typ EventType
		key string
	}
	var got []ev
	for len(got) < 3 {
		b := next()
		if b.Snapshot || b.Relisted {
			t.Fatalf("unexpected batch flags %+v", b)
		}
		for _, e := range b.Events {
			got = append(got, ev{e.Type, e.Key})
			if e.Type == Updated && e.Value.Health != registryv1.Health_HEALTH_UNHEALTHY {
				t.Errorf("update carries health %v", e.Value.Health)
			}
			if e.Type == Deleted && e.Value.Kubernetes.PodUid != "uid-2" {
				t.Errorf("delete carries the last value %v", e.Value)
			}
		}
	}
	want := []ev{{Added, k2}, {Updated, k1}, {Deleted, k2}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events = %v, want %v", got, want)
		}
	}
}

// Exports and config projections: write, list the clusterset-wide view, watch, delete.
func TestExportsAndConfigProjections(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", nil)
	b := newTestRegistry(t, etcd.Endpoints, "eu", "beta", nil)
	ctx := ctxT(t, converge)

	cfgView := startViewer(t, b.WatchConfigs(ctx))
	expView := startViewer(t, b.WatchExports(ctx))
	m := testExport()
	m.CreateTime = ""
	if err := a.Export(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := b.Export(ctx, testExport()); err != nil {
		t.Fatal(err)
	}
	exps, _, err := a.ListExports(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(exps) != 2 || exps[0].Origin.Cluster != "alpha" || exps[1].Origin.Cluster != "beta" {
		t.Fatalf("ListExports = %v, want alpha's and beta's marks", exps)
	}
	if _, err := time.Parse(time.RFC3339Nano, exps[0].Value.CreateTime); err != nil {
		t.Fatalf("create_time not filled: %v", err)
	}
	expView.waitKeys(t, a.Origin().ExportKey("shop", "cart"), b.Origin().ExportKey("shop", "cart"))

	c := testConfig()
	if err := a.PutConfig(ctx, c); err != nil {
		t.Fatal(err)
	}
	key := a.Origin().ConfigKey("shop", "cart")
	cfgView.waitKeys(t, key)
	got, _ := cfgView.get(key)
	c.OriginCluster, c.OriginRegion = "alpha", "eu"
	if !proto.Equal(got.Value, c) {
		t.Fatalf("watched projection differs:\n got %v\nwant %v", got.Value, c)
	}
	cfgs, _, err := b.ListConfigs(ctx)
	if err != nil || len(cfgs) != 1 || !proto.Equal(cfgs[0].Value, c) {
		t.Fatalf("ListConfigs = %v, %v", cfgs, err)
	}

	if err := a.DeleteConfig(ctx, "shop", "cart"); err != nil {
		t.Fatal(err)
	}
	if err := a.Unexport(ctx, "shop", "cart"); err != nil {
		t.Fatal(err)
	}
	cfgView.waitKeys(t)
	expView.waitKeys(t, b.Origin().ExportKey("shop", "cart"))
}

// A batch lists the keys of its kind that hold a bad value (Invalid): the snapshot every such
// key in the store, a later batch those written bad, including a valid record that turns bad
// (also delivered as Deleted), and the deletion of such a key; keys that do not parse are not
// listed (they have no origin).
func TestWatchListsInvalidRecords(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", nil)
	ctx := ctxT(t, converge)
	cli := a.Client()
	cfg := testConfig()
	if err := a.PutConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	good := a.Origin().ConfigKey("shop", "cart")
	zeroVersion := proto.Clone(cfg).(*registryv1.ServiceConfigProjection)
	zeroVersion.Version = 0
	invalid, _ := proto.Marshal(zeroVersion)
	bad := a.Origin().ConfigKey("shop", "web")
	if _, err := cli.Put(ctx, bad, string(invalid)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, Root+"eu/clusters/alpha/config/%%%", "x"); err != nil {
		t.Fatal(err)
	}
	ch := a.WatchConfigs(ctx)
	next := func() Batch[*registryv1.ServiceConfigProjection] { t.Helper(); return nextBatch(t, ctx, ch) }
	b := next()
	if !b.Snapshot || len(b.Events) != 1 || b.Events[0].Key != good || len(b.Invalid) != 1 {
		t.Fatalf("snapshot: %d events, invalid %+v; want cart added and web invalid", len(b.Events), b.Invalid)
	}
	if iv := b.Invalid[0]; iv.Key != bad || iv.Origin != a.Origin() || iv.Namespace != "shop" || iv.Service != "web" ||
		iv.Value == nil || iv.Value.GetService().GetName() != "web" || iv.Err == nil || !strings.Contains(iv.Err.Error(), "version") {
		t.Errorf("invalid record %+v, want web's key, origin, decoded value and a version error", iv)
	}
	// cart turns bad (garbage: no value decoded): Deleted, and listed as invalid.
	if _, err := cli.Put(ctx, good, "\xff\xff\xff"); err != nil {
		t.Fatal(err)
	}
	b = next()
	if len(b.Events) != 1 || b.Events[0].Type != Deleted || b.Events[0].Key != good ||
		len(b.Invalid) != 1 || b.Invalid[0].Key != good || b.Invalid[0].Value != nil {
		t.Fatalf("cart turned bad: events %+v, invalid %+v; want cart deleted and listed invalid without a value", b.Events, b.Invalid)
	}
	// The bad key is deleted: listed once more, Deleted, with no event (nothing valid was known).
	if _, err := cli.Delete(ctx, good); err != nil {
		t.Fatal(err)
	}
	b = next()
	if len(b.Events) != 0 || len(b.Invalid) != 1 || b.Invalid[0].Key != good || !b.Invalid[0].Deleted {
		t.Fatalf("bad cart deleted: events %+v, invalid %+v; want only cart listed invalid and deleted", b.Events, b.Invalid)
	}
}

// DecodeEndpoint, DecodeExport and DecodeConfig check a stored record as a watch does: the
// key's origin wins over the value's, and a bad value or a key of another kind is refused.
func TestDecodeStoredRecords(t *testing.T) {
	o := Origin{Region: "eu", Cluster: "alpha"}
	cfg := testConfig()
	cfg.OriginCluster = "mallory"
	b, _ := proto.Marshal(cfg)
	rec, err := DecodeConfig(o.ConfigKey("shop", "cart"), b)
	if err != nil || rec.Origin != o || rec.Value.GetOriginCluster() != "alpha" {
		t.Errorf("DecodeConfig = %+v, %v; want origin alpha from the key", rec, err)
	}
	if _, err := DecodeConfig(o.ExportKey("shop", "cart"), b); err == nil || !strings.Contains(err.Error(), "another kind") {
		t.Errorf("DecodeConfig of an export key: %v, want a refusal", err)
	}
	ep, _ := proto.Marshal(testEndpoint("shop", "cart", "u1", "10.0.0.1"))
	if _, err := DecodeEndpoint(o.EndpointKey("shop", "cart", "u1"), ep); err != nil {
		t.Errorf("DecodeEndpoint: %v", err)
	}
	if _, err := DecodeEndpoint(o.EndpointKey("shop", "cart", "u1"), []byte("\xff")); err == nil {
		t.Error("DecodeEndpoint of garbage: no error")
	}
	x, _ := proto.Marshal(&registryv1.ExportMark{CreateTime: "2026-01-01T00:00:00Z", Ports: []*registryv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}}})
	if rec, err := DecodeExport(o.ExportKey("shop", "cart"), x); err != nil || rec.Value.GetService().GetName() != "cart" {
		t.Errorf("DecodeExport = %+v, %v", rec, err)
	}
	// An oversized value is refused by its length, before it is unmarshalled (the bytes need
	// not even be a record).
	if _, err := DecodeConfig(o.ConfigKey("shop", "cart"), make([]byte, MaxConfigBytes+1)); err == nil || !strings.Contains(err.Error(), "want at most") {
		t.Errorf("DecodeConfig of %d bytes: %v, want a refusal by size", MaxConfigBytes+1, err)
	}
}
