package registrar_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	"sigs.k8s.io/yaml"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/routestatus"
	"github.com/aethermesh/aether/registry"
)

func ptrTo[T any](v T) *T { return &v }

func svcParent(name string, port int32) gwv1.ParentReference {
	p := gwv1.ParentReference{Group: ptrTo(gwv1.Group("")), Kind: ptrTo(gwv1.Kind("Service")), Name: gwv1.ObjectName(name)}
	if port > 0 {
		p.Port = ptrTo(gwv1.PortNumber(port))
	}
	return p
}

func importParent(name string, port int32) gwv1.ParentReference {
	p := svcParent(name, port)
	p.Group, p.Kind = ptrTo(gwv1.Group(mcsv1beta1.GroupName)), ptrTo(gwv1.Kind("ServiceImport"))
	return p
}

func backend(name string, port int32) gwv1.BackendRef {
	return gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{
		Group: ptrTo(gwv1.Group("")), Kind: ptrTo(gwv1.Kind("Service")), Name: gwv1.ObjectName(name), Port: ptrTo(gwv1.PortNumber(port)),
	}}
}

func importBackend(name string, port int32) gwv1.BackendRef {
	b := backend(name, port)
	b.Group, b.Kind = ptrTo(gwv1.Group(mcsv1beta1.GroupName)), ptrTo(gwv1.Kind("ServiceImport"))
	return b
}

func httpRoute(ns, name string, parents []gwv1.ParentReference, backends ...gwv1.BackendRef) *gwv1.HTTPRoute {
	r := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	r.Spec.ParentRefs = parents
	rule := gwv1.HTTPRouteRule{}
	for _, b := range backends {
		rule.BackendRefs = append(rule.BackendRefs, gwv1.HTTPBackendRef{BackendRef: b})
	}
	r.Spec.Rules = []gwv1.HTTPRouteRule{rule}
	return r
}

func grpcRoute(ns, name string, parents []gwv1.ParentReference, backends ...gwv1.BackendRef) *gwv1.GRPCRoute {
	r := &gwv1.GRPCRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	r.Spec.ParentRefs = parents
	rule := gwv1.GRPCRouteRule{}
	for _, b := range backends {
		rule.BackendRefs = append(rule.BackendRefs, gwv1.GRPCBackendRef{BackendRef: b})
	}
	r.Spec.Rules = []gwv1.GRPCRouteRule{rule}
	return r
}

// wantCond says what one condition of aether's entry for a parentRef must be.
type wantCond struct {
	typ    gwv1.RouteConditionType
	status metav1.ConditionStatus
	reason string
}

// checkParent checks the route's status entries of aether for spec.parentRefs[index]: exactly
// one, its parentRef equal to the spec's, each wanted condition with observedGeneration = the
// route's generation, and PartiallyInvalid only when wanted. It returns the entry.
func checkParent(what string, gen int64, refs []gwv1.ParentReference, parents []gwv1.RouteParentStatus, index int, conds ...wantCond) (*gwv1.RouteParentStatus, error) {
	var found *gwv1.RouteParentStatus
	for i, p := range parents {
		if p.ControllerName != model.GatewayControllerName || !equality.Semantic.DeepEqual(p.ParentRef, refs[index]) {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("%s: two entries of aether for parentRefs[%d]", what, index)
		}
		found = &parents[i]
	}
	if found == nil {
		return nil, fmt.Errorf("%s: no entry of aether for parentRefs[%d] (%+v) in %+v", what, index, refs[index], parents)
	}
	partial := false
	for _, w := range conds {
		c := meta.FindStatusCondition(found.Conditions, string(w.typ))
		if c == nil || c.Status != w.status || c.Reason != w.reason || c.ObservedGeneration != gen {
			return nil, fmt.Errorf("%s: parentRefs[%d] condition %s = %+v, want %s/%s at generation %d", what, index, w.typ, c, w.status, w.reason, gen)
		}
		partial = partial || w.typ == gwv1.RouteConditionPartiallyInvalid
	}
	if c := meta.FindStatusCondition(found.Conditions, string(gwv1.RouteConditionPartiallyInvalid)); c != nil && !partial {
		return nil, fmt.Errorf("%s: parentRefs[%d] has PartiallyInvalid %+v", what, index, c)
	}
	return found, nil
}

// ours counts aether's entries in parents.
func ours(parents []gwv1.RouteParentStatus) int {
	n := 0
	for _, p := range parents {
		if p.ControllerName == model.GatewayControllerName {
			n++
		}
	}
	return n
}

// counter sums the samples of a counter of the instance's metrics.
func (in *instance) counter(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := in.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.Metric {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

const (
	metricPasses = "aether_registrar_route_status_passes_total"
	metricWrites = "aether_registrar_route_status_writes_total"
)

var (
	acceptedTrue  = wantCond{gwv1.RouteConditionAccepted, metav1.ConditionTrue, string(gwv1.RouteReasonAccepted)}
	resolvedTrue  = wantCond{gwv1.RouteConditionResolvedRefs, metav1.ConditionTrue, string(gwv1.RouteReasonResolvedRefs)}
	foreignCtrl   = gwv1.GatewayController("example.net/gateway-controller")
	foreignParent = gwv1.ParentReference{Group: ptrTo(gwv1.Group(gwv1.GroupName)), Kind: ptrTo(gwv1.Kind("Gateway")), Name: "edge"}
)

// TestRouteStatus runs a registrar (as its ServiceAccount, with deploy/registrar's RBAC, and a
// standby) against a real kube-apiserver with the Gateway API CRDs and checks the status it writes
// for GAMMA routes: an accepted producer route, a missing backend, a parent Service without the
// port, an HTTPRoute losing to a GRPCRoute on one port, a ServiceImport parent, a route with a
// Gateway parentRef and another controller's entry (both left alone), a spec change (the
// generation followed, lastTransitionTime kept), a removed parentRef (its entry removed), no
// write when nothing changed, and no pass at all on the standby.
func TestRouteStatus(t *testing.T) {
	regSrv := startRegistryServer(t)
	cl := newCluster(t, "east")
	leader := startRegistrar(t, cl, regSrv.Endpoints, "east-1")
	leader.waitElected(t)
	standby := startRegistrar(t, cl, regSrv.Endpoints, "east-2")
	gw := gwclient.NewForConfigOrDie(cl.api.Config)
	ctx := context.Background()

	const ns = "gamma"
	if err := cl.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}); err != nil {
		t.Fatal(err)
	}
	cl.createService(t, ns, "cart",
		port{name: "http", port: 80, tgt: 8080, appProto: "http"},
		port{name: "grpc", port: 9090, tgt: 9090, appProto: "grpc"})
	cl.createService(t, ns, "api", port{name: "http", port: 8080, tgt: 8080, appProto: "http"})
	// A ServiceImport as an MCS implementation leaves it (not aether's: the registrar's import
	// generator leaves it alone).
	si := &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "remote"},
		Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.96.200.10"},
			Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, AppProtocol: ptrTo("http")}}},
	}
	if err := cl.c.Create(ctx, si); err != nil {
		t.Fatal(err)
	}

	hr := gw.GatewayV1().HTTPRoutes(ns)
	gr := gw.GatewayV1().GRPCRoutes(ns)
	for _, r := range []*gwv1.HTTPRoute{
		httpRoute(ns, "producer", []gwv1.ParentReference{svcParent("cart", 80)}, backend("cart", 80)),
		httpRoute(ns, "missing-backend", []gwv1.ParentReference{svcParent("api", 0)}, backend("nope", 80)),
		httpRoute(ns, "no-port", []gwv1.ParentReference{svcParent("api", 9999)}, backend("api", 8080)),
		httpRoute(ns, "rpc-http", []gwv1.ParentReference{svcParent("cart", 9090)}, backend("cart", 9090)),
		httpRoute(ns, "imported", []gwv1.ParentReference{importParent("remote", 80)}, importBackend("remote", 80)),
		httpRoute(ns, "mixed", []gwv1.ParentReference{{Name: "edge"}}, backend("api", 8080)),
		httpRoute(ns, "pair", []gwv1.ParentReference{svcParent("api", 8080), importParent("remote", 80)}, backend("api", 8080)),
	} {
		if _, err := hr.Create(ctx, r, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create HTTPRoute %s: %v", r.Name, err)
		}
	}
	if _, err := gr.Create(ctx, grpcRoute(ns, "rpc", []gwv1.ParentReference{svcParent("cart", 9090)}, backend("cart", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Another controller (a Gateway's) writes its entry for the Gateway parentRef of "mixed";
	// then the route gets a Service parentRef too.
	theirs := gwv1.RouteParentStatus{ParentRef: foreignParent, ControllerName: foreignCtrl, Conditions: []metav1.Condition{{
		Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", Message: "edge takes it", ObservedGeneration: 1,
		LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
	}}}
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		r, err := hr.Get(ctx, "mixed", metav1.GetOptions{})
		if err != nil {
			return err
		}
		r.Status.Parents = append(r.Status.Parents, theirs)
		_, err = hr.UpdateStatus(ctx, r, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		r, err := hr.Get(ctx, "mixed", metav1.GetOptions{})
		if err != nil {
			return err
		}
		r.Spec.ParentRefs = append(r.Spec.ParentRefs, svcParent("api", 8080))
		_, err = hr.Update(ctx, r, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	http := func(name string) (*gwv1.HTTPRoute, error) { return hr.Get(ctx, name, metav1.GetOptions{}) }
	checkHTTP := func(name string, index int, conds ...wantCond) (*gwv1.HTTPRoute, *gwv1.RouteParentStatus, error) {
		r, err := http(name)
		if err != nil {
			return nil, nil, err
		}
		p, err := checkParent("HTTPRoute "+name, r.Generation, r.Spec.ParentRefs, r.Status.Parents, index, conds...)
		return r, p, err
	}
	took := testenv.Eventually(t, converge, "route status written", func() error {
		for _, c := range []struct {
			name  string
			index int
			conds []wantCond
		}{
			{"producer", 0, []wantCond{acceptedTrue, resolvedTrue}},
			{"missing-backend", 0, []wantCond{acceptedTrue, {gwv1.RouteConditionResolvedRefs, metav1.ConditionFalse, string(gwv1.RouteReasonBackendNotFound)}}},
			{"no-port", 0, []wantCond{{gwv1.RouteConditionAccepted, metav1.ConditionFalse, string(gwv1.RouteReasonNoMatchingParent)}, resolvedTrue}},
			{"rpc-http", 0, []wantCond{{gwv1.RouteConditionAccepted, metav1.ConditionFalse, model.ReasonConflicted}, resolvedTrue}},
			{"imported", 0, []wantCond{acceptedTrue, resolvedTrue}},
			{"mixed", 1, []wantCond{acceptedTrue, resolvedTrue}},
			{"pair", 0, []wantCond{acceptedTrue, resolvedTrue}},
			{"pair", 1, []wantCond{acceptedTrue, resolvedTrue}},
		} {
			if _, _, err := checkHTTP(c.name, c.index, c.conds...); err != nil {
				return err
			}
		}
		r, err := gr.Get(ctx, "rpc", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = checkParent("GRPCRoute rpc", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue)
		return err
	})
	t.Logf("routes created -> status written: %s", took)

	// "mixed": theirs first and as written (its observedGeneration too), then aether's one entry
	// (for the Service; none for the Gateway).
	mixed, err := http("mixed")
	if err != nil {
		t.Fatal(err)
	}
	if n := ours(mixed.Status.Parents); n != 1 || len(mixed.Status.Parents) != 2 || !equality.Semantic.DeepEqual(mixed.Status.Parents[0], theirs) {
		t.Errorf("HTTPRoute mixed status.parents = %+v; want the other controller's entry as written, then one of aether's", mixed.Status.Parents)
	}
	// What `kubectl get httproute mixed -o yaml` shows of it (docs/routing.md quotes it).
	if b, err := yaml.Marshal(map[string]any{"spec": map[string]any{"parentRefs": mixed.Spec.ParentRefs}, "status": mixed.Status}); err == nil {
		t.Logf("HTTPRoute mixed, generation %d:\n%s", mixed.Generation, b)
	}
	if mb, err := http("missing-backend"); err == nil {
		if b, err := yaml.Marshal(mb.Status); err == nil {
			t.Logf("HTTPRoute missing-backend status:\n%s", b)
		}
	}

	// A spec change: observedGeneration follows, an unchanged Accepted keeps its transition time.
	prod, before, err := checkHTTP("producer", 0, acceptedTrue, resolvedTrue)
	if err != nil {
		t.Fatal(err)
	}
	acceptedAt := meta.FindStatusCondition(before.Conditions, "Accepted").LastTransitionTime
	prod.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptrTo(gwv1.PathMatchPathPrefix), Value: ptrTo("/cart")}}}
	if prod, err = hr.Update(ctx, prod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, converge, "observedGeneration follows the spec change", func() error {
		r, p, err := checkHTTP("producer", 0, acceptedTrue, resolvedTrue)
		if err != nil {
			return err
		}
		if r.Generation != prod.Generation || r.Generation < 2 {
			return fmt.Errorf("generation %d, want %d", r.Generation, prod.Generation)
		}
		if at := meta.FindStatusCondition(p.Conditions, "Accepted").LastTransitionTime; !at.Equal(&acceptedAt) {
			return fmt.Errorf("Accepted lastTransitionTime %s, was %s: its status did not change", at, acceptedAt)
		}
		return nil
	})

	// A parentRef removed: its entry goes, the other stays.
	pair, err := http("pair")
	if err != nil {
		t.Fatal(err)
	}
	pair.Spec.ParentRefs = pair.Spec.ParentRefs[:1]
	if _, err := hr.Update(ctx, pair, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, converge, "the removed parentRef's entry removed", func() error {
		r, _, err := checkHTTP("pair", 0, acceptedTrue, resolvedTrue)
		if err != nil {
			return err
		}
		if n := len(r.Status.Parents); n != 1 {
			return fmt.Errorf("status.parents = %+v, want one entry", r.Status.Parents)
		}
		return nil
	})

	// Nothing changed: a pass (brought by an unrelated Service) writes nothing.
	rvs := func() map[string]string {
		out := map[string]string{}
		hl, err := hr.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range hl.Items {
			out["HTTPRoute "+r.Name] = r.ResourceVersion
		}
		gl, err := gr.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range gl.Items {
			out["GRPCRoute "+r.Name] = r.ResourceVersion
		}
		return out
	}
	// Let the passes our own last writes bring run out first.
	writes := leader.settle(t)
	rv := rvs()
	passes := leader.counter(t, metricPasses)
	cl.createService(t, ns, "unrelated", port{name: "http", port: 80, tgt: 80, appProto: "http"})
	testenv.Eventually(t, converge, "a pass after the unrelated change", func() error {
		if p := leader.counter(t, metricPasses); p <= passes {
			return fmt.Errorf("passes %v, was %v", p, passes)
		}
		return nil
	})
	time.Sleep(time.Second)
	if w := leader.counter(t, metricWrites); w != writes {
		t.Errorf("route status writes %v after a pass with nothing to change, were %v", w, writes)
	}
	if got := rvs(); !equality.Semantic.DeepEqual(got, rv) {
		t.Errorf("resourceVersions changed without a change: %v, were %v", got, rv)
	}
	if writes == 0 {
		t.Error("no route status write counted")
	}

	// The standby watches nothing and writes nothing.
	if p, w := standby.counter(t, metricPasses), standby.counter(t, metricWrites); p != 0 || w != 0 {
		t.Errorf("standby: %v passes, %v writes; want none", p, w)
	}
}

// TestRouteStatusFollowsCRDs runs a registrar against a real kube-apiserver that has only the MCS
// CRDs at first: it runs without route status, writes HTTPRoute status once the HTTPRoute CRD is
// installed, and GRPCRoute status once that CRD is too (the HTTPRoute then Conflicted by a
// GRPCRoute on the same port).
func TestRouteStatusFollowsCRDs(t *testing.T) {
	regSrv := startRegistryServer(t)
	cl := newClusterWithCRDs(t, "east", testenv.CRDSubset(t, "multicluster.x-k8s.io_serviceexports.yaml", "multicluster.x-k8s.io_serviceimports.yaml"))
	in := startRegistrar(t, cl, regSrv.Endpoints, "east", func(c *registrar.Config) { c.RouteCRDRecheck = 200 * time.Millisecond })
	in.waitElected(t)
	gw := gwclient.NewForConfigOrDie(cl.api.Config)
	ctx := context.Background()

	const ns = "gamma"
	if err := cl.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}); err != nil {
		t.Fatal(err)
	}
	cl.createService(t, ns, "cart", port{name: "grpc", port: 9090, tgt: 9090, appProto: "grpc"})
	// The registrar's other controllers run meanwhile: a ServiceExport is exported.
	cl.export(t, ns, "cart")
	testenv.Eventually(t, converge, "the export without route CRDs", func() error {
		return cl.wantCond(ns, "cart", mcsv1beta1.ServiceExportConditionReady, metav1.ConditionTrue, string(mcsv1beta1.ServiceExportReasonExported))
	})
	if p := in.counter(t, metricPasses); p != 0 {
		t.Errorf("%v route status passes without route CRDs", p)
	}

	testenv.InstallCRDs(t, cl.api.Config, testenv.CRDSubset(t, "gateway.networking.k8s.io_httproutes.yaml"))
	hr := gw.GatewayV1().HTTPRoutes(ns)
	if _, err := hr.Create(ctx, httpRoute(ns, "web", []gwv1.ParentReference{svcParent("cart", 9090)}, backend("cart", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := testenv.Eventually(t, converge, "HTTPRoute status once its CRD is installed", func() error {
		r, err := hr.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = checkParent("HTTPRoute web", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue)
		return err
	})
	t.Logf("HTTPRoute CRD installed -> status: %s", took)

	testenv.InstallCRDs(t, cl.api.Config, testenv.CRDSubset(t, "gateway.networking.k8s.io_grpcroutes.yaml"))
	gr := gw.GatewayV1().GRPCRoutes(ns)
	if _, err := gr.Create(ctx, grpcRoute(ns, "rpc", []gwv1.ParentReference{svcParent("cart", 9090)}, backend("cart", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, converge, "GRPCRoute status once its CRD is installed, the HTTPRoute Conflicted", func() error {
		r, err := gr.Get(ctx, "rpc", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, err := checkParent("GRPCRoute rpc", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue); err != nil {
			return err
		}
		h, err := hr.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = checkParent("HTTPRoute web", h.Generation, h.Spec.ParentRefs, h.Status.Parents, 0,
			wantCond{gwv1.RouteConditionAccepted, metav1.ConditionFalse, model.ReasonConflicted}, resolvedTrue)
		return err
	})
}

// sampleWith reads the sample of gauge or counter name whose label has value (-1 when absent).
func (in *instance) sampleWith(t testing.TB, name, label, value string) float64 {
	t.Helper()
	mfs, err := in.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue() // one of them is unset: 0
				}
			}
		}
	}
	return -1
}

// settle waits until the leader's route status passes and writes stop for a second (the passes
// its own writes bring have run out) and returns the writes counted.
func (in *instance) settle(t testing.TB) float64 {
	t.Helper()
	var writes float64
	testenv.Eventually(t, converge, "the route status writes settle", func() error {
		w, p := in.counter(t, metricWrites), in.counter(t, metricPasses)
		time.Sleep(time.Second)
		if w2, p2 := in.counter(t, metricWrites), in.counter(t, metricPasses); w2 != w || p2 != p {
			return fmt.Errorf("writes %v -> %v, passes %v -> %v within 1 s", w, w2, p, p2)
		}
		writes = w
		return nil
	})
	return writes
}

const (
	metricRefused   = "aether_registrar_route_status_refused_total"
	metricTruncated = "aether_registrar_route_status_truncated_routes"
	metricWatched   = "aether_registrar_route_status_watched"
)

// writeStatusAs replaces the entries of controller ctrl in route name's status.parents with
// entries (as that controller would, read-modify-write), as the admin.
func writeStatusAs(t testing.TB, hr interface {
	Get(context.Context, string, metav1.GetOptions) (*gwv1.HTTPRoute, error)
	UpdateStatus(context.Context, *gwv1.HTTPRoute, metav1.UpdateOptions) (*gwv1.HTTPRoute, error)
}, name string, ctrl gwv1.GatewayController, entries []gwv1.RouteParentStatus) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		r, err := hr.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []gwv1.RouteParentStatus
		for _, p := range r.Status.Parents {
			if p.ControllerName != ctrl {
				keep = append(keep, p)
			}
		}
		r.Status.Parents = append(keep, entries...)
		_, err = hr.UpdateStatus(context.Background(), r, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("write %s's status of HTTPRoute %s: %v", ctrl, name, err)
	}
}

// entriesFor returns one Accepted entry of controller ctrl per parentRef.
func entriesFor(ctrl gwv1.GatewayController, refs []gwv1.ParentReference) []gwv1.RouteParentStatus {
	var out []gwv1.RouteParentStatus
	for _, ref := range refs {
		out = append(out, gwv1.RouteParentStatus{ParentRef: ref, ControllerName: ctrl, Conditions: []metav1.Condition{{
			Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 1,
			LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		}}})
	}
	return out
}

// TestRouteStatusBounds runs a registrar (as its ServiceAccount) against a real kube-apiserver
// and checks what a route can make it write, and that nothing it cannot write loops:
//   - a route with 32 Service parentRefs (the most spec.parentRefs holds) gets 32 entries, and
//     one naming a Service twice (with and without its namespace) two, each echoing its own;
//   - status.parents holds at most 32 entries: with 30 entries of two other controllers, aether
//     writes its first 2 (of 4) parentRefs' entries, keeps the others' as written, counts the
//     route as truncated and does not retry; once the others leave room, all 4 are written;
//   - a route of 16 rules with 16 missing backends of 253-character names each gets a
//     ResolvedRefs message cut to routestatus.MaxMessage bytes;
//   - a status write the API server refuses as Invalid (a ValidatingAdmissionPolicy refuses it)
//     is counted once per route generation and not retried, and the other routes are written.
func TestRouteStatusBounds(t *testing.T) {
	regSrv := startRegistryServer(t)
	cl := newCluster(t, "east")
	ctx := context.Background()

	// The policy first, effective before the registrar writes: aether's status writes of a route
	// named "refused" are refused with reason Invalid (422).
	fail := admissionregistrationv1.Fail
	if err := cl.c.Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "refuse-route-status"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{gwv1.GroupName}, APIVersions: []string{"*"},
						Resources: []string{"httproutes/status"}},
				},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "registrar",
				Expression: "request.userInfo.username == 'system:serviceaccount:" + systemNS + ":" + registrarSA + "'"}},
			Validations: []admissionregistrationv1.Validation{{Expression: "object.metadata.name != 'refused'",
				Reason: ptrTo(metav1.StatusReasonInvalid), Message: "route status of 'refused' is refused by the test"}},
		},
	}); err != nil {
		t.Fatal(err)
	}
	if err := cl.c.Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "refuse-route-status"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "refuse-route-status",
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}); err != nil {
		t.Fatal(err)
	}
	asRegistrar := gwclient.NewForConfigOrDie(cl.registrarConfig()).GatewayV1().HTTPRoutes("probe")
	gw := gwclient.NewForConfigOrDie(cl.api.Config)
	cl.createNS(t, "probe")
	if _, err := gw.GatewayV1().HTTPRoutes("probe").Create(ctx, httpRoute("probe", "refused", []gwv1.ParentReference{{Name: "edge"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, converge, "the policy refuses the registrar's status write", func() error {
		r, err := asRegistrar.Get(ctx, "refused", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, err := asRegistrar.UpdateStatus(ctx, r, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			return fmt.Errorf("status write: %v, want Invalid", err)
		}
		return nil
	})

	leader := startRegistrar(t, cl, regSrv.Endpoints, "east-1")
	leader.waitElected(t)
	const ns = "gamma"
	if err := cl.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}); err != nil {
		t.Fatal(err)
	}
	var svcs []gwv1.ParentReference
	for i := range routestatus.MaxParents {
		name := fmt.Sprintf("svc-%02d", i)
		cl.createService(t, ns, name, port{name: "http", port: 80, tgt: 8080, appProto: "http"})
		svcs = append(svcs, svcParent(name, 80))
	}
	var gateways []gwv1.ParentReference
	for i := range 26 {
		gateways = append(gateways, gwv1.ParentReference{Group: ptrTo(gwv1.Group(gwv1.GroupName)), Kind: ptrTo(gwv1.Kind("Gateway")), Name: gwv1.ObjectName(fmt.Sprintf("edge-%02d", i))})
	}
	hr := gw.GatewayV1().HTTPRoutes(ns)
	get := func(name string) *gwv1.HTTPRoute {
		t.Helper()
		r, err := hr.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// 32 Service parentRefs: 32 entries.
	if _, err := hr.Create(ctx, httpRoute(ns, "many", svcs, backend("svc-00", 80)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// 26 Gateway parentRefs, whose controller writes 26 entries, and another mesh's 4 entries
	// for the 4 Service parentRefs that come next: 30 entries of others, room for 2 of aether's.
	if _, err := hr.Create(ctx, httpRoute(ns, "crowded", gateways, backend("svc-00", 80)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const otherMesh = gwv1.GatewayController("example.net/other-mesh")
	writeStatusAs(t, hr, "crowded", foreignCtrl, entriesFor(foreignCtrl, gateways))
	writeStatusAs(t, hr, "crowded", otherMesh, entriesFor(otherMesh, svcs[:4]))
	crowded := get("crowded")
	theirs := slices.Clone(crowded.Status.Parents)
	crowded.Spec.ParentRefs = append(crowded.Spec.ParentRefs, svcs[:4]...)
	if _, err := hr.Update(ctx, crowded, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// One Service named twice, with and without its namespace (the CRD takes them as two
	// parents): two entries, each echoing its parentRef as written.
	withNS := svcParent("svc-01", 80)
	withNS.Namespace = ptrTo(gwv1.Namespace(ns))
	if _, err := hr.Create(ctx, httpRoute(ns, "twice", []gwv1.ParentReference{svcParent("svc-01", 80), withNS}, backend("svc-01", 80)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// 16 rules of 16 missing backends with the longest names.
	long := httpRoute(ns, "long", svcs[:1])
	long.Spec.Rules = nil
	for i := range 16 {
		rule := gwv1.HTTPRouteRule{}
		for j := range 16 {
			name := fmt.Sprintf("b%02d%02d-", i, j) + strings.Repeat("x", 253-6)
			rule.BackendRefs = append(rule.BackendRefs, gwv1.HTTPBackendRef{BackendRef: backend(name, 80)})
		}
		long.Spec.Rules = append(long.Spec.Rules, rule)
	}
	if _, err := hr.Create(ctx, long, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := hr.Create(ctx, httpRoute(ns, "refused", svcs[:1], backend("svc-00", 80)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	took := testenv.Eventually(t, converge, "the bounded statuses written", func() error {
		many := get("many")
		if n := len(many.Status.Parents); n != routestatus.MaxParents {
			return fmt.Errorf("HTTPRoute many: %d entries, want %d", n, routestatus.MaxParents)
		}
		for i := range svcs {
			if _, err := checkParent("HTTPRoute many", many.Generation, many.Spec.ParentRefs, many.Status.Parents, i, acceptedTrue, resolvedTrue); err != nil {
				return err
			}
		}
		crowded := get("crowded")
		if n := len(crowded.Status.Parents); n != routestatus.MaxParents || ours(crowded.Status.Parents) != 2 {
			return fmt.Errorf("HTTPRoute crowded: %d entries, %d of aether's; want %d, 2", n, ours(crowded.Status.Parents), routestatus.MaxParents)
		}
		for i := 26; i < 28; i++ {
			if _, err := checkParent("HTTPRoute crowded", crowded.Generation, crowded.Spec.ParentRefs, crowded.Status.Parents, i, acceptedTrue, resolvedTrue); err != nil {
				return err
			}
		}
		twice := get("twice")
		for i := range 2 {
			if _, err := checkParent("HTTPRoute twice", twice.Generation, twice.Spec.ParentRefs, twice.Status.Parents, i, acceptedTrue, resolvedTrue); err != nil {
				return err
			}
		}
		if n := len(twice.Status.Parents); n != 2 {
			return fmt.Errorf("HTTPRoute twice: %d entries, want 2", n)
		}
		long := get("long")
		p, err := checkParent("HTTPRoute long", long.Generation, long.Spec.ParentRefs, long.Status.Parents, 0,
			acceptedTrue, wantCond{gwv1.RouteConditionResolvedRefs, metav1.ConditionFalse, string(gwv1.RouteReasonBackendNotFound)})
		if err != nil {
			return err
		}
		if msg := meta.FindStatusCondition(p.Conditions, string(gwv1.RouteConditionResolvedRefs)).Message; len(msg) > routestatus.MaxMessage || !strings.HasSuffix(msg, " bytes cut]") {
			return fmt.Errorf("HTTPRoute long: ResolvedRefs message of %d bytes ending %q, want at most %d, cut", len(msg), msg[max(len(msg)-40, 0):], routestatus.MaxMessage)
		}
		if leader.counter(t, metricRefused) != 1 {
			return fmt.Errorf("%v refused writes counted, want 1", leader.counter(t, metricRefused))
		}
		return nil
	})
	t.Logf("routes created -> bounded statuses: %s", took)

	// The others' entries of "crowded" are as they wrote them, in place; aether's two follow.
	crowded = get("crowded")
	if !equality.Semantic.DeepEqual(crowded.Status.Parents[:30], theirs) {
		t.Errorf("HTTPRoute crowded: the others' entries changed:\n%+v\nwere %+v", crowded.Status.Parents[:30], theirs)
	}
	if g := leader.gauge(t, metricTruncated); g != 1 {
		t.Errorf("%s = %v, want 1", metricTruncated, g)
	}
	if r := get("refused"); ours(r.Status.Parents) != 0 {
		t.Errorf("HTTPRoute refused: status.parents %+v", r.Status.Parents)
	}
	// Neither the truncated route nor the refused one is written again and again: no write
	// counted, and no write denied by the policy (the API server's count of its denials).
	writes := leader.settle(t)
	denied := policyDenials(t, cl, "refuse-route-status")
	if denied == 0 {
		t.Error("the API server counted no denial of the policy")
	}
	rv := get("crowded").ResourceVersion
	passes := leader.counter(t, metricPasses)
	cl.createService(t, ns, "unrelated", port{name: "http", port: 80, tgt: 80, appProto: "http"})
	testenv.Eventually(t, converge, "a pass after the unrelated change", func() error {
		if p := leader.counter(t, metricPasses); p <= passes {
			return fmt.Errorf("passes %v, was %v", p, passes)
		}
		return nil
	})
	if w := leader.settle(t); w != writes {
		t.Errorf("%v route status writes after passes with nothing to change, were %v", w, writes)
	}
	if n := leader.counter(t, metricRefused); n != 1 {
		t.Errorf("%v refused writes counted after passes that change nothing, want 1", n)
	}
	if got := get("crowded").ResourceVersion; got != rv {
		t.Errorf("HTTPRoute crowded written again: resourceVersion %s, was %s", got, rv)
	}
	if d := policyDenials(t, cl, "refuse-route-status"); d != denied {
		t.Errorf("the refused status was sent again: %v denials by the policy, were %v", d, denied)
	}

	// A new generation of the refused route: refused again, counted once more.
	refused := get("refused")
	refused.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptrTo(gwv1.PathMatchPathPrefix), Value: ptrTo("/v2")}}}
	if _, err := hr.Update(ctx, refused, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, converge, "the new generation's refusal counted", func() error {
		if n := leader.counter(t, metricRefused); n != 2 {
			return fmt.Errorf("%v refused writes counted, want 2", n)
		}
		return nil
	})

	// The other mesh leaves: aether's four entries fit.
	writeStatusAs(t, hr, "crowded", otherMesh, nil)
	testenv.Eventually(t, converge, "all of aether's entries once they fit", func() error {
		crowded := get("crowded")
		for i := 26; i < 30; i++ {
			if _, err := checkParent("HTTPRoute crowded", crowded.Generation, crowded.Spec.ParentRefs, crowded.Status.Parents, i, acceptedTrue, resolvedTrue); err != nil {
				return err
			}
		}
		if n := len(crowded.Status.Parents); n != 30 {
			return fmt.Errorf("HTTPRoute crowded: %d entries, want 30", n)
		}
		if g := leader.gauge(t, metricTruncated); g != 0 {
			return fmt.Errorf("%s = %v, want 0", metricTruncated, g)
		}
		return nil
	})
}

// policyDenials reads the API server's count of the requests ValidatingAdmissionPolicy policy
// denied (apiserver_validating_admission_policy_check_total, enforcement_action "deny").
func policyDenials(t testing.TB, cl *cluster, policy string) float64 {
	t.Helper()
	hc, err := rest.HTTPClientFor(cl.api.Config)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(cl.api.Config.Host + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("API server /metrics: %d, %v", resp.StatusCode, err)
	}
	var sum float64
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "apiserver_validating_admission_policy_check_total{") ||
			!strings.Contains(l, `enforcement_action="deny"`) || !strings.Contains(l, `policy="`+policy+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("API server /metrics: %q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// TestRouteStatusCRDRemoved runs a registrar against a real kube-apiserver with every CRD and
// deletes the GRPCRoute CRD while it is watched: the kind stops being watched (gauge
// aether_registrar_route_status_watched{kind="GRPCRoute"} 0) and its routes stop counting (an
// HTTPRoute that a GRPCRoute Conflicted is Accepted again), HTTPRoutes are still followed, and
// once the CRD is installed again GRPCRoutes are watched and written again (the HTTPRoute
// Conflicted again).
func TestRouteStatusCRDRemoved(t *testing.T) {
	regSrv := startRegistryServer(t)
	cl := newCluster(t, "east")
	in := startRegistrar(t, cl, regSrv.Endpoints, "east", func(c *registrar.Config) { c.RouteCRDRecheck = 200 * time.Millisecond })
	in.waitElected(t)
	gw := gwclient.NewForConfigOrDie(cl.api.Config)
	ctx := context.Background()

	const ns = "gamma"
	if err := cl.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}); err != nil {
		t.Fatal(err)
	}
	cl.createService(t, ns, "cart", port{name: "grpc", port: 9090, tgt: 9090, appProto: "grpc"})
	hr := gw.GatewayV1().HTTPRoutes(ns)
	if _, err := hr.Create(ctx, httpRoute(ns, "web", []gwv1.ParentReference{svcParent("cart", 9090)}, backend("cart", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := gw.GatewayV1().GRPCRoutes(ns).Create(ctx, grpcRoute(ns, "rpc", []gwv1.ParentReference{svcParent("cart", 9090)}, backend("cart", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	conflicted := wantCond{gwv1.RouteConditionAccepted, metav1.ConditionFalse, model.ReasonConflicted}
	checkWeb := func(conds ...wantCond) error {
		r, err := hr.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = checkParent("HTTPRoute web", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, conds...)
		return err
	}
	checkRPC := func(name string) error {
		r, err := gw.GatewayV1().GRPCRoutes(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = checkParent("GRPCRoute "+name, r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue)
		return err
	}
	watched := func(kind model.RouteKind, want float64) error {
		if g := in.sampleWith(t, metricWatched, "kind", string(kind)); g != want {
			return fmt.Errorf("%s{kind=%q} = %v, want %v", metricWatched, kind, g, want)
		}
		return nil
	}
	testenv.Eventually(t, converge, "both kinds watched, the HTTPRoute Conflicted", func() error {
		return errors.Join(watched(model.KindHTTPRoute, 1), watched(model.KindGRPCRoute, 1), checkRPC("rpc"), checkWeb(conflicted, resolvedTrue))
	})

	crds := apiextclient.NewForConfigOrDie(cl.api.Config).ApiextensionsV1().CustomResourceDefinitions()
	const grpcCRD = "grpcroutes.gateway.networking.k8s.io"
	if err := crds.Delete(ctx, grpcCRD, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took := testenv.Eventually(t, converge, "the GRPCRoute CRD gone: not watched, the HTTPRoute Accepted", func() error {
		if _, err := crds.Get(ctx, grpcCRD, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("CRD %s: %v, want NotFound", grpcCRD, err)
		}
		return errors.Join(watched(model.KindGRPCRoute, 0), watched(model.KindHTTPRoute, 1), checkWeb(acceptedTrue, resolvedTrue))
	})
	t.Logf("GRPCRoute CRD deleted -> not watched: %s", took)
	if _, err := hr.Create(ctx, httpRoute(ns, "web2", []gwv1.ParentReference{svcParent("cart", 9090)}, backend("cart", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, converge, "HTTPRoutes still followed", func() error {
		r, err := hr.Get(ctx, "web2", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = checkParent("HTTPRoute web2", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue)
		return err
	})

	testenv.InstallCRDs(t, cl.api.Config, testenv.CRDSubset(t, "gateway.networking.k8s.io_grpcroutes.yaml"))
	if _, err := gw.GatewayV1().GRPCRoutes(ns).Create(ctx, grpcRoute(ns, "rpc2", []gwv1.ParentReference{svcParent("cart", 9090)}, backend("cart", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	took = testenv.Eventually(t, converge, "the GRPCRoute CRD back: watched and written, the HTTPRoute Conflicted again", func() error {
		return errors.Join(watched(model.KindGRPCRoute, 1), checkRPC("rpc2"), checkWeb(conflicted, resolvedTrue))
	})
	t.Logf("GRPCRoute CRD installed again -> status: %s", took)
}

// lockedBuffer is a log sink a test reads while the registrar writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// registryEndpoint is an endpoint record of pod uid for service ns/name with one port.
func registryEndpoint(ns, name, uid, ip, portName string, port uint32, proto registryv1.Protocol) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: &registryv1.ServiceRef{Namespace: ns, Name: name}, Addresses: []string{ip},
		Ports:    []*registryv1.EndpointPort{{Name: portName, Port: port, Protocol: proto}},
		SpiffeId: "spiffe://aether.internal/ns/" + ns + "/sa/" + name, Health: registryv1.Health_HEALTH_HEALTHY,
		Kubernetes: &registryv1.KubernetesMetadata{NodeName: "node-1", PodName: uid, PodUid: uid},
	}
}

// TestRouteStatusEndpointProtocols runs a registrar against a real kube-apiserver and an
// embedded etcd registry and checks that route status takes the protocol of a port without
// appProtocol from the endpoints registered for it (their pods' endpoint.aether.io/protocol), as
// the agents do:
//   - Service db, port 5432 without appProtocol, whose endpoints (in this cluster's partition)
//     declare TCP: an HTTPRoute on it (and to it) is Accepted=False/NoMatchingParent ("port 5432
//     is TCP") and ResolvedRefs=False/UnsupportedProtocol;
//   - while the registry is down, a new generation of that route is written from the records
//     last read (still NoMatchingParent, not HTTP by default), and the registrar says so once;
//   - the endpoints re-registered declaring HTTP: Accepted=True;
//   - Service rpc, port 9090 without appProtocol, endpoints declaring gRPC: a GRPCRoute backend
//     on it is ResolvedRefs=True;
//   - ServiceImport remote, exported by cluster west (its mark and endpoints in west's partition,
//     imported here without appProtocol): a GRPCRoute backend on it is UnsupportedProtocol until
//     west's endpoints declare gRPC, then ResolvedRefs=True.
func TestRouteStatusEndpointProtocols(t *testing.T) {
	regSrv := startRegistryServer(t)
	cl := newCluster(t, "east")
	var logs lockedBuffer
	in := startRegistrar(t, cl, regSrv.Endpoints, "east", func(c *registrar.Config) {
		c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testLogWriter()), nil)).With("registrar", "east")
	})
	in.waitElected(t)
	gw := gwclient.NewForConfigOrDie(cl.api.Config)
	ctx := context.Background()
	// The agents' writers: east's (this cluster's partition) and west's.
	writer := func(cluster string) *registry.Registry {
		reg, err := registry.New(registry.Config{Endpoints: regSrv.Endpoints, Region: region, Cluster: cluster, Logger: testLogger(t, cluster+"-agent"), DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close() })
		return reg
	}
	east, west := writer("east"), writer("west")

	const ns = "gamma"
	if err := cl.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}); err != nil {
		t.Fatal(err)
	}
	cl.createService(t, ns, "db", port{name: "db", port: 5432, tgt: 5432})
	cl.createService(t, ns, "rpc", port{name: "grpc", port: 9090, tgt: 9090})
	for i, uid := range []string{"db-1", "db-2"} {
		if err := east.RegisterEndpoint(ctx, registryEndpoint(ns, "db", uid, fmt.Sprintf("10.244.1.%d", i+1), "db", 5432, registryv1.Protocol_PROTOCOL_TCP)); err != nil {
			t.Fatal(err)
		}
	}
	if err := east.RegisterEndpoint(ctx, registryEndpoint(ns, "rpc", "rpc-1", "10.244.1.10", "grpc", 9090, registryv1.Protocol_PROTOCOL_GRPC)); err != nil {
		t.Fatal(err)
	}
	// west exports remote with a port without appProtocol (its mark says HTTP, the default), so
	// this cluster's ServiceImport has none; west's endpoints come later.
	if err := west.Export(ctx, &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: ns, Name: "remote"},
		Ports:      []*registryv1.ServicePort{{Name: "grpc", Port: 9090, TargetPort: 9090, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		CreateTime: time.Now().UTC().Format(time.RFC3339Nano)}); err != nil {
		t.Fatal(err)
	}

	hr, gr := gw.GatewayV1().HTTPRoutes(ns), gw.GatewayV1().GRPCRoutes(ns)
	if _, err := hr.Create(ctx, httpRoute(ns, "sql", []gwv1.ParentReference{svcParent("db", 5432)}, backend("db", 5432)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := gr.Create(ctx, grpcRoute(ns, "rpc", []gwv1.ParentReference{svcParent("rpc", 9090)}, backend("rpc", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := gr.Create(ctx, grpcRoute(ns, "remote", []gwv1.ParentReference{svcParent("rpc", 9090)}, importBackend("remote", 9090)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkSQL := func(conds ...wantCond) (*gwv1.HTTPRoute, *gwv1.RouteParentStatus, error) {
		r, err := hr.Get(ctx, "sql", metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		p, err := checkParent("HTTPRoute sql", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, conds...)
		return r, p, err
	}
	checkGRPC := func(name string, conds ...wantCond) error {
		r, err := gr.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = checkParent("GRPCRoute "+name, r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, conds...)
		return err
	}
	noParent := wantCond{gwv1.RouteConditionAccepted, metav1.ConditionFalse, string(gwv1.RouteReasonNoMatchingParent)}
	unsupported := wantCond{gwv1.RouteConditionResolvedRefs, metav1.ConditionFalse, string(gwv1.RouteReasonUnsupportedProtocol)}
	sqlTCP := func() error {
		_, p, err := checkSQL(noParent, unsupported)
		if err == nil {
			if msg := meta.FindStatusCondition(p.Conditions, "Accepted").Message; !strings.Contains(msg, "port 5432 is TCP") {
				err = fmt.Errorf("HTTPRoute sql: Accepted message %q, want one saying port 5432 is TCP", msg)
			}
		}
		return err
	}
	took := testenv.Eventually(t, converge, "status from the registered endpoints' protocols", func() error {
		if _, err := cl.imported(ns, "remote", []int32{9090}, "west"); err != nil {
			return err
		}
		return errors.Join(sqlTCP(), checkGRPC("rpc", acceptedTrue, resolvedTrue), checkGRPC("remote", acceptedTrue, unsupported))
	})
	t.Logf("routes created -> status from the endpoints' protocols: %s", took)

	// The registry down: a new generation of sql is written from the records last read.
	regSrv.stop()
	testenv.Eventually(t, converge, "the registrar sees the registry down", func() error {
		if in.r.Ready() == nil {
			return errors.New("still ready")
		}
		return nil
	})
	sql, _, err := checkSQL(noParent, unsupported)
	if err != nil {
		t.Fatal(err)
	}
	sql.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptrTo(gwv1.PathMatchPathPrefix), Value: ptrTo("/q")}}}
	if _, err := hr.Update(ctx, sql, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, converge, "a new generation written during the outage, from the records last read", func() error {
		r, _, err := checkSQL(noParent, unsupported)
		if err == nil && r.Generation < 2 {
			err = fmt.Errorf("generation %d, want 2", r.Generation)
		}
		return errors.Join(err, sqlTCP())
	})
	const staleLog = "the registry does not answer; passes use the endpoint records and export marks last read"
	if n := strings.Count(logs.String(), staleLog); n != 1 {
		t.Errorf("%q logged %d times during the outage, want once", staleLog, n)
	}
	regSrv.start()
	testenv.Eventually(t, converge, "the registrar sees the registry again", func() error { return in.r.Ready() })

	// db's endpoints re-registered declaring HTTP; west's endpoints of remote declare gRPC.
	for i, uid := range []string{"db-1", "db-2"} {
		if err := east.RegisterEndpoint(ctx, registryEndpoint(ns, "db", uid, fmt.Sprintf("10.244.1.%d", i+1), "db", 5432, registryv1.Protocol_PROTOCOL_HTTP)); err != nil {
			t.Fatal(err)
		}
	}
	if err := west.RegisterEndpoint(ctx, registryEndpoint(ns, "remote", "remote-1", "10.244.2.1", "grpc", 9090, registryv1.Protocol_PROTOCOL_GRPC)); err != nil {
		t.Fatal(err)
	}
	took = testenv.Eventually(t, converge, "status follows the endpoints' new protocols", func() error {
		_, _, err := checkSQL(acceptedTrue, resolvedTrue)
		return errors.Join(err, checkGRPC("remote", acceptedTrue, resolvedTrue), checkGRPC("rpc", acceptedTrue, resolvedTrue))
	})
	t.Logf("endpoints re-registered -> status: %s", took)
	if n := strings.Count(logs.String(), staleLog); n != 1 {
		t.Errorf("%q logged %d times, want once (one outage)", staleLog, n)
	}
}

// testLogWriter is where a test's registrar logs go besides what the test reads: stderr with -v.
func testLogWriter() io.Writer {
	if testing.Verbose() {
		return os.Stderr
	}
	return io.Discard
}
