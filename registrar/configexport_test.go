package registrar_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/configexport"
	"github.com/aethermesh/aether/registry"
)

// withConfigs turns the config projections on (the registry the harness gives the registrar),
// with the control cluster and refresh period given (0: the default).
func withConfigs(control string, refresh time.Duration) func(*registrar.Config) {
	return func(c *registrar.Config) {
		c.Configs = c.Exports.(*registry.Registry)
		c.ControlCluster, c.ConfigExportRefresh = control, refresh
	}
}

// projection reads cluster origin's projection of ns/name from the registry (nil: none).
func projection(t testing.TB, reg *registry.Registry, origin, ns, name string) *registryv1.ServiceConfigProjection {
	t.Helper()
	recs, _, err := reg.ListConfigs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Origin.Cluster == origin && r.Value.GetService().GetNamespace() == ns && r.Value.GetService().GetName() == name {
			return r.Value
		}
	}
	return nil
}

// siCond returns the ServiceImport's condition of type typ (nil when absent) and its status.clusters.
func (cl *cluster) siCond(ns, name, typ string) (*metav1.Condition, []string, error) {
	var si mcsv1beta1.ServiceImport
	if err := cl.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &si); err != nil {
		return nil, nil, err
	}
	var clusters []string
	for _, c := range si.Status.Clusters {
		clusters = append(clusters, c.Cluster)
	}
	return meta.FindStatusCondition(si.Status.Conditions, typ), clusters, nil
}

func (cl *cluster) wantSICond(ns, name, typ string, status metav1.ConditionStatus, reason string, msgHas ...string) error {
	c, _, err := cl.siCond(ns, name, typ)
	if err != nil {
		return err
	}
	if c == nil || c.Status != status || c.Reason != reason {
		return fmt.Errorf("%s: ServiceImport %s/%s condition %s = %+v, want %s/%s", cl.name, ns, name, typ, c, status, reason)
	}
	for _, m := range msgHas {
		if !strings.Contains(c.Message, m) {
			return fmt.Errorf("%s: ServiceImport %s/%s condition %s message %q does not say %q", cl.name, ns, name, typ, c.Message, m)
		}
	}
	return nil
}

// wantExported checks the ServiceExport's ConfigExported condition.
func (cl *cluster) wantExported(ns, name string, status metav1.ConditionStatus, reason string, msgHas ...string) error {
	c, err := cl.exportCond(ns, name, configexport.ConditionConfigExported)
	if err != nil {
		return err
	}
	if c.Status != status || c.Reason != reason {
		return fmt.Errorf("%s: ServiceExport %s/%s %s = %s/%s (%s), want %s/%s", cl.name, ns, name, configexport.ConditionConfigExported, c.Status, c.Reason, c.Message, status, reason)
	}
	for _, m := range msgHas {
		if !strings.Contains(c.Message, m) {
			return fmt.Errorf("%s: ServiceExport %s/%s %s message %q does not say %q", cl.name, ns, name, configexport.ConditionConfigExported, c.Message, m)
		}
	}
	return nil
}

func meshNS(t testing.TB, cl *cluster, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}
	if err := cl.c.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// bigRoute is an HTTPRoute of about 1.2 MiB (under etcd's request limit, 1.5 MiB, over
// registry.MaxConfigBytes): 5 rules, each setting and adding 32 request and 32 response headers of
// 4000 bytes (within the Gateway API's limits).
func bigRoute(ns, name, parent string) *gwv1.HTTPRoute {
	r := httpRoute(ns, name, []gwv1.ParentReference{svcParent(parent, 80)}, backend(parent, 80))
	rule := r.Spec.Rules[0]
	r.Spec.Rules = nil
	headers := func(prefix string) []gwv1.HTTPHeader {
		var out []gwv1.HTTPHeader
		for j := range 16 {
			out = append(out, gwv1.HTTPHeader{Name: gwv1.HTTPHeaderName(fmt.Sprintf("x-%s-%d", prefix, j)), Value: strings.Repeat("v", 4000)})
		}
		return out
	}
	for i := range 5 {
		rr := *rule.DeepCopy()
		rr.Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptrTo(gwv1.PathMatchPathPrefix), Value: ptrTo(fmt.Sprintf("/r%d", i))}}}
		rr.Filters = []gwv1.HTTPRouteFilter{
			{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{Set: headers("qs"), Add: headers("qa")}},
			{Type: gwv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{Set: headers("ps"), Add: headers("pa")}},
		}
		r.Spec.Rules = append(r.Spec.Rules, rr)
	}
	return r
}

// TestConfigExportAndImport runs two real kube-apiservers (east exports, west imports) and one
// shared real etcd registry, a registrar per cluster with the config projections on, and checks
// the export side (projection written with versions increasing on route changes, nothing written
// when nothing changed, refresh, unexport and a leader change, a projection too large refused
// with the old one kept, BackendsExported on the route, the ServiceExport conditions of the MCS
// export controller and of config export side by side), the import side (ConfigImported and
// ConfigDrift on west's ServiceImport beside the import generator's status.clusters) and a
// control cluster (east exports nothing and deletes its projections; a rogue origin's projection
// is ignored, counted once per version).
func TestConfigExportAndImport(t *testing.T) {
	regSrv := startRegistryServer(t)
	var east, west *cluster
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); east = newCluster(t, "east") }()
	go func() { defer wg.Done(); west = newCluster(t, "west") }()
	wg.Wait()
	if east == nil || west == nil {
		t.FailNow()
	}
	eastR := startRegistrar(t, east, regSrv.Endpoints, "east-1", withConfigs("", 0))
	westR := startRegistrar(t, west, regSrv.Endpoints, "west-1", withConfigs("", 0))
	eastR.waitElected(t)
	westR.waitElected(t)
	reader, err := registry.New(registry.Config{Endpoints: regSrv.Endpoints, Region: region, Cluster: "reader", Logger: testLogger(t, "reader"), DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Close() })
	ctx := context.Background()
	const ns = "shop"
	for _, cl := range []*cluster{east, west} {
		meshNS(t, cl, ns)
		meshNS(t, cl, "web")
	}
	east.createService(t, ns, "cart", port{name: "http", port: 80, tgt: 8080, appProto: "http"})
	east.createService(t, ns, "db", port{name: "http", port: 80, tgt: 8080, appProto: "http"})
	east.export(t, ns, "cart")
	egw := gwclient.NewForConfigOrDie(east.api.Config).GatewayV1().HTTPRoutes(ns)
	wgw := gwclient.NewForConfigOrDie(west.api.Config).GatewayV1()
	canary := httpRoute(ns, "canary", []gwv1.ParentReference{svcParent("cart", 80)}, backend("cart", 80), backend("db", 80))
	if _, err := egw.Create(ctx, canary, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var v1 uint64

	t.Run("ExportWritesProjection", func(t *testing.T) {
		took := testenv.Eventually(t, converge, "projection of shop/cart from east", func() error {
			p := projection(t, reader, "east", ns, "cart")
			if p == nil || len(p.GetRoutes()) != 1 || p.GetRoutes()[0].GetName() != "canary" {
				return fmt.Errorf("projection %v", p)
			}
			v1 = p.GetVersion()
			return east.wantExported(ns, "cart", metav1.ConditionTrue, configexport.ReasonExported, fmt.Sprintf("version %d with 1 routes", v1))
		})
		t.Logf("HTTPRoute on an exported Service -> projection in the registry: %s (version %d)", took, v1)
		p := projection(t, reader, "east", ns, "cart")
		var se mcsv1beta1.ServiceExport
		if err := east.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cart"}, &se); err != nil {
			t.Fatal(err)
		}
		if want := se.CreationTimestamp.UTC().Format(time.RFC3339Nano); p.GetExportCreateTime() != want {
			t.Errorf("export_create_time %q, want the ServiceExport's creationTimestamp %q", p.GetExportCreateTime(), want)
		}
		if p.GetOriginCluster() != "east" || p.GetExportTime() == "" {
			t.Errorf("origin %q, export_time %q", p.GetOriginCluster(), p.GetExportTime())
		}
		// The MCS conditions and ConfigExported stand side by side (each written by its own
		// controller: an update of the first, a server-side apply of the second).
		testenv.Eventually(t, converge, "MCS conditions beside ConfigExported", func() error {
			if err := east.wantCond(ns, "cart", mcsv1beta1.ServiceExportConditionValid, metav1.ConditionTrue, string(mcsv1beta1.ServiceExportReasonValid)); err != nil {
				return err
			}
			if err := east.wantCond(ns, "cart", mcsv1beta1.ServiceExportConditionReady, metav1.ConditionTrue, string(mcsv1beta1.ServiceExportReasonExported)); err != nil {
				return err
			}
			return east.wantExported(ns, "cart", metav1.ConditionTrue, configexport.ReasonExported)
		})
		// db is not exported: the route says its importers cannot reach it.
		testenv.Eventually(t, converge, "BackendsExported False on the canary", func() error {
			r, err := egw.Get(ctx, "canary", metav1.GetOptions{})
			if err != nil {
				return err
			}
			pst, err := checkParent("HTTPRoute canary", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue,
				wantCond{configexport.ConditionBackendsExported, metav1.ConditionFalse, configexport.ReasonBackendNotExported})
			if err != nil {
				return err
			}
			if c := meta.FindStatusCondition(pst.Conditions, configexport.ConditionBackendsExported); !strings.Contains(c.Message, "shop/db") || strings.Contains(c.Message, "shop/cart") {
				return fmt.Errorf("message %q should name shop/db only", c.Message)
			}
			return nil
		})
		// West applies it, but cannot serve its backend db (not exported: no ServiceImport).
		testenv.Eventually(t, converge, "west ConfigImported PartiallyInvalid", func() error {
			return west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionTrue, configexport.ReasonPartiallyInvalid,
				"from cluster east", fmt.Sprintf("version %d", v1), "BackendNotFound")
		})

		east.export(t, ns, "db")
		testenv.Eventually(t, converge, "BackendsExported True once db is exported", func() error {
			r, err := egw.Get(ctx, "canary", metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = checkParent("HTTPRoute canary", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue,
				wantCond{configexport.ConditionBackendsExported, metav1.ConditionTrue, configexport.ReasonExported})
			return err
		})
		testenv.Eventually(t, converge, "db projected with no routes", func() error {
			if p := projection(t, reader, "east", ns, "db"); p == nil || len(p.GetRoutes()) != 0 {
				return fmt.Errorf("projection of db %v", p)
			}
			return nil
		})
		testenv.Eventually(t, converge, "west ConfigImported Applied, no drift", func() error {
			if err := west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionTrue, configexport.ReasonApplied, "from cluster east", "old when"); err != nil {
				return err
			}
			return west.wantSICond(ns, "cart", configexport.ConditionConfigDrift, metav1.ConditionFalse, configexport.ReasonNoDrift)
		})
		if got := eastR.gauge(t, "aether_config_export_services"); got != 2 {
			t.Errorf("aether_config_export_services = %v, want 2", got)
		}
		if got := eastR.sampleWith(t, "aether_config_export_version", "service", "cart"); got != float64(v1) {
			t.Errorf("aether_config_export_version{service=cart} = %v, want %d", got, v1)
		}
	})

	t.Run("RouteChangeBumpsVersionNothingElseWrites", func(t *testing.T) {
		if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			r, err := egw.Get(ctx, "canary", metav1.GetOptions{})
			if err != nil {
				return err
			}
			r.Spec.Rules[0].BackendRefs[1].Weight = ptrTo(int32(10))
			_, err = egw.Update(ctx, r, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		var v2 uint64
		testenv.Eventually(t, converge, "a new version after the route change", func() error {
			p := projection(t, reader, "east", ns, "cart")
			if p.GetVersion() <= v1 || p.GetRoutes()[0].GetRules()[0].GetBackends()[1].GetWeight() != 10 {
				return fmt.Errorf("version %d (was %d), routes %v", p.GetVersion(), v1, p.GetRoutes())
			}
			v2 = p.GetVersion()
			return east.wantExported(ns, "cart", metav1.ConditionTrue, configexport.ReasonExported, fmt.Sprintf("version %d ", v2))
		})
		if v2 != v1+1 {
			t.Errorf("version %d after %d: want one write", v2, v1)
		}
		// West's import follows the version.
		testenv.Eventually(t, converge, "west applies the new version", func() error {
			return west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionTrue, configexport.ReasonApplied, fmt.Sprintf("version %d", v2))
		})
		// A change that leaves the projected routes as they are (an annotation: no new
		// generation; a Service label) writes nothing.
		if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			r, err := egw.Get(ctx, "canary", metav1.GetOptions{})
			if err != nil {
				return err
			}
			r.Annotations = map[string]string{"team": "shop"}
			_, err = egw.Update(ctx, r, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		var svc corev1.Service
		if err := east.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cart"}, &svc); err != nil {
			t.Fatal(err)
		}
		svc.Labels = map[string]string{"tier": "front"}
		if err := east.c.Update(ctx, &svc); err != nil {
			t.Fatal(err)
		}
		before := projection(t, reader, "east", ns, "cart")
		time.Sleep(3 * time.Second)
		if after := projection(t, reader, "east", ns, "cart"); after.GetVersion() != before.GetVersion() || after.GetExportTime() != before.GetExportTime() {
			t.Errorf("projection rewritten without a change: version %d -> %d, export_time %s -> %s", before.GetVersion(), after.GetVersion(), before.GetExportTime(), after.GetExportTime())
		}
		v1 = v2
	})

	t.Run("ConditionsOfBothControllersSurviveEachOther", func(t *testing.T) {
		// The MCS export controller rewrites its conditions (the Service goes: NoService); the
		// config exporter rewrites its own (NotExportable): each keeps the other's.
		if err := east.c.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "both controllers' conditions after the Service went", func() error {
			if err := east.wantCond(ns, "db", mcsv1beta1.ServiceExportConditionValid, metav1.ConditionFalse, string(mcsv1beta1.ServiceExportReasonNoService)); err != nil {
				return err
			}
			return east.wantExported(ns, "db", metav1.ConditionFalse, configexport.ReasonNotExportable)
		})
		if p := projection(t, reader, "east", ns, "db"); p != nil {
			t.Errorf("projection of db kept without its Service: %v", p)
		}
		east.createService(t, ns, "db", port{name: "http", port: 80, tgt: 8080, appProto: "http"})
		testenv.Eventually(t, converge, "both controllers' conditions after the Service came back", func() error {
			if err := east.wantCond(ns, "db", mcsv1beta1.ServiceExportConditionValid, metav1.ConditionTrue, string(mcsv1beta1.ServiceExportReasonValid)); err != nil {
				return err
			}
			if err := east.wantCond(ns, "db", mcsv1beta1.ServiceExportConditionReady, metav1.ConditionTrue, string(mcsv1beta1.ServiceExportReasonExported)); err != nil {
				return err
			}
			if err := east.wantExported(ns, "db", metav1.ConditionTrue, configexport.ReasonExported); err != nil {
				return err
			}
			if p := projection(t, reader, "east", ns, "db"); p == nil {
				return fmt.Errorf("no projection of db")
			}
			return nil
		})
		var se mcsv1beta1.ServiceExport
		if err := east.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "db"}, &se); err != nil {
			t.Fatal(err)
		}
		if got := ownerOf(se.ManagedFields, configexport.ConditionConfigExported); got != configexport.ExportFieldManager {
			t.Errorf("condition %s is managed by %q, want %q", configexport.ConditionConfigExported, got, configexport.ExportFieldManager)
		}
	})

	t.Run("ImportStatusBesideClustersAndDrift", func(t *testing.T) {
		// West exports cart too: the import generator rewrites status.clusters; the import
		// status stays, and east's projection still applies (the older export; ties: east).
		west.createService(t, ns, "cart", port{name: "http", port: 80, tgt: 8080, appProto: "http"})
		west.export(t, ns, "cart")
		testenv.Eventually(t, converge, "status.clusters and the import conditions side by side", func() error {
			_, clusters, err := west.siCond(ns, "cart", configexport.ConditionConfigImported)
			if err != nil {
				return err
			}
			if fmt.Sprint(clusters) != "[east west]" {
				return fmt.Errorf("status.clusters %v", clusters)
			}
			if p := projection(t, reader, "west", ns, "cart"); p == nil {
				return fmt.Errorf("west does not project its export of cart")
			}
			if err := west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionTrue, configexport.ReasonApplied, "from cluster east"); err != nil {
				return err
			}
			return west.wantSICond(ns, "cart", configexport.ConditionConfigDrift, metav1.ConditionFalse, configexport.ReasonNoDrift)
		})
		var si mcsv1beta1.ServiceImport
		if err := west.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cart"}, &si); err != nil {
			t.Fatal(err)
		}
		for _, typ := range []string{configexport.ConditionConfigImported, configexport.ConditionConfigDrift} {
			if got := ownerOf(si.ManagedFields, typ); got != configexport.ImportFieldManager {
				t.Errorf("condition %s is managed by %q, want %q", typ, got, configexport.ImportFieldManager)
			}
		}
		west.unexport(t, ns, "cart")
		if err := west.c.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cart"}}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "west's projection of cart gone, status.clusters [east]", func() error {
			if p := projection(t, reader, "west", ns, "cart"); p != nil {
				return fmt.Errorf("west still projects cart")
			}
			_, clusters, err := west.siCond(ns, "cart", configexport.ConditionConfigImported)
			if err == nil && fmt.Sprint(clusters) != "[east]" {
				err = fmt.Errorf("status.clusters %v", clusters)
			}
			if err != nil {
				return err
			}
			return west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionTrue, configexport.ReasonApplied)
		})

		// A consumer route in west's namespace web on the ServiceImport: drift, and it clears.
		parent := importParent("cart", 80)
		parent.Namespace = ptrTo(gwv1.Namespace(ns))
		consumer := httpRoute("web", "cart-local", []gwv1.ParentReference{parent}, importBackend("cart", 80))
		consumer.Spec.Rules[0].BackendRefs[0].Namespace = ptrTo(gwv1.Namespace(ns))
		if _, err := wgw.HTTPRoutes("web").Create(ctx, consumer, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		took := testenv.Eventually(t, converge, "drift in west", func() error {
			return west.wantSICond(ns, "cart", configexport.ConditionConfigDrift, metav1.ConditionTrue, configexport.ReasonDrift, "namespace web", "HTTPRoute web/cart-local")
		})
		t.Logf("consumer route in the importing cluster -> ConfigDrift True: %s", took)
		if got := westR.gauge(t, "aether_config_drift_services"); got != 1 {
			t.Errorf("aether_config_drift_services = %v, want 1", got)
		}
		if err := wgw.HTTPRoutes("web").Delete(ctx, "cart-local", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "drift cleared", func() error {
			if err := west.wantSICond(ns, "cart", configexport.ConditionConfigDrift, metav1.ConditionFalse, configexport.ReasonNoDrift); err != nil {
				return err
			}
			if got := westR.gauge(t, "aether_config_drift_services"); got != 0 {
				return fmt.Errorf("aether_config_drift_services = %v", got)
			}
			return nil
		})

		// A local producer route on the ServiceImport in west overrides the projection.
		local := httpRoute(ns, "cart-override", []gwv1.ParentReference{importParent("cart", 80)}, importBackend("cart", 80))
		if _, err := wgw.HTTPRoutes(ns).Create(ctx, local, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "overridden in west", func() error {
			if err := west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionFalse, configexport.ReasonOverridden, "HTTPRoute shop/cart-override"); err != nil {
				return err
			}
			return west.wantSICond(ns, "cart", configexport.ConditionConfigDrift, metav1.ConditionTrue, configexport.ReasonDrift, "local producer routes")
		})
		if err := wgw.HTTPRoutes(ns).Delete(ctx, "cart-override", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "applied again in west", func() error {
			return west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionTrue, configexport.ReasonApplied)
		})
	})

	t.Run("TooLargeRefusedOldProjectionKept", func(t *testing.T) {
		east.createService(t, ns, "big", port{name: "http", port: 80, tgt: 8080, appProto: "http"})
		east.export(t, ns, "big")
		if _, err := egw.Create(ctx, httpRoute(ns, "big-0", []gwv1.ParentReference{svcParent("big", 80)}, backend("big", 80)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var good *registryv1.ServiceConfigProjection
		testenv.Eventually(t, converge, "projection of big", func() error {
			if good = projection(t, reader, "east", ns, "big"); good == nil || len(good.GetRoutes()) != 1 {
				return fmt.Errorf("projection of big %v", good)
			}
			return nil
		})
		before := eastR.sampleWith(t, "aether_config_export_errors_total", "reason", "too_large")
		if _, err := egw.Create(ctx, bigRoute(ns, "big-1", "big"), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create big route: %v", err)
		}
		testenv.Eventually(t, converge, "TooLarge", func() error {
			return east.wantExported(ns, "big", metav1.ConditionFalse, configexport.ReasonTooLarge, "bytes encoded, over the limit of 1048576",
				fmt.Sprintf("the registry keeps version %d", good.GetVersion()))
		})
		if p := projection(t, reader, "east", ns, "big"); p.GetVersion() != good.GetVersion() || len(p.GetRoutes()) != 1 {
			t.Errorf("the registry holds version %d with %d routes, want the last good one (%d, 1 route)", p.GetVersion(), len(p.GetRoutes()), good.GetVersion())
		}
		// Counted once, however many passes see it (the route status writes bring some).
		time.Sleep(time.Second)
		if got := eastR.sampleWith(t, "aether_config_export_errors_total", "reason", "too_large"); got != before+1 {
			t.Errorf("too_large errors %v -> %v, want one more", before, got)
		}
		if err := egw.Delete(ctx, "big-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "exported again", func() error {
			return east.wantExported(ns, "big", metav1.ConditionTrue, configexport.ReasonExported)
		})
	})

	t.Run("LeaderChangeRefreshAndCleanup", func(t *testing.T) {
		eastR.stop()
		before := projection(t, reader, "east", ns, "cart")
		// While no registrar runs in east, big is unexported: the next leader deletes its
		// projection at its first pass.
		east.unexport(t, ns, "big")
		eastR = startRegistrar(t, east, regSrv.Endpoints, "east-2", withConfigs("", 2*time.Second))
		eastR.waitElected(t)
		testenv.Eventually(t, converge, "big's projection deleted by the new leader", func() error {
			if p := projection(t, reader, "east", ns, "big"); p != nil {
				return fmt.Errorf("projection of big still there (version %d)", p.GetVersion())
			}
			return nil
		})
		// Refreshed every 2 s: export_time moves and the version goes on from the registry's.
		var last *registryv1.ServiceConfigProjection
		for range 2 {
			testenv.Eventually(t, converge, "a refresh", func() error {
				p := projection(t, reader, "east", ns, "cart")
				prev := before
				if last != nil {
					prev = last
				}
				if p.GetVersion() <= prev.GetVersion() || p.GetExportTime() <= prev.GetExportTime() {
					return fmt.Errorf("version %d export_time %s (was %d, %s)", p.GetVersion(), p.GetExportTime(), prev.GetVersion(), prev.GetExportTime())
				}
				last = p
				return nil
			})
		}
		if len(last.GetRoutes()) != 1 || last.GetExportCreateTime() != before.GetExportCreateTime() {
			t.Errorf("refresh changed the content: %v", last)
		}
	})

	t.Run("ControlClusterElsewhere", func(t *testing.T) {
		eastR.stop()
		westR.stop()
		eastR = startRegistrar(t, east, regSrv.Endpoints, "east-3", withConfigs("west", 0))
		westR = startRegistrar(t, west, regSrv.Endpoints, "west-2", withConfigs("west", 0))
		eastR.waitElected(t)
		westR.waitElected(t)
		testenv.Eventually(t, converge, "east's projections deleted, east exports nothing", func() error {
			for _, name := range []string{"cart", "db"} {
				if p := projection(t, reader, "east", ns, name); p != nil {
					return fmt.Errorf("east still projects %s", name)
				}
				if err := east.wantExported(ns, name, metav1.ConditionFalse, configexport.ReasonNotControlCluster, "control cluster west"); err != nil {
					return err
				}
			}
			return nil
		})
		testenv.Eventually(t, converge, "no projection for west's import", func() error {
			return west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionFalse, configexport.ReasonNoProjection, "control cluster west")
		})
		// The BackendsExported condition goes with the export.
		testenv.Eventually(t, converge, "BackendsExported removed in east", func() error {
			r, err := egw.Get(ctx, "canary", metav1.GetOptions{})
			if err != nil {
				return err
			}
			pst, err := checkParent("HTTPRoute canary", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue)
			if err == nil && meta.FindStatusCondition(pst.Conditions, configexport.ConditionBackendsExported) != nil {
				err = fmt.Errorf("BackendsExported still set: %+v", pst.Conditions)
			}
			return err
		})

		// A rogue origin writes a projection of cart: west ignores it, counts it once per
		// version and says why on the ServiceImport.
		rogue, err := registry.New(registry.Config{Endpoints: regSrv.Endpoints, Region: region, Cluster: "rogue", Logger: testLogger(t, "rogue"), DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer rogue.Close()
		put := func(v uint64) {
			t.Helper()
			if err := rogue.PutConfig(ctx, &registryv1.ServiceConfigProjection{
				Service: &registryv1.ServiceRef{Namespace: ns, Name: "cart"}, Version: v,
				ExportCreateTime: "2020-01-01T00:00:00Z", Routes: rogueRoutes(),
			}); err != nil {
				t.Fatal(err)
			}
		}
		// east's projections, seen by west before east's new leader deleted them, were counted
		// already: they were from an origin that is not the control cluster too.
		base := westR.sampleWith(t, "aether_config_ignored_projections_total", "reason", "not_control_cluster")
		put(1)
		testenv.Eventually(t, converge, "rogue projection ignored in west", func() error {
			if err := west.wantSICond(ns, "cart", configexport.ConditionConfigImported, metav1.ConditionFalse, configexport.ReasonNotControlCluster, "rogue"); err != nil {
				return err
			}
			if got := westR.sampleWith(t, "aether_config_ignored_projections_total", "reason", "not_control_cluster"); got != base+1 {
				return fmt.Errorf("ignored projections %v, want %v", got, base+1)
			}
			return nil
		})
		put(2)
		testenv.Eventually(t, converge, "the next version counted once more", func() error {
			if got := westR.sampleWith(t, "aether_config_ignored_projections_total", "reason", "not_control_cluster"); got != base+2 {
				return fmt.Errorf("ignored projections %v, want %v", got, base+2)
			}
			return nil
		})
		time.Sleep(time.Second)
		if got := westR.sampleWith(t, "aether_config_ignored_projections_total", "reason", "not_control_cluster"); got != base+2 {
			t.Errorf("ignored projections %v after passes, want %v (once per version)", got, base+2)
		}
		if err := rogue.DeleteConfig(ctx, ns, "cart"); err != nil {
			t.Fatal(err)
		}
	})
}

// rogueRoutes are the routes of the rogue projection: one producer route of shop/cart.
func rogueRoutes() []*registryv1.Route {
	r := model.HTTPRouteModel(httpRoute("shop", "rogue-route", []gwv1.ParentReference{svcParent("cart", 80)}, backend("cart", 80)))
	return []*registryv1.Route{model.RouteToProto(r)}
}

// ownerOf returns the field managers that own the status condition of type typ (managedFields),
// joined with ",".
func ownerOf(mfs []metav1.ManagedFieldsEntry, typ string) string {
	key := `k:{\"type\":\"` + typ + `\"}`
	var out []string
	for _, mf := range mfs {
		if mf.Subresource == "status" && mf.FieldsV1 != nil && strings.Contains(mf.FieldsV1.GetRawString(), key) {
			out = append(out, mf.Manager)
		}
	}
	return strings.Join(out, ",")
}

// TestConfigExportFollowsRouteCRDs: without the route CRDs an exported Service is projected with
// no routes; once the HTTPRoute CRD is installed its producer routes are projected (a new
// version).
func TestConfigExportFollowsRouteCRDs(t *testing.T) {
	regSrv := startRegistryServer(t)
	cl := newClusterWithCRDs(t, "east", testenv.CRDSubset(t, "multicluster.x-k8s.io_serviceexports.yaml", "multicluster.x-k8s.io_serviceimports.yaml"))
	in := startRegistrar(t, cl, regSrv.Endpoints, "east", withConfigs("", 0), func(c *registrar.Config) { c.RouteCRDRecheck = 200 * time.Millisecond })
	in.waitElected(t)
	ctx := context.Background()
	const ns = "shop"
	meshNS(t, cl, ns)
	cl.createService(t, ns, "cart", port{name: "http", port: 80, tgt: 8080, appProto: "http"})
	cl.export(t, ns, "cart")
	var first uint64
	testenv.Eventually(t, converge, "a projection with no routes", func() error {
		p := projection(t, in.reg, "east", ns, "cart")
		if p == nil || len(p.GetRoutes()) != 0 {
			return fmt.Errorf("projection %v", p)
		}
		first = p.GetVersion()
		return cl.wantExported(ns, "cart", metav1.ConditionTrue, configexport.ReasonExported, "with 0 routes")
	})
	testenv.InstallCRDs(t, cl.api.Config, testenv.CRDSubset(t, "gateway.networking.k8s.io_httproutes.yaml"))
	hr := gwclient.NewForConfigOrDie(cl.api.Config).GatewayV1().HTTPRoutes(ns)
	testenv.Eventually(t, converge, "the HTTPRoute CRD served", func() error {
		_, err := hr.Create(ctx, httpRoute(ns, "web", []gwv1.ParentReference{svcParent("cart", 80)}, backend("cart", 80)), metav1.CreateOptions{})
		return err
	})
	testenv.Eventually(t, converge, "the route projected", func() error {
		p := projection(t, in.reg, "east", ns, "cart")
		if len(p.GetRoutes()) != 1 || p.GetVersion() <= first {
			return fmt.Errorf("version %d (first %d), routes %v", p.GetVersion(), first, p.GetRoutes())
		}
		return nil
	})
}
