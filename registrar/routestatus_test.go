package registrar_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar"
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
	var writes float64
	testenv.Eventually(t, converge, "the writes settle", func() error {
		w, p := leader.counter(t, metricWrites), leader.counter(t, metricPasses)
		time.Sleep(time.Second)
		if w2, p2 := leader.counter(t, metricWrites), leader.counter(t, metricPasses); w2 != w || p2 != p {
			return fmt.Errorf("writes %v -> %v, passes %v -> %v within 1 s", w, w2, p, p2)
		}
		writes = w
		return nil
	})
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
