package routestatus

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
)

// TestSourcesReferencedOnly: a pass reads only the Services and ServiceImports its routes name
// (parents, backends, mirror backends, and aether's <svc>-clusterset Service of an imported
// one), and the statuses it resolves from them are those resolved from every object.
func TestSourcesReferencedOnly(t *testing.T) {
	mesh := map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}
	svc := func(ns, name, ip string, port int32, app string) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
				Ports: []corev1.ServicePort{{Name: "p", Port: port, Protocol: corev1.ProtocolTCP, AppProtocol: ptr(app)}}}}
	}
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
	if err := grpcIdx.Add(&gwv1.GRPCRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "rpc", Generation: 1}, Spec: gwv1.GRPCRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent("Service", "", "shop", "rpc")}},
		Rules:           []gwv1.GRPCRouteRule{{BackendRefs: []gwv1.GRPCBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: sref("shop", "rpc", 9090)}}}}}}}); err != nil {
		t.Fatal(err)
	}
	c := &Controller{Client: rd}
	src, err := c.sources(context.Background(), gwlisters.NewHTTPRouteLister(httpIdx), gwlisters.NewGRPCRouteLister(grpcIdx))
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
	want := []string{"shop/cart", "shop/cart-v2", "shop/mirror", "shop/rpc", "shop/tcp", "off/outside", "shop/remote-clusterset", "import shop/remote"}
	if !equality.Semantic.DeepEqual(names, want) {
		t.Errorf("sources read %v, want %v", names, want)
	}

	full := src
	full.Services, full.Imports = nil, nil
	for i := range rd.svcs {
		full.Services = append(full.Services, &rd.svcs[i])
	}
	for i := range rd.imps {
		full.Imports = append(full.Imports, &rd.imps[i])
	}
	got, all := model.Assemble(0, src).RouteStatuses(), model.Assemble(0, full).RouteStatuses()
	if len(got) != 4 || !equality.Semantic.DeepEqual(got, all) {
		t.Errorf("statuses from the referenced objects:\n%+v\nfrom every object:\n%+v", got, all)
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
