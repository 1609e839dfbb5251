package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// testProjection is a projection of ns/svc carrying one producer HTTPRoute, <svc>-canary: requests
// with header x-canary: <header> go to svc's port 80 (in the importing cluster: its clusterset
// endpoints). The export was created at created.
func testProjection(ns, svc string, version uint64, header string, created time.Time) *registryv1.ServiceConfigProjection {
	ref := &registryv1.ServiceRef{Namespace: ns, Name: svc}
	return &registryv1.ServiceConfigProjection{Service: ref, Version: version,
		ExportTime: time.Now().UTC().Format(time.RFC3339Nano), ExportCreateTime: created.UTC().Format(time.RFC3339),
		Routes: []*registryv1.Route{{
			Kind: registryv1.Route_KIND_HTTP, Namespace: ns, Name: svc + "-canary", Generation: 1,
			ParentRefs: []*registryv1.ParentRef{{Kind: registryv1.ParentRef_KIND_SERVICE, Service: ref, Port: 80}},
			Rules: []*registryv1.RouteRule{{
				Matches: []*registryv1.RouteMatch{{
					Path:    &registryv1.PathMatch{Type: registryv1.PathMatch_TYPE_PATH_PREFIX, Value: "/"},
					Headers: []*registryv1.HeaderMatch{{Name: "x-canary", Value: header, Type: registryv1.StringMatchType_STRING_MATCH_TYPE_EXACT}},
				}},
				Backends: []*registryv1.BackendRef{{Kind: registryv1.BackendRef_KIND_SERVICE, Service: ref, Port: 80, Weight: 1}},
			}},
		}},
	}
}

// testLog returns a logger into a buffer the test prints when it fails (the watches' goroutines
// may log after the test ended, which t.Log forbids), and the buffer.
func testLogBuf(t *testing.T) (*slog.Logger, *testenv.Buffer) {
	var buf testenv.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", testenv.Tail(buf.String(), 8000))
		}
	})
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

func testLog(t *testing.T) *slog.Logger {
	l, _ := testLogBuf(t)
	return l
}

// collect returns the metrics c collects.
func collect(t *testing.T, c prometheus.Collector) []*dto.Metric {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	var out []*dto.Metric
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		out = append(out, &d)
	}
	return out
}

// value returns the value of the one counter or gauge c collects.
func value(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ms := collect(t, c)
	if len(ms) != 1 {
		t.Fatalf("%d metrics collected, want 1", len(ms))
	}
	if ms[0].Counter != nil {
		return ms[0].GetCounter().GetValue()
	}
	return ms[0].GetGauge().GetValue()
}

// describe lists projections as "<origin>:<ns>/<svc>@<version>", sorted.
func describe(ps []model.Projection) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s:%s@%d", p.Origin, p.Service, p.Version))
	}
	slices.Sort(out)
	return out
}

// wantProjections waits until c holds exactly want (describe's form).
func wantProjections(t *testing.T, c *configImport, what string, want ...string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what, func() error {
		if got := describe(c.projections()); !slices.Equal(got, want) {
			return fmt.Errorf("projections %q, want %q", got, want)
		}
		return nil
	})
}

// newTestImport returns a config import persisting to dir and its metrics registry.
func newTestImport(t *testing.T, dir string) (*configImport, *importMetrics) {
	m := newImportMetrics(prometheus.NewRegistry(), testLog(t))
	file := newStateFile(dir, configStateFile, "config-projections", "alpha")
	return newConfigImport(testLog(t), "", file, m.errs, func() {}), m
}

// TestConfigImportFollowsRegistry: with a real etcd registry, the projections other clusters
// write reach the import (origin from the key path); a record that does not validate keeps the
// previous good one of its origin and service (logged and counted once per version), a deleted
// one goes (also when it was invalid), a registry cut drops nothing, and every change is
// persisted (0600) and loaded back at start, the live snapshot then replacing what was loaded.
func TestConfigImportFollowsRegistry(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	proxy := testenv.NewCutProxy(t, strings.TrimPrefix(etcd.Endpoints[0], "http://"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	writer := func(cluster string) *registry.Registry {
		r, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: cluster, Logger: testLog(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	beta, gamma := writer("beta"), writer("gamma")
	reader, err := registry.New(registry.Config{Endpoints: []string{proxy.URL()}, Region: "eu", Cluster: "alpha", Logger: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	dir := t.TempDir()
	c, m := newTestImport(t, dir)
	followConfigs(ctx, c, reader)
	created := time.Now().Add(-time.Hour)

	if err := beta.PutConfig(ctx, testProjection("shop", "pay", 1, "beta", created)); err != nil {
		t.Fatal(err)
	}
	if err := gamma.PutConfig(ctx, testProjection("shop", "pay", 1, "gamma", created)); err != nil {
		t.Fatal(err)
	}
	wantProjections(t, c, "both origins' projections", "beta:shop/pay@1", "gamma:shop/pay@1")
	if p := c.projections()[0]; p.Region != "eu" || len(p.Routes) != 1 || p.Routes[0].Name != "pay-canary" {
		t.Errorf("beta's projection %+v, want region eu and route pay-canary", p)
	}
	file := c.file.path
	testenv.Eventually(t, 10*time.Second, "the persisted file", func() error {
		st, err := newStateFile(dir, configStateFile, "config-projections", "alpha").load()
		if err != nil {
			return err
		}
		if len(st.Records) != 2 {
			return fmt.Errorf("%d records, want 2", len(st.Records))
		}
		return nil
	})
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v, want mode 0600", file, fi, err)
	}

	// beta's record turns invalid (version 0), twice: counted and logged once, v1 kept.
	betaKey := beta.Origin().ConfigKey("shop", "pay")
	bad := testProjection("shop", "pay", 0, "beta", created)
	raw, _ := proto.Marshal(bad)
	for range 2 {
		if _, err := beta.Client().Put(ctx, betaKey, string(raw)); err != nil {
			t.Fatal(err)
		}
	}
	wantInvalid := func(what string, n float64) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, what, func() error {
			if got := value(t, m.errs.WithLabelValues(importErrInvalid)); got != n {
				return fmt.Errorf("invalid errors %v, want %v", got, n)
			}
			return nil
		})
	}
	wantInvalid("the invalid record counted", 1)
	wantProjections(t, c, "beta's v1 kept", "beta:shop/pay@1", "gamma:shop/pay@1")
	// A good v2 replaces it; garbage then keeps v2 (counted once more).
	if err := beta.PutConfig(ctx, testProjection("shop", "pay", 2, "beta", created)); err != nil {
		t.Fatal(err)
	}
	wantProjections(t, c, "beta's v2", "beta:shop/pay@2", "gamma:shop/pay@1")
	if _, err := beta.Client().Put(ctx, betaKey, "\xff\xff"); err != nil {
		t.Fatal(err)
	}
	wantInvalid("the garbage counted", 2)
	wantProjections(t, c, "beta's v2 kept", "beta:shop/pay@2", "gamma:shop/pay@1")
	// Deleting the invalid record drops beta's projection.
	if err := beta.DeleteConfig(ctx, "shop", "pay"); err != nil {
		t.Fatal(err)
	}
	wantProjections(t, c, "beta's projection deleted", "gamma:shop/pay@1")
	if got := value(t, m.errs.WithLabelValues(importErrInvalid)); got != 2 {
		t.Errorf("invalid errors %v once the watch delivered the deletion, want 2 (the repeated version 0 counted once)", got)
	}

	// Cut off from the registry: nothing is dropped, while gamma's projection is deleted and
	// beta writes one of cart; once back, the import follows.
	proxy.Cut()
	if err := gamma.DeleteConfig(ctx, "shop", "pay"); err != nil {
		t.Fatal(err)
	}
	if err := beta.PutConfig(ctx, testProjection("shop", "cart", 1, "beta", created)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the watch fails and retries meanwhile
	if got := describe(c.projections()); !slices.Equal(got, []string{"gamma:shop/pay@1"}) {
		t.Errorf("during the cut: %q, want gamma's pay kept", got)
	}
	proxy.Restore()
	wantProjections(t, c, "after the cut", "beta:shop/cart@1")
	testenv.Eventually(t, 10*time.Second, "the persisted file follows", func() error {
		st, err := newStateFile(dir, configStateFile, "config-projections", "alpha").load()
		if err != nil {
			return err
		}
		if len(st.Records) != 1 || st.Records[0].Key != beta.Origin().ConfigKey("shop", "cart") {
			return fmt.Errorf("records %+v, want beta's cart", st.Records)
		}
		return nil
	})
	cancel()

	// A new import (an agent restart) loads the file, serves it before the registry answers,
	// and the live snapshot replaces it: cart deleted meanwhile, pay written.
	c2, m2 := newTestImport(t, dir)
	written, n := c2.load()
	if n != 1 || written.IsZero() || !slices.Equal(describe(c2.projections()), []string{"beta:shop/cart@1"}) {
		t.Fatalf("loaded %d (%s): %q, want beta's cart", n, written, describe(c2.projections()))
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	if err := beta.DeleteConfig(ctx2, "shop", "cart"); err != nil {
		t.Fatal(err)
	}
	if err := gamma.PutConfig(ctx2, testProjection("shop", "pay", 5, "gamma", created)); err != nil {
		t.Fatal(err)
	}
	followConfigs(ctx2, c2, reader)
	wantProjections(t, c2, "the live snapshot", "gamma:shop/pay@5")
	if got := value(t, m2.errs.WithLabelValues(importErrStateRead)); got != 0 {
		t.Errorf("state read errors %v, want 0", got)
	}
}

// TestConfigImportSnapshotKeepsInvalid: the first live snapshot replaces the loaded projections,
// except for a key that holds an invalid record: its loaded (last good) projection stays.
func TestConfigImportSnapshotKeepsInvalid(t *testing.T) {
	dir := t.TempDir()
	c, m := newTestImport(t, dir)
	created := time.Now().Add(-time.Hour)
	o := registry.Origin{Region: "eu", Cluster: "beta"}
	var recs []storedRecord
	for _, svc := range []string{"pay", "cart"} {
		r, err := storeRecord(o.ConfigKey("shop", svc), testProjection("shop", svc, 1, "x", created))
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if _, err := c.file.save(recs, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, n := c.load(); n != 2 {
		t.Fatalf("loaded %d, want 2", n)
	}
	bad := testProjection("shop", "pay", 0, "x", created)
	c.mu.Lock()
	changed := c.apply(registry.Batch[*registryv1.ServiceConfigProjection]{Snapshot: true, Invalid: []registry.InvalidRecord[*registryv1.ServiceConfigProjection]{
		{Key: o.ConfigKey("shop", "pay"), Origin: o, Namespace: "shop", Service: "pay", Value: bad, Err: fmt.Errorf("version: want at least 1")}}})
	c.mu.Unlock()
	if !changed || !slices.Equal(describe(c.projections()), []string{"beta:shop/pay@1"}) {
		t.Errorf("after the snapshot (changed %v): %q, want pay kept (invalid in the store) and cart gone", changed, describe(c.projections()))
	}
	if got := value(t, m.errs.WithLabelValues(importErrInvalid)); got != 1 {
		t.Errorf("invalid errors %v, want 1", got)
	}
}

// TestStateFileRefusals: a state file that is corrupt, of a newer format, of another kind or
// cluster, or too large is refused with an error naming the file and why; a missing one is
// errNoState; save writes only when the records change.
func TestStateFileRefusals(t *testing.T) {
	dir := t.TempDir()
	f := newStateFile(dir, viewStateFile, "registry-view", "alpha")
	if _, err := f.load(); err != errNoState {
		t.Fatalf("load of a missing file: %v, want errNoState", err)
	}
	if wrote, err := f.save([]storedRecord{{Key: "k", Value: []byte{1}}}, time.Now()); !wrote || err != nil {
		t.Fatalf("first save: %v %v", wrote, err)
	}
	if wrote, err := f.save([]storedRecord{{Key: "k", Value: []byte{1}}}, time.Now()); wrote || err != nil {
		t.Errorf("save of the same records: wrote %v, %v; want nothing written", wrote, err)
	}
	if st, err := newStateFile(dir, viewStateFile, "registry-view", "alpha").load(); err != nil || len(st.Records) != 1 || st.Format != stateFormat {
		t.Fatalf("load = %+v, %v", st, err)
	}
	for _, c := range []struct {
		name, content, want string
	}{
		{"corrupt", `{"format":1,"kind":"registry-vi`, "not a state file"},
		{"newer format", `{"format":2,"kind":"registry-view","cluster":"alpha","records":[]}`, "format 2, written by a newer agent"},
		{"no format", `{"kind":"registry-view","cluster":"alpha"}`, "format 0"},
		{"other kind", `{"format":1,"kind":"config-projections","cluster":"alpha"}`, `kind "config-projections"`},
		{"other cluster", `{"format":1,"kind":"registry-view","cluster":"beta"}`, `written for cluster "beta"`},
	} {
		if err := os.WriteFile(f.path, []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := newStateFile(dir, viewStateFile, "registry-view", "alpha").load(); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), f.path) {
			t.Errorf("%s: %v, want it to name %s and %q", c.name, err, f.path, c.want)
		}
	}
	big, err := os.Create(f.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := big.Truncate(maxStateFileBytes + 1); err != nil {
		t.Fatal(err)
	}
	big.Close()
	if _, err := newStateFile(dir, viewStateFile, "registry-view", "alpha").load(); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized file: %v, want a refusal", err)
	}
}

// TestConfigImportReachesModel: the import's projections, as the assembler's filler, give the
// model routes on the ServiceImport frontend of the imported service with Origin set; with a
// control cluster only its projections apply and the others are ignored, counted and logged
// once (importMetrics), and the applied versions and age are exported; a backend this cluster
// does not import is logged once as not served.
func TestConfigImportReachesModel(t *testing.T) {
	created := time.Now().Add(-time.Hour)
	o := func(cluster string) registry.Origin { return registry.Origin{Region: "eu", Cluster: cluster} }
	rec := func(cluster string, version uint64, createdAt time.Time, backend string) registry.Record[*registryv1.ServiceConfigProjection] {
		v := testProjection("shop", "pay", version, cluster, createdAt)
		v.Routes[0].Rules[0].Backends[0].Service = &registryv1.ServiceRef{Namespace: "shop", Name: backend}
		return registry.Record[*registryv1.ServiceConfigProjection]{Key: o(cluster).ConfigKey("shop", "pay"), Origin: o(cluster), Value: v}
	}
	mark := func(cluster, name string, at time.Time) model.ExportMark {
		return model.ExportMark{Service: model.ServiceKey{Namespace: "shop", Name: name}, Cluster: cluster, Region: "eu",
			Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}, Created: at}
	}
	sources := func(c *configImport, gammaExports bool) model.Sources {
		s := model.Sources{Cluster: "alpha", MeshDomain: "mesh", TrustDomain: "aether.internal",
			MeshNamespaces: map[string]bool{"shop": true},
			Imports: []*mcsv1beta1.ServiceImport{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "pay"},
				Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.96.77.7"},
					Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}},
			// beta exports pay and ledger (which this cluster does not import).
			Exports: []model.ExportMark{mark("beta", "pay", created), mark("beta", "ledger", created)},
		}
		if gammaExports {
			s.Exports = append(s.Exports, mark("gamma", "pay", created.Add(time.Minute)))
		}
		if err := c.Fill(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tc := range []struct {
		name, control, wantOrigin string
		// betaBackend is the backend of beta's route (gamma's is always pay).
		betaBackend string
		wantIgnored map[string]float64
		wantProblem bool
		// gammaUnexported: gamma has no export mark of pay (its projection must not count).
		gammaUnexported bool
	}{
		// beta's export is older: it applies, gamma's is shadowed.
		{name: "federated", betaBackend: "pay", wantOrigin: "beta", wantIgnored: map[string]float64{"shadowed": 1}},
		// gamma is the control cluster: beta's (older) is ignored as not the control cluster's.
		{name: "control cluster", betaBackend: "pay", control: "gamma", wantOrigin: "gamma", wantIgnored: map[string]float64{"not_control": 1}},
		// beta's route sends to shop/ledger, which this cluster does not import.
		{name: "backend not imported", betaBackend: "ledger", wantOrigin: "beta", wantIgnored: map[string]float64{"shadowed": 1}, wantProblem: true},
		// gamma does not export pay: its projection is ignored, even as the control cluster's.
		{name: "origin not exporting", betaBackend: "pay", wantOrigin: "beta", wantIgnored: map[string]float64{"not_exported": 1}, gammaUnexported: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			log, buf := testLogBuf(t)
			m := newImportMetrics(reg, log)
			c := newConfigImport(log, tc.control, nil, m.errs, func() {})
			c.mu.Lock()
			c.apply(registry.Batch[*registryv1.ServiceConfigProjection]{Snapshot: true, Events: []registry.Event[*registryv1.ServiceConfigProjection]{
				{Type: registry.Added, Record: rec("beta", 3, created, tc.betaBackend)},
				{Type: registry.Added, Record: rec("gamma", 7, created.Add(time.Minute), "pay")},
			}})
			c.mu.Unlock()
			mesh := model.Assemble(1, sources(c, !tc.gammaUnexported))
			fe := model.Frontend{Service: model.ServiceKey{Namespace: "shop", Name: "pay"}, Import: true, Port: 80}
			entries := mesh.Routing.For(fe, "other")
			if len(entries) != 1 || entries[0].Route.Origin != tc.wantOrigin || entries[0].Route.Name != "pay-canary" {
				t.Fatalf("routes on %s: %+v, want pay-canary from %s", fe, entries, tc.wantOrigin)
			}
			if b := entries[0].Rule.Backends; len(b) != 1 || b[0].Kind != model.BackendServiceImport {
				t.Errorf("backends %+v, want the ServiceImport (clusterset endpoints)", b)
			}
			for range 2 { // the second model counts and logs nothing again
				m.observe(mesh)
			}
			if got := value(t, m.services); got != 1 {
				t.Errorf("aether_config_import_services %v, want 1", got)
			}
			wantVersion := map[string]float64{"beta": 3, "gamma": 7}[tc.wantOrigin]
			if got := value(t, m.version.WithLabelValues("shop", "pay", tc.wantOrigin)); got != wantVersion {
				t.Errorf("aether_config_import_version{shop,pay,%s} %v, want %v", tc.wantOrigin, got, wantVersion)
			}
			if n := len(collect(t, m.version)); n != 1 {
				t.Errorf("aether_config_import_version has %d series, want 1", n)
			}
			for _, reason := range []string{"shadowed", "not_control", "not_exported"} {
				if got := value(t, m.ignored.WithLabelValues(reason)); got != tc.wantIgnored[reason] {
					t.Errorf("aether_config_ignored_projections_total{%s} %v, want %v", reason, got, tc.wantIgnored[reason])
				}
			}
			logged := buf.String()
			if n := strings.Count(logged, "its origin is not the control cluster"); n != int(tc.wantIgnored["not_control"]) {
				t.Errorf("non-control projection logged %d times, want %v", n, tc.wantIgnored["not_control"])
			}
			if n := strings.Count(logged, "imported config not served in full"); (n == 1) != tc.wantProblem || n > 1 {
				t.Errorf("problem logged %d times, want it once: %v", n, tc.wantProblem)
			} else if tc.wantProblem && !strings.Contains(logged, "ledger") {
				t.Errorf("the logged problem does not name the backend ledger: %s", logged)
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() == "aether_config_import_age_max_seconds" {
					if age := mf.GetMetric()[0].GetGauge().GetValue(); age < 0 || age > 60 {
						t.Errorf("aether_config_import_age_max_seconds %v, want the seconds since the test wrote the projection", age)
					}
				}
			}
		})
	}
}
