package routestatus

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/gateway"
	"github.com/aethermesh/aether/registry"
)

// TestSourcesReferencedOnly: a pass reads only the Services, ServiceImports, registry endpoints
// and export marks of the services its routes name (parents, backends, mirror backends, and
// aether's <svc>-clusterset Service of an imported one), and the statuses it resolves from them
// are those resolved from every object and record. The endpoints decide the protocol of the ports
// without appProtocol: a Service port whose endpoints declare TCP is no parent for an HTTPRoute,
// and a ServiceImport port whose exporting cluster's endpoints declare gRPC is a GRPCRoute
// backend.
func TestSourcesReferencedOnly(t *testing.T) {
	mesh := map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}
	svc := func(ns, name, ip string, port int32, app string) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
				Ports: []corev1.ServicePort{{Name: "p", Port: port, Protocol: corev1.ProtocolTCP, AppProtocol: ptr(app)}}}}
	}
	plain := svc("shop", "plain", "10.96.0.9", 8080, "")
	plain.Spec.Ports[0].AppProtocol = nil
	clusterset := svc("shop", "remote-clusterset", "10.96.9.9", 80, "http")
	clusterset.Labels = map[string]string{model.LabelManagedBy: model.ManagedByAether}
	clusterset.Annotations = map[string]string{model.AnnotationMeshService: "shop/remote"}
	rd := cacheReader{
		nss: []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: mesh}}, {ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: mesh}}, {ObjectMeta: metav1.ObjectMeta{Name: "off"}}},
		svcs: []corev1.Service{
			svc("shop", "cart", "10.96.0.1", 80, "http"),
			svc("shop", "cart-v2", "10.96.0.2", 80, "http"),
			svc("shop", "mirror", "10.96.0.3", 80, "http"),
			svc("shop", "rpc", "10.96.0.4", 9090, "grpc"),
			svc("shop", "tcp", "10.96.0.5", 5432, "tcp"),
			plain,
			svc("off", "outside", "10.96.0.6", 80, "http"),
			svc("shop", "unrelated", "10.96.0.7", 80, "http"),
			svc("web", "unrelated", "10.96.0.8", 80, "http"),
			clusterset,
		},
		imps: []mcsv1beta1.ServiceImport{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "remote"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP,
				IPs: []string{"10.96.9.9"}, Ports: []mcsv1beta1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "elsewhere"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP,
				IPs: []string{"10.96.9.10"}, Ports: []mcsv1beta1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}}},
		},
	}
	sref := func(ns, name string, port int32) gwv1.BackendObjectReference {
		return gwv1.BackendObjectReference{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Namespace: ptr(gwv1.Namespace(ns)), Name: gwv1.ObjectName(name), Port: ptr(gwv1.PortNumber(port))}
	}
	iref := func(name string, port int32) gwv1.BackendObjectReference {
		return gwv1.BackendObjectReference{Group: ptr(gwv1.Group(mcsv1beta1.GroupName)), Kind: ptr(gwv1.Kind("ServiceImport")), Name: gwv1.ObjectName(name), Port: ptr(gwv1.PortNumber(port))}
	}
	parent := func(kind, group, ns, name string) gwv1.ParentReference {
		return gwv1.ParentReference{Group: ptr(gwv1.Group(group)), Kind: ptr(gwv1.Kind(kind)), Namespace: ptr(gwv1.Namespace(ns)), Name: gwv1.ObjectName(name)}
	}
	httpIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	grpcIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, r := range []*gwv1.HTTPRoute{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "canary", Generation: 1}, Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent("Service", "", "shop", "cart"), {Name: "edge"}}},
			Rules: []gwv1.HTTPRouteRule{{
				BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: sref("shop", "cart", 80)}}, {BackendRef: gwv1.BackendRef{BackendObjectReference: sref("shop", "cart-v2", 80)}}},
				Filters:     []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestMirror, RequestMirror: &gwv1.HTTPRequestMirrorFilter{BackendRef: sref("shop", "mirror", 80)}}},
			}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "consumer", Generation: 2}, Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent("Service", "", "shop", "tcp"), parent("Service", "", "off", "outside"), parent("ServiceImport", mcsv1beta1.GroupName, "shop", "remote")}},
			Rules:           []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: sref("shop", "missing", 80)}}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "imported", Generation: 1}, Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent("Service", "", "shop", "rpc")}},
			Rules:           []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: iref("remote", 80)}}}}}}},
	} {
		if err := httpIdx.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := httpIdx.Add(&gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "plain", Generation: 1}, Spec: gwv1.HTTPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent("Service", "", "shop", "plain")}},
		Rules:           []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: sref("shop", "plain", 8080)}}}}}}}); err != nil {
		t.Fatal(err)
	}
	if err := grpcIdx.Add(&gwv1.GRPCRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "rpc", Generation: 1}, Spec: gwv1.GRPCRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent("Service", "", "shop", "rpc")}},
		Rules: []gwv1.GRPCRouteRule{{BackendRefs: []gwv1.GRPCBackendRef{
			{BackendRef: gwv1.BackendRef{BackendObjectReference: sref("shop", "rpc", 9090)}},
			{BackendRef: gwv1.BackendRef{BackendObjectReference: iref("remote", 80)}},
		}}}}}); err != nil {
		t.Fatal(err)
	}
	// The registry: plain's pods here declare TCP; remote's pods in west (which exports it) gRPC,
	// in north (which does not) HTTP; unrelated services have endpoints too.
	tcp := endpointPort{"p", 8080, registryv1.Protocol_PROTOCOL_TCP}
	grpc := endpointPort{"p", 80, registryv1.Protocol_PROTOCOL_GRPC}
	http := endpointPort{"p", 80, registryv1.Protocol_PROTOCOL_HTTP}
	var snap registry.Batch[*registryv1.ServiceEndpoint]
	for _, r := range []registry.Record[*registryv1.ServiceEndpoint]{
		endpointRecord("east", "shop", "plain", "plain-1", tcp),
		endpointRecord("east", "shop", "plain", "plain-2", tcp),
		endpointRecord("west", "shop", "remote", "remote-1", grpc),
		endpointRecord("north", "shop", "remote", "remote-2", http),
		endpointRecord("north", "shop", "remote", "remote-3", http),
		endpointRecord("east", "shop", "unrelated", "unrelated-1", tcp),
		endpointRecord("west", "shop", "elsewhere", "elsewhere-1", grpc),
	} {
		snap.Events = append(snap.Events, registry.Event[*registryv1.ServiceEndpoint]{Type: registry.Added, Record: r})
	}
	eps := newEndpointView()
	eps.apply(snap)
	mark := func(cluster, name string) registry.Record[*registryv1.ExportMark] {
		o := registry.Origin{Region: "r1", Cluster: cluster}
		return registry.Record[*registryv1.ExportMark]{Key: o.ExportKey("shop", name), Origin: o,
			Value: &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: "shop", Name: name}}}
	}
	exports := fakeExports{
		{Namespace: "shop", Name: "remote"}:    {mark("west", "remote")},
		{Namespace: "shop", Name: "elsewhere"}: {mark("west", "elsewhere")},
	}
	c := &Controller{Client: rd, Cluster: "east", Exports: exports, eps: eps}
	src, err := c.sources(context.Background(), listers{http: gwlisters.NewHTTPRouteLister(httpIdx), grpc: gwlisters.NewGRPCRouteLister(grpcIdx)})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range src.Services {
		names = append(names, s.Namespace+"/"+s.Name)
	}
	for _, s := range src.Imports {
		names = append(names, "import "+s.Namespace+"/"+s.Name)
	}
	want := []string{"shop/cart", "shop/cart-v2", "shop/mirror", "shop/rpc", "shop/tcp", "shop/plain", "off/outside", "shop/remote-clusterset", "import shop/remote"}
	if !equality.Semantic.DeepEqual(names, want) {
		t.Errorf("sources read %v, want %v", names, want)
	}
	var epNames, markNames []string
	for _, e := range src.Endpoints {
		epNames = append(epNames, e.Cluster+"/"+e.PodUID)
	}
	for _, x := range src.Exports {
		markNames = append(markNames, x.Cluster+"/"+x.Service.String())
	}
	slices.Sort(epNames)
	if want := []string{"east/plain-1", "east/plain-2", "north/remote-2", "north/remote-3", "west/remote-1"}; !slices.Equal(epNames, want) {
		t.Errorf("sources read endpoints %v, want %v", epNames, want)
	}
	if want := []string{"west/shop/remote"}; !slices.Equal(markNames, want) {
		t.Errorf("sources read export marks %v, want %v", markNames, want)
	}

	full := src.Sources
	full.Services, full.Imports, full.Endpoints, full.Exports = nil, nil, nil, nil
	for _, r := range snap.Events {
		e, err := registry.ToModelEndpoint(r.Record)
		if err != nil {
			t.Fatal(err)
		}
		full.Endpoints = append(full.Endpoints, e)
	}
	for _, ms := range exports {
		for _, m := range ms {
			full.Exports = append(full.Exports, model.ExportMark{Service: model.ServiceKey{Namespace: "shop", Name: m.Value.Service.Name}, Cluster: m.Origin.Cluster, Region: m.Origin.Region})
		}
	}
	for i := range rd.svcs {
		full.Services = append(full.Services, &rd.svcs[i])
	}
	for i := range rd.imps {
		full.Imports = append(full.Imports, &rd.imps[i])
	}
	got, all := model.Assemble(0, src.Sources).RouteStatuses(), model.Assemble(0, full).RouteStatuses()
	if len(got) != 5 || !equality.Semantic.DeepEqual(got, all) {
		t.Errorf("statuses from the referenced objects:\n%+v\nfrom every object:\n%+v", got, all)
	}
	// The endpoints' protocols: plain's port is TCP, remote's gRPC (west's endpoints; north's do
	// not count, it does not export remote).
	for _, st := range got {
		p := st.Parents[0]
		switch st.Route.Name {
		case "plain":
			if p.Accepted.Status || p.Accepted.Reason != string(gwv1.RouteReasonNoMatchingParent) || !strings.Contains(p.Accepted.Message, "port 8080 is TCP") {
				t.Errorf("HTTPRoute plain on a port whose endpoints declare TCP: Accepted %+v, want False/NoMatchingParent (port 8080 is TCP)", p.Accepted)
			}
		case "rpc":
			if !p.ResolvedRefs.Status {
				t.Errorf("GRPCRoute rpc with a ServiceImport backend whose exporting cluster's endpoints declare gRPC: ResolvedRefs %+v, want True", p.ResolvedRefs)
			}
		}
	}
	bare := src.Sources
	bare.Endpoints, bare.Exports = nil, nil
	if equality.Semantic.DeepEqual(model.Assemble(0, bare).RouteStatuses(), got) {
		t.Error("the same statuses without the registry's records: the fixture does not depend on them")
	}
	// The fixture resolves to something of each kind (else the comparison says little).
	reasons := map[string]bool{}
	for _, st := range all {
		for _, p := range st.Parents {
			reasons[p.Accepted.Reason+"/"+p.ResolvedRefs.Reason] = true
		}
	}
	for _, r := range []string{"Accepted/ResolvedRefs", "NoMatchingParent/BackendNotFound", "Accepted/BackendNotFound", "Conflicted/ResolvedRefs"} {
		if !reasons[r] {
			t.Errorf("no parent resolved to %s: %v", r, reasons)
		}
	}
}

// viewSink records the gateway.Views a controller hands on.
type viewSink struct{ views []gateway.View }

func (s *viewSink) SetView(v gateway.View) { s.views = append(s.views, v) }

// TestL4RoutesWithoutAetherGateways: with no Gateway of a class aether accepts, a pass resolves
// nothing (model.ResolveGateways is not called) yet hands the gateway controller a View of the
// classes and Gateways, and removes aether's entries a TCPRoute holds for a Gateway that is not
// aether's (another controller's entry kept), as for an HTTPRoute.
func TestL4RoutesWithoutAetherGateways(t *testing.T) {
	ns := "shop"
	stale := gwv1.RouteParentStatus{ParentRef: gwv1.ParentReference{Name: "edge"}, ControllerName: model.GatewayControllerName,
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 1}}}
	theirs := gwv1.RouteParentStatus{ParentRef: gwv1.ParentReference{Name: "edge"}, ControllerName: "example.net/gateway-controller",
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 1}}}
	tr := &gwv1.TCPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pg", Generation: 1},
		Spec:   gwv1.TCPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "edge"}}}},
		Status: gwv1.TCPRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: []gwv1.RouteParentStatus{stale, theirs}}}}
	edge := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "edge"}, Spec: gwv1.GatewaySpec{GatewayClassName: "other"}}
	classes := []*gwv1.GatewayClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "aether"}, Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: gwv1.GatewayClassSpec{ControllerName: "example.net/gateway-controller"}},
	}
	idx := func(objs ...any) cache.Indexer {
		i := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		for _, o := range objs {
			if err := i.Add(o); err != nil {
				t.Fatal(err)
			}
		}
		return i
	}
	gw := gwfake.NewSimpleClientset(tr)
	eps := newEndpointView()
	eps.apply(registry.Batch[*registryv1.ServiceEndpoint]{})
	sink := &viewSink{}
	c := &Controller{Client: cacheReader{}, Gateway: gw, Log: slog.New(slog.DiscardHandler), Cluster: "east", Exports: fakeExports{}, eps: eps, Gateways: sink}
	c.tcp = gwlisters.NewTCPRouteLister(idx(tr))
	c.gateways = gwlisters.NewGatewayLister(idx(edge))
	c.classes = gwlisters.NewGatewayClassLister(idx(classes[0], classes[1]))
	if _, err := c.Reconcile(context.Background(), syncAll); err != nil {
		t.Fatal(err)
	}
	got, err := gw.GatewayV1().TCPRoutes(ns).Get(context.Background(), "pg", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got.Status.Parents, []gwv1.RouteParentStatus{theirs}) {
		t.Errorf("TCPRoute status.parents %+v, want only the other controller's entry", got.Status.Parents)
	}
	if len(sink.views) != 1 || len(sink.views[0].Classes) != 2 || len(sink.views[0].Gateways) != 1 || sink.views[0].Edges != nil || sink.views[0].Statuses != nil {
		t.Errorf("views %+v, want one with the 2 classes, the Gateway and nothing resolved", sink.views)
	}
}
