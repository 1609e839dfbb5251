package registrar_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar"
)

// TestGatewayThroughRegistrar runs a registrar with aether's Gateway controller on (as its
// ServiceAccount, with deploy/registrar's RBAC) against a real kube-apiserver and checks the whole
// path, from the Gateway API objects through the route status controller's resolution
// (model.ResolveGateways) to what both controllers write: the GatewayClass accepted; a Gateway
// with an HTTP, an HTTPS (a certificate Secret) and a TCP listener provisioned (ServiceAccount,
// Deployment, Service) with its certificate copied into the registrar's namespace and its status
// written (Accepted, Programmed=False Pending without an available replica, the listeners'
// attachedRoutes); an HTTPRoute with a Gateway parentRef and a Service parentRef gets aether's
// entries for both, a TCPRoute one for its Gateway parentRef; and when the Gateway's class is no
// longer aether's, the edge objects and the copy are removed, the routes' Gateway entries too,
// and the HTTPRoute's mesh entry is kept.
func TestGatewayThroughRegistrar(t *testing.T) {
	regSrv := startRegistryServer(t)
	cl := newCluster(t, "east")
	leader := startRegistrar(t, cl, regSrv.Endpoints, "east-1", func(c *registrar.Config) {
		c.EdgeEnvoyImage, c.Namespace = "aether-envoy:test", systemNS
	})
	leader.waitElected(t)
	gw := gwclient.NewForConfigOrDie(cl.api.Config)
	ctx := context.Background()

	const ns = "shop"
	if err := cl.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}); err != nil {
		t.Fatal(err)
	}
	cl.createService(t, ns, "web", port{name: "http", port: 80, tgt: 8080, appProto: "http"})
	cl.createService(t, ns, "db", port{name: "pg", port: 5432, tgt: 5432, appProto: "tcp"})
	ca, err := testenv.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := ca.Issue("www.example.com", nil, []string{"www.example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "www"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}}); err != nil {
		t.Fatal(err)
	}
	for _, gc := range []*gwv1.GatewayClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "aether"}, Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: gwv1.GatewayClassSpec{ControllerName: "example.net/gateway-controller"}},
	} {
		if _, err := gw.GatewayV1().GatewayClasses().Create(ctx, gc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	front := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "front"}, Spec: gwv1.GatewaySpec{
		GatewayClassName: "aether",
		Listeners: []gwv1.Listener{
			{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType},
			{Name: "https", Port: 443, Protocol: gwv1.HTTPSProtocolType, Hostname: ptrTo(gwv1.Hostname("www.example.com")), TLS: &gwv1.ListenerTLSConfig{
				Mode: ptrTo(gwv1.TLSModeTerminate), CertificateRefs: []gwv1.SecretObjectReference{{Name: "www"}}}},
			{Name: "pg", Port: 5432, Protocol: gwv1.TCPProtocolType},
		},
	}}
	if _, err := gw.GatewayV1().Gateways(ns).Create(ctx, front, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gwParent := gwv1.ParentReference{Name: "front"}
	if _, err := gw.GatewayV1().HTTPRoutes(ns).Create(ctx, httpRoute(ns, "site", []gwv1.ParentReference{gwParent, svcParent("web", 80)}, backend("web", 80)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tcp := &gwv1.TCPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pg"}, Spec: gwv1.TCPRouteSpec{
		// The Gateway's TCP listener and, in the mesh (model.ResolveL4Routes), Service db's port.
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "front", SectionName: ptrTo(gwv1.SectionName("pg"))}, svcParent("db", 5432)}},
		Rules:           []gwv1.TCPRouteRule{{BackendRefs: []gwv1.BackendRef{backend("db", 5432)}}},
	}}
	if _, err := gw.GatewayV1().TCPRoutes(ns).Create(ctx, tcp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	edge := types.NamespacedName{Namespace: ns, Name: model.EdgeServiceAccountName("front")}
	copyName := types.NamespacedName{Namespace: systemNS, Name: model.EdgeCertificateSecretName(model.SecretKey{Namespace: ns, Name: "www"})}
	testenv.Eventually(t, converge, "the class accepted, the Gateway provisioned, its certificate copied, its status written", func() error {
		gc, err := gw.GatewayV1().GatewayClasses().Get(ctx, "aether", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := meta.FindStatusCondition(gc.Status.Conditions, "Accepted"); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("GatewayClass aether Accepted %+v", c)
		}
		if err := errors.Join(cl.c.Get(ctx, edge, &corev1.ServiceAccount{}), cl.c.Get(ctx, edge, &appsv1.Deployment{}),
			cl.c.Get(ctx, edge, &corev1.Service{}), cl.c.Get(ctx, copyName, &corev1.Secret{})); err != nil {
			return err
		}
		g, err := gw.GatewayV1().Gateways(ns).Get(ctx, "front", metav1.GetOptions{})
		if err != nil {
			return err
		}
		a, p := meta.FindStatusCondition(g.Status.Conditions, "Accepted"), meta.FindStatusCondition(g.Status.Conditions, "Programmed")
		if a == nil || a.Status != metav1.ConditionTrue || a.ObservedGeneration != g.Generation || p == nil || p.Status != metav1.ConditionFalse ||
			p.Reason != string(gwv1.GatewayReasonPending) {
			return fmt.Errorf("Gateway front Accepted %+v, Programmed %+v; want True, and False/Pending (no available replica)", a, p)
		}
		attached := map[string]int32{}
		for _, l := range g.Status.Listeners {
			attached[string(l.Name)] = l.AttachedRoutes
		}
		if attached["http"] != 1 || attached["https"] != 1 || attached["pg"] != 1 {
			return fmt.Errorf("attachedRoutes %v, want 1 on http, https and pg", attached)
		}
		return nil
	})
	checkRoutes := func(gatewayEntries bool) error {
		r, err := gw.GatewayV1().HTTPRoutes(ns).Get(ctx, "site", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, err := checkParent("HTTPRoute site", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 1, acceptedTrue, resolvedTrue); err != nil {
			return err
		}
		tr, err := gw.GatewayV1().TCPRoutes(ns).Get(ctx, "pg", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, err := checkParent("TCPRoute pg", tr.Generation, tr.Spec.ParentRefs, tr.Status.Parents, 1, acceptedTrue, resolvedTrue); err != nil {
			return err
		}
		if !gatewayEntries {
			if n, m := ours(r.Status.Parents), ours(tr.Status.Parents); n != 1 || m != 1 {
				return fmt.Errorf("aether's entries: HTTPRoute site %d, TCPRoute pg %d; want only the mesh entries", n, m)
			}
			return nil
		}
		if _, err := checkParent("HTTPRoute site", r.Generation, r.Spec.ParentRefs, r.Status.Parents, 0, acceptedTrue, resolvedTrue); err != nil {
			return err
		}
		_, err = checkParent("TCPRoute pg", tr.Generation, tr.Spec.ParentRefs, tr.Status.Parents, 0, acceptedTrue, resolvedTrue)
		return err
	}
	testenv.Eventually(t, converge, "the routes' Gateway and mesh entries", func() error { return checkRoutes(true) })

	// The Gateway moves to another controller's class.
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		g, err := gw.GatewayV1().Gateways(ns).Get(ctx, "front", metav1.GetOptions{})
		if err != nil {
			return err
		}
		g.Spec.GatewayClassName = "other"
		_, err = gw.GatewayV1().Gateways(ns).Update(ctx, g, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, converge, "the edge objects and the copy removed", func() error {
		var errs []error
		for _, o := range []struct {
			name types.NamespacedName
			obj  client.Object
		}{{edge, &corev1.ServiceAccount{}}, {edge, &appsv1.Deployment{}}, {edge, &corev1.Service{}}, {copyName, &corev1.Secret{}}} {
			if err := cl.c.Get(ctx, o.name, o.obj); !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("%T %s still there (%v)", o.obj, o.name, err))
			}
		}
		return errors.Join(errs...)
	})
	testenv.Eventually(t, converge, "the Gateway entries removed, the mesh entry kept", func() error { return checkRoutes(false) })
}
