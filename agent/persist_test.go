package agent

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// viewKeys returns the pod UIDs of the view's endpoints and the services of its export marks.
func viewKeys(v *registryView) (eps, exps []string) {
	e, x := v.Records()
	for _, ep := range e {
		eps = append(eps, ep.PodUID)
	}
	for _, m := range x {
		exps = append(exps, m.Service.String())
	}
	slices.Sort(eps)
	slices.Sort(exps)
	return eps, exps
}

// TestRegistryViewPersistAndSeed: a live view persists its endpoints and export marks (0600,
// only on change); a view of a restarted agent seeded from that file serves them, reports
// degraded readiness naming the file and its time until its watches sync, leaves out what live
// records could not be (an identity of another trust domain, garbage), and once the registry
// answers takes its live state: a persisted endpoint the registry no longer lists goes after a
// read confirms it (a held deletion), a persisted export mark at once.
func TestRegistryViewPersistAndSeed(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	proxy := testenv.NewCutProxy(t, strings.TrimPrefix(etcd.Endpoints[0], "http://"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := testLog(t)
	newReg := func(endpoints []string, cluster string) *registry.Registry {
		r, err := registry.New(registry.Config{Endpoints: endpoints, Region: "eu", Cluster: cluster, LeaseTTL: 3 * time.Second, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	beta := newReg(etcd.Endpoints, "beta")
	for _, uid := range []string{"u1", "u2"} {
		if err := beta.RegisterEndpoint(ctx, heldTestEndpoint(uid)); err != nil {
			t.Fatal(err)
		}
	}
	mark := &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: "shop", Name: "remote"},
		Ports: []*registryv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}}}
	if err := beta.Export(ctx, mark); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	file := newStateFile(dir, viewStateFile, "registry-view", "alpha")
	vctx, vcancel := context.WithCancel(ctx)
	v := newRegistryView(log, time.Second, func() {})
	v.trustDomains = []string{"aether.internal"}
	followRegistry(vctx, v, newReg(etcd.Endpoints, "alpha"), 3*time.Second)
	go persistView(vctx, v, file, 50*time.Millisecond, log)
	read := func() (*registryState, error) {
		return newStateFile(dir, viewStateFile, "registry-view", "alpha").load()
	}
	testenv.Eventually(t, 30*time.Second, "the view persisted", func() error {
		st, err := read()
		if err != nil {
			return err
		}
		if len(st.Records) != 3 {
			return fmt.Errorf("%d records, want 2 endpoints and 1 export mark", len(st.Records))
		}
		return nil
	})
	fi, err := os.Stat(file.path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v, want mode 0600", file.path, fi, err)
	}
	// Nothing changes: nothing is written (the file keeps its time).
	time.Sleep(300 * time.Millisecond)
	if fi2, err := os.Stat(file.path); err != nil || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Errorf("the file was rewritten without a change (%v, %v)", fi2.ModTime(), err)
	}
	vcancel()

	// The persisted state gets a record of a foreign trust domain and a garbage one, as a
	// tampered file could hold: both are left out of the seed.
	st, err := read()
	if err != nil {
		t.Fatal(err)
	}
	foreign := heldTestEndpoint("mallory")
	foreign.SpiffeId = "spiffe://evil.example/ns/shop/sa/default"
	o := registry.Origin{Region: "eu", Cluster: "beta"}
	r, err := storeRecord(o.EndpointKey("shop", "remote", "mallory"), foreign)
	if err != nil {
		t.Fatal(err)
	}
	st.Records = append(st.Records, r, storedRecord{Key: o.EndpointKey("shop", "remote", "junk"), Value: []byte{0xff}})

	// While the restarted agent's registry is cut off: u1 deregistered, the export withdrawn.
	proxy.Cut()
	if err := beta.DeregisterEndpoint(ctx, "shop", "remote", "u1"); err != nil {
		t.Fatal(err)
	}
	if err := beta.Unexport(ctx, "shop", "remote"); err != nil {
		t.Fatal(err)
	}
	v2 := newRegistryView(log, time.Second, func() {})
	v2.trustDomains = []string{"aether.internal"}
	reader := newReg([]string{proxy.URL()}, "alpha")
	followRegistry(ctx, v2, reader, 3*time.Second)
	if eps, exps := v2.seedFrom(st, file.path); eps != 2 || exps != 1 {
		t.Fatalf("seeded %d endpoints and %d export marks, want 2 and 1", eps, exps)
	}
	if eps, exps := viewKeys(v2); !slices.Equal(eps, []string{"u1", "u2"}) || !slices.Equal(exps, []string{"shop/remote"}) {
		t.Fatalf("seeded view: endpoints %v, exports %v; want u1, u2 and shop/remote", eps, exps)
	}
	if err := v2.health(ctx); err == nil || !strings.Contains(err.Error(), "last-known registry state from "+file.path+" written at "+st.Written.UTC().Format(time.RFC3339)) {
		t.Errorf("health while seeded: %v, want it to name the file and its time", err)
	}
	proxy.Restore()
	testenv.Eventually(t, 60*time.Second, "the live state", func() error {
		if eps, exps := viewKeys(v2); !slices.Equal(eps, []string{"u2"}) || len(exps) != 0 {
			return fmt.Errorf("endpoints %v, exports %v; want u2 and none", eps, exps)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "readiness back", func() error { return v2.health(ctx) })
}

// TestWaitRegistrySyncGrace: without a persisted view waitRegistry waits for the registry
// (until ctx ends); with one, it serves it once the grace passed.
func TestWaitRegistrySyncGrace(t *testing.T) {
	log, buf := testLogBuf(t)
	v := newRegistryView(log, time.Second, func() {})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if waitRegistry(ctx, v, nil, "/nowhere", 10*time.Millisecond, log) {
		t.Fatal("waitRegistry without a persisted view returned before the registry synced")
	}
	o := registry.Origin{Region: "eu", Cluster: "beta"}
	r, err := storeRecord(o.EndpointKey("shop", "remote", "u1"), heldTestEndpoint("u1"))
	if err != nil {
		t.Fatal(err)
	}
	written := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	if !waitRegistry(context.Background(), v, &registryState{Written: written, Records: []storedRecord{r}}, "/var/lib/aether/registry/view.json", 10*time.Millisecond, log) {
		t.Fatal("waitRegistry with a persisted view did not serve it")
	}
	if eps, _ := v.Records(); len(eps) != 1 || eps[0].Service != (model.ServiceKey{Namespace: "shop", Name: "remote"}) {
		t.Errorf("served endpoints %+v, want the persisted one", eps)
	}
	if want := "serving the last-known registry state from /var/lib/aether/registry/view.json written at 2026-07-01T12:00:00Z"; !strings.Contains(buf.String(), want) {
		t.Errorf("log %q, want %q", buf.String(), want)
	}
}
