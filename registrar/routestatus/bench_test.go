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

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// fakeExports is an export view at a test's boundary: synced, with the marks it holds by service.
type fakeExports map[model.ServiceKey][]registry.Record[*registryv1.ExportMark]

func (fakeExports) Synced() bool                       { return true }
func (fakeExports) WaitSynced(context.Context) error   { return nil }
func (fakeExports) Subscribe(func([]model.ServiceKey)) {}
func (f fakeExports) Marks(k model.ServiceKey) []registry.Record[*registryv1.ExportMark] {
	return f[k]
}

// endpointPort is one port of a test endpoint record.
type endpointPort struct {
	name  string
	port  uint32
	proto registryv1.Protocol
}

// endpointRecord is an endpoint record of cluster (region r1) for pod uid of service ns/name, as
// the registry's watch delivers it.
func endpointRecord(cluster, ns, name, uid string, ports ...endpointPort) registry.Record[*registryv1.ServiceEndpoint] {
	o := registry.Origin{Region: "r1", Cluster: cluster}
	ep := &registryv1.ServiceEndpoint{Service: &registryv1.ServiceRef{Namespace: ns, Name: name}, ClusterName: cluster, Region: o.Region,
		Addresses: []string{"10.244.0.1"}, Kubernetes: &registryv1.KubernetesMetadata{PodUid: uid, PodName: uid}}
	for _, p := range ports {
		ep.Ports = append(ep.Ports, &registryv1.EndpointPort{Name: p.name, Port: p.port, Protocol: p.proto})
	}
	return registry.Record[*registryv1.ServiceEndpoint]{Key: o.EndpointKey(ns, name, uid), Origin: o, ModRevision: 1, Value: ep}
}

// cacheReader is the manager's cache at the benchmark's boundary: List copies every object of
// its kind (DeepCopyObject), or, with client.UnsafeDisableDeepCopy, only its top-level struct, as
// controller-runtime's cache reader does.
type cacheReader struct {
	client.Reader
	nss  []corev1.Namespace
	svcs []corev1.Service
	imps []mcsv1beta1.ServiceImport
}

func (r cacheReader) List(_ context.Context, l client.ObjectList, opts ...client.ListOption) error {
	var lo client.ListOptions
	lo.ApplyOptions(opts)
	shared := lo.UnsafeDisableDeepCopy != nil && *lo.UnsafeDisableDeepCopy
	switch l := l.(type) {
	case *corev1.NamespaceList:
		l.Items = make([]corev1.Namespace, len(r.nss))
		for i := range r.nss {
			if l.Items[i] = r.nss[i]; !shared {
				l.Items[i] = *r.nss[i].DeepCopyObject().(*corev1.Namespace)
			}
		}
	case *corev1.ServiceList:
		l.Items = make([]corev1.Service, len(r.svcs))
		for i := range r.svcs {
			if l.Items[i] = r.svcs[i]; !shared {
				l.Items[i] = *r.svcs[i].DeepCopyObject().(*corev1.Service)
			}
		}
	case *mcsv1beta1.ServiceImportList:
		l.Items = make([]mcsv1beta1.ServiceImport, len(r.imps))
		for i := range r.imps {
			if l.Items[i] = r.imps[i]; !shared {
				l.Items[i] = *r.imps[i].DeepCopyObject().(*mcsv1beta1.ServiceImport)
			}
		}
	default:
		return fmt.Errorf("list %T: not in the benchmark's cache", l)
	}
	return nil
}

// BenchmarkPass measures one pass of the controller (Reconcile) over 1000 HTTPRoutes and 1000
// or 10000 Services in one mesh namespace, once every route's status is written (the steady
// state: each pass lists, resolves and compares, and writes nothing). Without endpoints, every
// Service port has appProtocol http; with endpoints=N, no port has one and every Service has N
// endpoints in the registry (declaring HTTP), which the pass reads for the routes' services.
//
//	go test ./registrar/routestatus -run '^$' -bench BenchmarkPass -benchmem -count 5
func BenchmarkPass(b *testing.B) {
	for _, n := range []struct{ routes, services, endpoints int }{{1000, 1000, 0}, {1000, 10000, 0}, {1000, 10000, 10}} {
		name := fmt.Sprintf("routes=%d/services=%d", n.routes, n.services)
		if n.endpoints > 0 {
			name += fmt.Sprintf("/endpoints=%d", n.endpoints)
		}
		b.Run(name, func(b *testing.B) { benchmarkPass(b, n.routes, n.services, n.endpoints) })
	}
}

func benchmarkPass(b *testing.B, nRoutes, nServices, nEndpoints int) {
	const ns = "shop"
	rd := cacheReader{nss: []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}}}
	eps := newEndpointView()
	snap := registry.Batch[*registryv1.ServiceEndpoint]{Snapshot: true, Revision: 1}
	for i := range nServices {
		name := fmt.Sprintf("svc-%d", i)
		sp := corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, AppProtocol: ptr("http")}
		if nEndpoints > 0 {
			sp.AppProtocol = nil
		}
		rd.svcs = append(rd.svcs, corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.%d.%d.%d", 96+i/62500, i/250%250, i%250+1), ClusterIPs: []string{fmt.Sprintf("10.%d.%d.%d", 96+i/62500, i/250%250, i%250+1)},
				Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{sp}},
		})
		for j := range nEndpoints {
			snap.Events = append(snap.Events, registry.Event[*registryv1.ServiceEndpoint]{Type: registry.Added,
				Record: endpointRecord("east", ns, name, fmt.Sprintf("%s-%d", name, j), endpointPort{"http", 8080, registryv1.Protocol_PROTOCOL_HTTP})})
		}
	}
	eps.apply(snap)
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
	c := &Controller{Client: rd, Gateway: gw, Log: slog.New(slog.DiscardHandler), Cluster: "east", Exports: fakeExports{}, eps: eps}
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
	if src, err := c.sources(ctx, listers{http: c.http}); err != nil || len(src.Endpoints) != min(nRoutes, nServices)*nEndpoints {
		b.Fatalf("a pass read %d endpoints (%v), want those of the %d services its routes name", len(src.Endpoints), err, min(nRoutes, nServices))
	}
}
