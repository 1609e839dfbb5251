package registrar_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// flapWatch is how long the conflict outcome is watched for changes. It runs concurrently with
// the leader change and the registry outage (the outcome must survive both), so it costs the
// suite little. AETHER_FLAP_WATCH overrides it (a Go duration).
func flapWatch(t *testing.T) time.Duration {
	if v := os.Getenv("AETHER_FLAP_WATCH"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("AETHER_FLAP_WATCH=%q: %v", v, err)
		}
		return d
	}
	return time.Minute
}

// TestMCSTwoClusters runs two real kube-apiservers (clusters east and west) and one shared real
// etcd registry, with one registrar per cluster (east gets a standby later), each running as its
// ServiceAccount with the RBAC of deploy/registrar. The phases share the clusters and use their
// own namespaces.
func TestMCSTwoClusters(t *testing.T) {
	regSrv := startRegistryServer(t)
	var east, west *cluster
	var wg sync.WaitGroup
	wg.Add(2)
	// Both API servers start at once (newCluster fails the test from its goroutine on error).
	go func() { defer wg.Done(); east = newCluster(t, "east") }()
	go func() { defer wg.Done(); west = newCluster(t, "west") }()
	wg.Wait()
	if east == nil || west == nil {
		t.FailNow()
	}
	eastA := startRegistrar(t, east, regSrv.Endpoints, "east-1")
	westR := startRegistrar(t, west, regSrv.Endpoints, "west")
	eastA.waitElected(t)
	westR.waitElected(t)
	ctx := context.Background()
	// The shipped Deployment is valid for a real API server (strict server-side dry run).
	applyYAML(t, east.c, "deploy/registrar/deployment.yaml", client.DryRunAll, client.FieldValidation("Strict"))
	suite := t // registrars started in a phase but used by later ones live as long as the suite

	t.Run("ExportImportsInBothClustersAndUnexportRemoves", func(t *testing.T) {
		for _, cl := range []*cluster{east, west} {
			cl.createNS(t, "shop")
		}
		east.createService(t, "shop", "cart",
			port{name: "http", port: 80, tgt: 8080, appProto: "http"},
			port{name: "grpc", port: 9090, tgt: 9090, appProto: "grpc"},
			port{name: "db", port: 5432, tgt: 5432, appProto: "tcp"})
		east.export(t, "shop", "cart")
		var si *mcsv1beta1.ServiceImport
		took := testenv.Eventually(t, converge, "import of shop/cart in west", func() (err error) {
			si, err = west.imported("shop", "cart", []int32{80, 9090, 5432}, "east")
			return err
		})
		t.Logf("export in east -> ServiceImport and clusterset VIP in west: %s", took)
		testenv.Eventually(t, converge, "import of shop/cart in east", func() error {
			_, err := east.imported("shop", "cart", []int32{80, 9090, 5432}, "east")
			return err
		})
		testenv.Eventually(t, converge, "ServiceExport conditions", func() error {
			for _, c := range []struct {
				typ    mcsv1beta1.ServiceExportConditionType
				status metav1.ConditionStatus
				reason mcsv1beta1.ServiceExportConditionReason
			}{
				{mcsv1beta1.ServiceExportConditionValid, metav1.ConditionTrue, mcsv1beta1.ServiceExportReasonValid},
				{mcsv1beta1.ServiceExportConditionReady, metav1.ConditionTrue, mcsv1beta1.ServiceExportReasonExported},
				{mcsv1beta1.ServiceExportConditionConflict, metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonNoConflicts},
			} {
				if err := east.wantCond("shop", "cart", c.typ, c.status, string(c.reason)); err != nil {
					return err
				}
			}
			return nil
		})
		// Application protocols survive the trip (HTTP is the default and stays unset).
		var apps []string
		for _, p := range si.Spec.Ports {
			a := ""
			if p.AppProtocol != nil {
				a = *p.AppProtocol
			}
			apps = append(apps, p.Name+"="+a)
		}
		if got := fmt.Sprint(apps); got != "[http= grpc=grpc db=tcp]" {
			t.Errorf("import appProtocols = %s", got)
		}
		// The agents' model sees the clusterset VIP exactly as the registrar wrote it.
		assertModelImports(t, west, regSrv, "shop", "cart", si.Spec.IPs[0])

		// A ServiceImport deleted by hand comes back with the same clusterset VIP.
		vip := si.Spec.IPs[0]
		if err := west.c.Delete(ctx, si); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "ServiceImport recreated with the same VIP", func() error {
			got, err := west.imported("shop", "cart", []int32{80, 9090, 5432}, "east")
			if err == nil && (got.UID == si.UID || got.Spec.IPs[0] != vip) {
				return fmt.Errorf("uid %s (was %s), ips %v (was %s)", got.UID, si.UID, got.Spec.IPs, vip)
			}
			return err
		})
		// A port change of the exported Service reaches the imports.
		var svc corev1.Service
		if err := east.c.Get(ctx, types.NamespacedName{Namespace: "shop", Name: "cart"}, &svc); err != nil {
			t.Fatal(err)
		}
		svc.Spec.Ports = svc.Spec.Ports[:2]
		if err := east.c.Update(ctx, &svc); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "port change imported in west", func() error {
			_, err := west.imported("shop", "cart", []int32{80, 9090}, "east")
			return err
		})

		east.unexport(t, "shop", "cart")
		took = testenv.Eventually(t, converge, "removal in west", func() error { return west.gone("shop", "cart") })
		t.Logf("unexport in east -> removed in west: %s", took)
		testenv.Eventually(t, converge, "removal in east", func() error { return east.gone("shop", "cart") })
	})

	t.Run("InvalidExports", func(t *testing.T) {
		east.createNS(t, "invalid")
		west.createNS(t, "invalid")
		east.export(t, "invalid", "later")
		testenv.Eventually(t, converge, "NoService", func() error {
			return east.wantCond("invalid", "later", mcsv1beta1.ServiceExportConditionValid, metav1.ConditionFalse, string(mcsv1beta1.ServiceExportReasonNoService))
		})
		ext := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "invalid", Name: "ext"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.org"}}
		if err := east.c.Create(ctx, ext); err != nil {
			t.Fatal(err)
		}
		east.export(t, "invalid", "ext")
		testenv.Eventually(t, converge, "InvalidServiceType", func() error {
			return east.wantCond("invalid", "ext", mcsv1beta1.ServiceExportConditionValid, metav1.ConditionFalse, string(mcsv1beta1.ServiceExportReasonInvalidServiceType))
		})
		// The backing Service appears: the export becomes valid and is imported.
		east.createService(t, "invalid", "later", port{name: "http", port: 80, tgt: 8080})
		testenv.Eventually(t, converge, "late Service imported in west", func() error {
			_, err := west.imported("invalid", "later", []int32{80}, "east")
			return err
		})
		if err := west.gone("invalid", "ext"); err != nil {
			t.Error(err)
		}
		// An exported label of aether's own is refused, naming the key; without it the
		// service is exported.
		east.createService(t, "invalid", "labelled", port{name: "http", port: 80, tgt: 8080})
		east.exportWith(t, "invalid", "labelled", func(se *mcsv1beta1.ServiceExport) {
			se.Spec.ExportedLabels = map[string]string{model.LabelManagedBy: "someone-else"}
		})
		testenv.Eventually(t, converge, "InvalidExportedMetadata", func() error {
			return east.wantCond("invalid", "labelled", mcsv1beta1.ServiceExportConditionValid, metav1.ConditionFalse, "InvalidExportedMetadata")
		})
		if c, _ := east.exportCond("invalid", "labelled", mcsv1beta1.ServiceExportConditionValid); !strings.Contains(c.Message, model.LabelManagedBy) {
			t.Errorf("Valid message does not name the key: %s", c.Message)
		}
		if err := west.gone("invalid", "labelled"); err != nil {
			t.Error(err)
		}
		var se mcsv1beta1.ServiceExport
		if err := east.c.Get(ctx, types.NamespacedName{Namespace: "invalid", Name: "labelled"}, &se); err != nil {
			t.Fatal(err)
		}
		se.Spec.ExportedLabels = map[string]string{"team": "invalid"}
		if err := east.c.Update(ctx, &se); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "labelled imported once the reserved key is gone", func() error {
			si, err := west.imported("invalid", "labelled", []int32{80}, "east")
			if err == nil && (si.Labels["team"] != "invalid" || si.Labels[model.LabelManagedBy] != model.ManagedByAether) {
				return fmt.Errorf("import labels %v", si.Labels)
			}
			return err
		})
	})

	t.Run("NamespaceMissingIsReported", func(t *testing.T) {
		east.createNS(t, "only-east")
		east.createService(t, "only-east", "api", port{name: "http", port: 80, tgt: 8080})
		east.export(t, "only-east", "api")
		testenv.Eventually(t, converge, "import in east", func() error {
			_, err := east.imported("only-east", "api", []int32{80}, "east")
			return err
		})
		testenv.Eventually(t, converge, "NamespaceMissing event and metric in west", func() error {
			var evs eventsv1.EventList
			if err := west.c.List(ctx, &evs, client.InNamespace("default")); err != nil {
				return err
			}
			found := slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
				return e.Reason == "NamespaceMissing" && e.Regarding.Kind == "Namespace" && e.Regarding.Name == "only-east"
			})
			if !found {
				return fmt.Errorf("no NamespaceMissing event for only-east among %d events", len(evs.Items))
			}
			if g := westR.gauge(t, "aether_registrar_imports_missing_namespace"); g != 1 {
				return fmt.Errorf("aether_registrar_imports_missing_namespace = %v, want 1", g)
			}
			return nil
		})
		var list mcsv1beta1.ServiceImportList
		if err := west.c.List(ctx, &list, client.InNamespace("only-east")); err != nil || len(list.Items) != 0 {
			t.Fatalf("west has ServiceImports in a namespace it does not have: %d (%v)", len(list.Items), err)
		}
		// The namespace appears: the import follows, the gap closes.
		west.createNS(t, "only-east")
		testenv.Eventually(t, converge, "import after the namespace appeared", func() error {
			_, err := west.imported("only-east", "api", []int32{80}, "east")
			return err
		})
		testenv.Eventually(t, converge, "gauge back to 0", func() error {
			if g := westR.gauge(t, "aether_registrar_imports_missing_namespace"); g != 0 {
				return fmt.Errorf("gauge %v", g)
			}
			return nil
		})
	})

	t.Run("ObjectsNotCreatedByAetherAreNeverTouched", func(t *testing.T) {
		for _, cl := range []*cluster{east, west} {
			cl.createNS(t, "foreign")
		}
		// west already has a ServiceImport "pay" from someone else, and a Service named like a
		// clusterset Service for "ledger".
		foreignSI := &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "foreign", Name: "pay"},
			Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, Ports: []mcsv1beta1.ServicePort{{Port: 1234, Protocol: corev1.ProtocolTCP}}}}
		if err := west.c.Create(ctx, foreignSI); err != nil {
			t.Fatal(err)
		}
		foreignSvc := west.createService(t, "foreign", "ledger-clusterset", port{name: "x", port: 1, tgt: 1})
		for _, n := range []string{"pay", "ledger"} {
			east.createService(t, "foreign", n, port{name: "http", port: 80, tgt: 8080})
			east.export(t, "foreign", n)
		}
		testenv.Eventually(t, converge, "imported in east, blocked in west", func() error {
			for _, n := range []string{"pay", "ledger"} {
				if _, err := east.imported("foreign", n, []int32{80}, "east"); err != nil {
					return err
				}
			}
			if g := westR.gauge(t, "aether_registrar_imports_blocked"); g != 2 {
				return fmt.Errorf("aether_registrar_imports_blocked = %v, want 2", g)
			}
			return nil
		})
		for _, n := range []string{"pay", "ledger"} {
			east.unexport(t, "foreign", n)
		}
		testenv.Eventually(t, converge, "removed in east", func() error {
			return errorsJoin(east.gone("foreign", "pay"), east.gone("foreign", "ledger"))
		})
		var si mcsv1beta1.ServiceImport
		if err := west.c.Get(ctx, client.ObjectKeyFromObject(foreignSI), &si); err != nil || si.ResourceVersion != foreignSI.ResourceVersion {
			t.Errorf("foreign ServiceImport changed or deleted: rv %q -> %q (%v)", foreignSI.ResourceVersion, si.ResourceVersion, err)
		}
		var svc corev1.Service
		if err := west.c.Get(ctx, client.ObjectKeyFromObject(foreignSvc), &svc); err != nil || svc.ResourceVersion != foreignSvc.ResourceVersion {
			t.Errorf("foreign Service changed or deleted: rv %q -> %q (%v)", foreignSvc.ResourceVersion, svc.ResourceVersion, err)
		}
		var ledger mcsv1beta1.ServiceImport
		if err := west.c.Get(ctx, types.NamespacedName{Namespace: "foreign", Name: "ledger"}, &ledger); !apierrors.IsNotFound(err) {
			t.Errorf("west imported ledger without its clusterset Service: %v", err)
		}
	})

	// Conflict: inventory is exported by both clusters; west exports first, so west's definition
	// of the port they define differently (http: 80 in west, 8000 in east) wins although "east"
	// sorts first by name; grpc is the same in both and east alone has admin. The ServiceImport
	// gets the union, KEP-1645's per-port merge, and both exports Conflict=True PortConflict; the
	// exported labels and annotations (the same in both) are carried. The outcome is watched
	// while the rest of the suite (leader change, registry outage) runs.
	var flap *flapWatcher
	t.Run("ConflictPerPortOldestExportWins", func(t *testing.T) {
		for _, cl := range []*cluster{east, west} {
			cl.createNS(t, "stock")
		}
		west.createService(t, "stock", "inventory", port{name: "http", port: 80, tgt: 8080}, port{name: "grpc", port: 9090, tgt: 9090, appProto: "grpc"})
		east.createService(t, "stock", "inventory", port{name: "http", port: 8000, tgt: 8080}, port{name: "grpc", port: 9090, tgt: 9091, appProto: "grpc"},
			port{name: "admin", port: 7070, tgt: 7070, appProto: "tcp"})
		labelled := func(se *mcsv1beta1.ServiceExport) {
			se.Spec.ExportedLabels = map[string]string{"team": "stock"}
			se.Spec.ExportedAnnotations = map[string]string{"example.com/owner": "stock team"}
		}
		se := west.exportWith(t, "stock", "inventory", labelled)
		// creationTimestamp has one-second resolution: make east's export strictly younger.
		time.Sleep(time.Until(se.CreationTimestamp.Add(1100 * time.Millisecond)))
		east.exportWith(t, "stock", "inventory", labelled)
		union := []int32{80, 9090, 7070}
		testenv.Eventually(t, converge, "per-port conflict resolved for west", func() error {
			for _, cl := range []*cluster{east, west} {
				if err := cl.wantCond("stock", "inventory", mcsv1beta1.ServiceExportConditionConflict, metav1.ConditionTrue, string(mcsv1beta1.ServiceExportReasonPortConflict)); err != nil {
					return err
				}
				si, err := cl.imported("stock", "inventory", union, "east", "west")
				if err != nil {
					return err
				}
				if si.Labels["team"] != "stock" || si.Annotations["example.com/owner"] != "stock team" {
					return fmt.Errorf("%s: import labels %v, annotations %v: exported ones missing", cl.name, si.Labels, si.Annotations)
				}
			}
			return nil
		})
		for _, cl := range []*cluster{east, west} {
			c, _ := cl.exportCond("stock", "inventory", mcsv1beta1.ServiceExportConditionConflict)
			t.Logf("%s's Conflict condition: %s", cl.name, c.Message)
			if !strings.Contains(c.Message, `port "http" 80/HTTP from cluster west`) {
				t.Errorf("%s's Conflict message does not name the port and the winning cluster: %s", cl.name, c.Message)
			}
		}
		if c, _ := east.exportCond("stock", "inventory", mcsv1beta1.ServiceExportConditionConflict); !strings.Contains(c.Message, `this export's port "http" 8000/HTTP is not imported`) {
			t.Errorf("east's Conflict message does not say its http port is not imported: %s", c.Message)
		}
		for name, in := range map[string]*instance{"east": eastA, "west": westR} {
			if g := in.gauge(t, "aether_registrar_export_conflicts"); g != 1 {
				t.Errorf("%s aether_registrar_export_conflicts = %v, want 1", name, g)
			}
		}
		// The agents' model (from the real marks): in west, http reaches only west's pods (east
		// defines it otherwise), grpc both clusters' pods.
		assertPortTraffic(t, west, regSrv, "stock", "inventory", map[string]string{"http": "west", "grpc": "east,west"})
		flap = startFlapWatcher(t, []*cluster{east, west}, "stock", "inventory")
	})

	t.Run("StandbyTakesOverOnLeaderLoss", func(t *testing.T) {
		for _, cl := range []*cluster{east, west} {
			cl.createNS(t, "fleet")
		}
		standby := startRegistrar(suite, east, regSrv.Endpoints, "east-2")
		for i := range 10 {
			n := "svc-" + strconv.Itoa(i)
			east.createService(t, "fleet", n, port{name: "http", port: 80, tgt: 8080})
			east.export(t, "fleet", n)
		}
		want := func(names ...string) func() error {
			return func() error {
				for _, cl := range []*cluster{east, west} {
					if err := cl.exactlyImported("fleet", names); err != nil {
						return err
					}
				}
				return nil
			}
		}
		names := func(from, to int) []string {
			var out []string
			for i := from; i < to; i++ {
				out = append(out, "svc-"+strconv.Itoa(i))
			}
			return out
		}
		testenv.Eventually(t, converge, "10 imports before the leader change", want(names(0, 10)...))
		before := uids(t, west, "fleet")
		select {
		case <-standby.r.Elected():
			t.Fatal("standby elected while the leader runs")
		default:
		}
		// The leader dies without releasing its lease; changes made meanwhile wait for the standby.
		eastA.stop()
		for i := 10; i < 15; i++ {
			n := "svc-" + strconv.Itoa(i)
			east.createService(t, "fleet", n, port{name: "http", port: 80, tgt: 8080})
			east.export(t, "fleet", n)
		}
		for i := range 3 {
			east.unexport(t, "fleet", "svc-"+strconv.Itoa(i))
		}
		start := time.Now()
		standby.waitElected(t)
		t.Logf("standby elected %s after the leader stopped", time.Since(start))
		took := testenv.Eventually(t, converge, "12 imports after the leader change", want(names(3, 15)...))
		t.Logf("converged %s after the standby was elected", took)
		after := uids(t, west, "fleet")
		for n, uid := range before {
			if a, ok := after[n]; ok && a != uid {
				t.Errorf("%s was recreated across the leader change (uid %s -> %s)", n, uid, a)
			}
		}
		eastA = standby
	})

	t.Run("RegistryOutageDeletesNothingAndConverges", func(t *testing.T) {
		regSrv.stop()
		testenv.Eventually(t, converge, "registrars not ready", func() error {
			for name, in := range map[string]*instance{"east": eastA, "west": westR} {
				if in.r.Ready() == nil {
					return fmt.Errorf("%s still ready with the registry stopped", name)
				}
			}
			return nil
		})
		east.unexport(t, "fleet", "svc-3")
		east.createService(t, "fleet", "svc-new", port{name: "http", port: 80, tgt: 8080})
		east.export(t, "fleet", "svc-new")
		testenv.Eventually(t, converge, "new export pending", func() error {
			return east.wantCond("fleet", "svc-new", mcsv1beta1.ServiceExportConditionReady, metav1.ConditionFalse, string(mcsv1beta1.ServiceExportReasonPending))
		})
		// west's registrar restarts during the outage: the new leader cannot read the registry,
		// so it must not take "no export view" for "nothing exported".
		westR.stop()
		westR = startRegistrar(suite, west, regSrv.Endpoints, "west-2")
		westR.waitElected(t)
		// A while without the registry: every import stays, in both clusters.
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			for _, cl := range []*cluster{east, west} {
				if err := cl.exactlyImported("fleet", namesRange(3, 15)); err != nil {
					t.Fatalf("during the outage: %v", err)
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		restart := time.Now()
		regSrv.start()
		testenv.Eventually(t, converge, "ready again", func() error {
			return errorsJoin(eastA.r.Ready(), westR.r.Ready())
		})
		took := testenv.Eventually(t, converge, "converged after the registry returned", func() error {
			for _, cl := range []*cluster{east, west} {
				if err := cl.exactlyImported("fleet", append(namesRange(4, 15), "svc-new")); err != nil {
					return err
				}
			}
			return nil
		})
		t.Logf("converged %s after both registrars were ready again; %s from starting the registry again to converged", took, time.Since(restart))
	})

	if flap == nil {
		return
	}
	flap.finish(t, flapWatch(t))

	t.Run("WinnerUnexportHandsOverToNextOldest", func(t *testing.T) {
		west.unexport(t, "stock", "inventory")
		testenv.Eventually(t, converge, "east's export defines the service", func() error {
			return errorsJoin(
				east.wantCond("stock", "inventory", mcsv1beta1.ServiceExportConditionConflict, metav1.ConditionFalse, string(mcsv1beta1.ServiceExportReasonNoConflicts)),
				func() error {
					_, err := east.imported("stock", "inventory", []int32{8000, 9090, 7070}, "east")
					return err
				}(),
				func() error {
					_, err := west.imported("stock", "inventory", []int32{8000, 9090, 7070}, "east")
					return err
				}(),
			)
		})
		if g := eastA.gauge(t, "aether_registrar_export_conflicts"); g != 0 {
			t.Errorf("east aether_registrar_export_conflicts = %v, want 0", g)
		}
	})
}

func namesRange(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, "svc-"+strconv.Itoa(i))
	}
	return out
}

func errorsJoin(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// exactlyImported checks that ns holds exactly names as aether's ServiceImports, each with one
// clusterset Service, and no other aether objects (no duplicates, none lost).
func (cl *cluster) exactlyImported(ns string, names []string) error {
	ctx := context.Background()
	var sis mcsv1beta1.ServiceImportList
	if err := cl.c.List(ctx, &sis, client.InNamespace(ns), client.MatchingLabels{model.LabelManagedBy: model.ManagedByAether}); err != nil {
		return err
	}
	var svcs corev1.ServiceList
	if err := cl.c.List(ctx, &svcs, client.InNamespace(ns), client.MatchingLabels{model.LabelManagedBy: model.ManagedByAether}); err != nil {
		return err
	}
	var gotSI, gotSvc []string
	for _, si := range sis.Items {
		if len(si.Spec.IPs) == 0 {
			return fmt.Errorf("%s: ServiceImport %s has no ips yet", cl.name, si.Name)
		}
		gotSI = append(gotSI, si.Name)
	}
	for _, s := range svcs.Items {
		gotSvc = append(gotSvc, s.Name)
	}
	var wantSvc []string
	for _, n := range names {
		wantSvc = append(wantSvc, n+model.ClustersetServiceSuffix)
	}
	slices.Sort(gotSI)
	slices.Sort(gotSvc)
	w := slices.Sorted(slices.Values(names))
	slices.Sort(wantSvc)
	if !slices.Equal(gotSI, w) || !slices.Equal(gotSvc, wantSvc) {
		return fmt.Errorf("%s: imports %v and clusterset Services %v, want %v", cl.name, gotSI, gotSvc, w)
	}
	return nil
}

func uids(t *testing.T, cl *cluster, ns string) map[string]types.UID {
	var sis mcsv1beta1.ServiceImportList
	if err := cl.c.List(context.Background(), &sis, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, si := range sis.Items {
		out[si.Name] = si.UID
	}
	return out
}

// agentSources reads cl's Services and ServiceImports of ns and the registry's export marks
// (with their ports, registry.ToModelExport) into model.Sources, as an agent of cl joins them.
func agentSources(t *testing.T, cl *cluster, srv *registryServer, ns string) model.Sources {
	t.Helper()
	ctx := context.Background()
	var svcs corev1.ServiceList
	var sis mcsv1beta1.ServiceImportList
	if err := errorsJoin(cl.c.List(ctx, &svcs, client.InNamespace(ns)), cl.c.List(ctx, &sis, client.InNamespace(ns))); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(registry.Config{Endpoints: srv.Endpoints, Region: region, Cluster: cl.name})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	marks, _, err := reg.ListExports(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := model.Sources{Cluster: cl.name, MeshDomain: "mesh", TrustDomain: "aether.internal", MeshNamespaces: map[string]bool{ns: true}}
	for i := range svcs.Items {
		in.Services = append(in.Services, &svcs.Items[i])
	}
	for i := range sis.Items {
		in.Imports = append(in.Imports, &sis.Items[i])
	}
	for _, m := range marks {
		in.Exports = append(in.Exports, registry.ToModelExport(m))
	}
	return in
}

// assertModelImports joins cl's Services and ServiceImports with the registry's export marks the
// way an agent does (model.Assemble) and checks that ns/name is an imported service with the
// clusterset VIP vip.
func assertModelImports(t *testing.T, cl *cluster, srv *registryServer, ns, name, vip string) {
	t.Helper()
	mesh := model.Assemble(1, agentSources(t, cl, srv, ns))
	want := netip.MustParseAddr(vip)
	for _, s := range mesh.Services {
		if s.Key == (model.ServiceKey{Namespace: ns, Name: name}) {
			if !s.Imported || !slices.Contains(s.ClustersetVIPs, want) {
				t.Errorf("model service %s: imported %v, clusterset VIPs %v, want %s", s.Key, s.Imported, s.ClustersetVIPs, vip)
			}
			return
		}
	}
	t.Errorf("model of %s has no service %s/%s", cl.name, ns, name)
}

// exportWith creates ServiceExport ns/name changed by mod and returns it as created.
func (cl *cluster) exportWith(t testing.TB, ns, name string, mod func(*mcsv1beta1.ServiceExport)) *mcsv1beta1.ServiceExport {
	t.Helper()
	se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	mod(se)
	if err := cl.c.Create(context.Background(), se); err != nil {
		t.Fatalf("%s: create ServiceExport %s/%s: %v", cl.name, ns, name, err)
	}
	return se
}

// assertPortTraffic joins cl's objects with the registry's export marks the way an agent does
// (agentSources, model.Assemble), adds one endpoint of ns/name from each exporting cluster
// (registered under each of its export's port names with its target port: the test has no
// agents), and checks, for each port name in want, the clusters whose endpoint serves it
// (sorted, comma-separated).
func assertPortTraffic(t *testing.T, cl *cluster, srv *registryServer, ns, name string, want map[string]string) {
	t.Helper()
	key := model.ServiceKey{Namespace: ns, Name: name}
	in := agentSources(t, cl, srv, ns)
	for _, x := range in.Exports {
		if x.Service != key {
			continue
		}
		ep := model.Endpoint{Service: key, Cluster: x.Cluster, Region: x.Region, PodUID: x.Cluster + "-pod", Healthy: true}
		for _, p := range x.Ports {
			ep.Ports = append(ep.Ports, model.EndpointPort{Name: p.Name, Port: p.TargetPort, Protocol: p.Protocol})
		}
		in.Endpoints = append(in.Endpoints, ep)
	}
	mesh := model.Assemble(1, in)
	s := mesh.Service(key)
	if s == nil {
		t.Fatalf("model of %s has no service %s", cl.name, key)
	}
	for portName, clusters := range want {
		var got []string
		for _, sp := range s.Ports {
			if sp.Name != portName {
				continue
			}
			for i := range mesh.Endpoints[key] {
				if _, ok := sp.EndpointPort(&mesh.Endpoints[key][i], mesh.Cluster); ok {
					got = append(got, mesh.Endpoints[key][i].Cluster)
				}
			}
		}
		slices.Sort(got)
		if strings.Join(got, ",") != clusters {
			t.Errorf("model of %s: %s port %s reaches clusters %v, want %s", cl.name, key, portName, got, clusters)
		}
	}
}

// flapWatcher polls a conflicted service in every cluster and records any change of its
// ServiceExport conditions or of the ServiceImport and clusterset Service (resourceVersion).
type flapWatcher struct {
	start  time.Time
	stopCh chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	errs   []string
	polls  int
}

func startFlapWatcher(t *testing.T, cls []*cluster, ns, name string) *flapWatcher {
	w := &flapWatcher{start: time.Now(), stopCh: make(chan struct{}), done: make(chan struct{})}
	snapshot := func() (string, error) {
		ctx := context.Background()
		s := ""
		for _, cl := range cls {
			var se mcsv1beta1.ServiceExport
			var si mcsv1beta1.ServiceImport
			var cs corev1.Service
			if err := errorsJoin(
				cl.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &se),
				cl.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &si),
				cl.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + model.ClustersetServiceSuffix}, &cs)); err != nil {
				return "", err
			}
			s += fmt.Sprintf("%s: export rv %s conditions %v; import rv %s; service rv %s\n", cl.name, se.ResourceVersion, se.Status.Conditions, si.ResourceVersion, cs.ResourceVersion)
		}
		return s, nil
	}
	first, err := snapshot()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stopCh:
				return
			case <-tick.C:
			}
			s, err := snapshot()
			w.mu.Lock()
			w.polls++
			if err != nil {
				w.errs = append(w.errs, err.Error())
			} else if s != first {
				w.errs = append(w.errs, fmt.Sprintf("changed after %s:\nwas:\n%s\nnow:\n%s", time.Since(w.start), first, s))
				first = s
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// finish waits until the watch has lasted d, stops it and fails the test on any change.
func (w *flapWatcher) finish(t *testing.T, d time.Duration) {
	time.Sleep(time.Until(w.start.Add(d)))
	close(w.stopCh)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("conflict outcome watched for %s (%d polls, across the leader change and the registry outage)", time.Since(w.start).Round(time.Second), w.polls)
	for _, e := range w.errs {
		t.Errorf("conflict outcome flapped: %s", e)
	}
}
