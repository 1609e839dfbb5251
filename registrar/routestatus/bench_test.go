package routestatus

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
)

// cacheReader is the manager's cache at the benchmark's boundary: List copies every object of
// its kind (DeepCopyObject), as controller-runtime's cache reader does.
type cacheReader struct {
	client.Reader
	nss  []corev1.Namespace
	svcs []corev1.Service
}

func (r cacheReader) List(_ context.Context, l client.ObjectList, _ ...client.ListOption) error {
	switch l := l.(type) {
	case *corev1.NamespaceList:
		for i := range r.nss {
			l.Items = append(l.Items, *r.nss[i].DeepCopyObject().(*corev1.Namespace))
		}
	case *corev1.ServiceList:
		for i := range r.svcs {
			l.Items = append(l.Items, *r.svcs[i].DeepCopyObject().(*corev1.Service))
		}
	case *mcsv1beta1.ServiceImportList:
	default:
		return fmt.Errorf("list %T: not in the benchmark's cache", l)
	}
	return nil
}

// BenchmarkPass measures one pass of the controller (Reconcile) over nRoutes HTTPRoutes and
// nServices Services in one mesh namespace, once every route's status is written (the steady
// state: each pass lists, resolves and compares, and writes nothing).
//
//	go test ./registrar/routestatus -run '^$' -bench BenchmarkPass -benchmem -count 5
func BenchmarkPass(b *testing.B) {
	const ns, nServices, nRoutes = "shop", 1000, 1000
	rd := cacheReader{nss: []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}}}
	for i := range nServices {
		rd.svcs = append(rd.svcs, corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("svc-%d", i)},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
				Selector: map[string]string{"app": fmt.Sprintf("svc-%d", i)},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, AppProtocol: ptr("http")}}},
		})
	}
	var objs []runtime.Object
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for i := range nRoutes {
		r := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("route-%d", i), Generation: 1}}
		svc := gwv1.ObjectName(fmt.Sprintf("svc-%d", i%nServices))
		r.Spec.ParentRefs = []gwv1.ParentReference{{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: svc, Port: ptr(gwv1.PortNumber(80))}}
		r.Spec.Rules = []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{
			Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: svc, Port: ptr(gwv1.PortNumber(80))}}}}}}
		objs = append(objs, r)
	}
	gw := gwfake.NewSimpleClientset(objs...)
	c := &Controller{Client: rd, Gateway: gw, Log: slog.New(slog.DiscardHandler)}
	c.http = gwlisters.NewHTTPRouteLister(idx)
	ctx := context.Background()
	// The first pass writes every status; the cache then holds the written routes.
	for _, o := range objs {
		if err := idx.Add(o); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := c.Reconcile(ctx, syncAll); err != nil {
		b.Fatal(err)
	}
	written, err := gw.GatewayV1().HTTPRoutes(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for i := range written.Items {
		if len(written.Items[i].Status.Parents) != 1 {
			b.Fatalf("route %s: status.parents %+v", written.Items[i].Name, written.Items[i].Status.Parents)
		}
		if err := idx.Update(&written.Items[i]); err != nil {
			b.Fatal(err)
		}
	}
	before := len(gw.Actions())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Reconcile(ctx, syncAll); err != nil {
			b.Fatal(err)
		}
	}
	if n := len(gw.Actions()) - before; n != 0 {
		b.Fatalf("%d API calls in passes that had nothing to write", n)
	}
}
