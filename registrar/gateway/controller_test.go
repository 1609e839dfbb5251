package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/encoding/protojson"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/aethermesh/aether/deploy"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/gateway"
)

// converge bounds every wait: several times the expected sub-second pass.
const converge = 60 * time.Second

const (
	systemNS = "aether-system"
	appNS    = "shop"
	image    = "registry.example/aether-envoy:test"
)

func ptr[T any](v T) *T { return &v }

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// env is a real kube-apiserver with every CRD aether ships and deploy/registrar's RBAC and
// admission policy, and a gateway.Controller running as the registrar's ServiceAccount
// (impersonated) in a manager of its own.
type env struct {
	t     *testing.T
	api   *testenv.KubeAPIServer
	admin client.Client
	gw    gwclient.Interface
	ctl   *gateway.Controller
	// applies counts the controller's server-side applies.
	applies atomic.Int64
}

// countingClient is the manager's client, counting server-side applies.
type countingClient struct {
	client.Client
	n *atomic.Int64
}

func (c countingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	c.n.Add(1)
	return c.Client.Apply(ctx, obj, opts...)
}

// startAPI starts a kube-apiserver with every CRD aether ships and namespaces systemNS and appNS,
// and returns it, the scheme of the objects the tests use and an admin client.
func startAPI(t *testing.T) (*testenv.KubeAPIServer, *runtime.Scheme, client.Client) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), gwv1.Install(scheme)); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(api.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{systemNS, appNS} {
		if err := admin.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	return api, scheme, admin
}

// startEnv starts the env; the controller may give Gateways addresses in 192.0.2.0/24 and in
// extraCIDRs.
func startEnv(t *testing.T, extraCIDRs ...netip.Prefix) *env {
	api, scheme, admin := startAPI(t)
	ctx := context.Background()
	for _, f := range []string{"registrar/rbac.yaml", "registrar/policy.yaml"} {
		objs, err := deploy.Objects(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if err := admin.Create(ctx, o); err != nil {
				t.Fatalf("%s: create %s %s: %v", f, o.GetKind(), o.GetName(), err)
			}
		}
	}
	reg := rest.CopyConfig(api.Config)
	reg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + systemNS + ":aether-registrar",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + systemNS, "system:authenticated"},
	}
	log := testLogger()
	mgr, err := ctrl.NewManager(reg, ctrl.Options{
		Scheme: scheme, Logger: logr.FromSlogHandler(log.Handler()),
		Cache:   cache.Options{ByObject: gateway.CacheByObject()},
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, api: api, admin: admin, gw: gwclient.NewForConfigOrDie(api.Config)}
	e.ctl = &gateway.Controller{Client: countingClient{mgr.GetClient(), &e.applies}, Gateway: gwclient.NewForConfigOrDie(reg), Namespace: systemNS,
		EnvoyImage: image, AddressCIDRs: append([]netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, extraCIDRs...),
		InfrastructureKeys: []string{"team", "example.com/"}, Log: log, PassDelay: 50 * time.Millisecond, SkipNameValidation: true}
	if err := e.ctl.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return e
}

// publish hands the controller a View of the cluster's classes and Gateways as they are now,
// with the given edge Gateways and statuses (what model.ResolveGateways would find).
func (e *env) publish(edges []*model.EdgeGateway, statuses ...model.GatewayStatus) {
	e.t.Helper()
	ctx := context.Background()
	cls, err := e.gw.GatewayV1().GatewayClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	gws, err := e.gw.GatewayV1().Gateways("").List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	v := gateway.View{Edges: edges, Statuses: statuses}
	for i := range cls.Items {
		v.Classes = append(v.Classes, &cls.Items[i])
	}
	for i := range gws.Items {
		v.Gateways = append(v.Gateways, &gws.Items[i])
	}
	e.ctl.SetView(v)
}

func (e *env) gateway(name string) *gwv1.Gateway {
	e.t.Helper()
	g, err := e.gw.GatewayV1().Gateways(appNS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return g
}

// modelStatus is what model.ResolveGateways finds for a valid Gateway with listeners names.
func modelStatus(g *gwv1.Gateway) model.GatewayStatus {
	yes := model.Condition{Status: true, Reason: "Accepted", Message: "accepted"}
	st := model.GatewayStatus{Key: model.GatewayKey{Namespace: g.Namespace, Name: g.Name}, Generation: g.Generation,
		Accepted: yes, Programmed: model.Condition{Status: true, Reason: "Programmed", Message: "programmed"}}
	for _, l := range g.Spec.Listeners {
		st.Listeners = append(st.Listeners, model.ListenerStatus{Name: string(l.Name), AttachedRoutes: 1,
			SupportedKinds: []model.RouteGroupKind{{Group: gwv1.GroupName, Kind: "HTTPRoute"}},
			Accepted:       yes, Programmed: model.Condition{Status: true, Reason: "Programmed"},
			ResolvedRefs: model.Condition{Status: true, Reason: "ResolvedRefs"}, Conflicted: model.Condition{Reason: "NoConflicts"}})
	}
	return st
}

// TestController runs the gateway controller as the registrar's ServiceAccount against a real
// kube-apiserver (with deploy/registrar's RBAC and admission policy) and hands it Views as the
// route status controller would: aether's GatewayClass is accepted, one with a parametersRef
// refused, another controller's left alone; a Gateway gets its ServiceAccount, Deployment (the
// bootstrap parses; the capture opt-out, the probe, the ports) and Service (ports, externalIPs),
// owned by it; a served certificate is copied into the registrar's namespace; the Gateway's
// status has the externalIPs as addresses and Programmed=False Pending until the Deployment has
// an available replica (set by hand: no kube-controller-manager here), then True, then the load
// balancer's address; the same View again writes nothing; a deleted Service comes back; an
// unreferenced copy is deleted; a class change removes the objects; and an object of the edge's
// name that aether did not create is refused by the policy and left as it is.
func TestController(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ca, err := testenv.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := ca.Issue("www.example.com", nil, []string{"www.example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: "www"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}}); err != nil {
		t.Fatal(err)
	}
	for _, gc := range []*gwv1.GatewayClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "aether"}, Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName}},
		{ObjectMeta: metav1.ObjectMeta{Name: "tuned"}, Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName,
			ParametersRef: &gwv1.ParametersReference{Group: "example.com", Kind: "Tuning", Name: "fast"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: gwv1.GatewayClassSpec{ControllerName: "example.net/gateway-controller"}},
	} {
		if _, err := e.gw.GatewayV1().GatewayClasses().Create(ctx, gc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	web := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: "web"}, Spec: gwv1.GatewaySpec{
		GatewayClassName: "aether",
		Listeners: []gwv1.Listener{
			{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType},
			{Name: "https", Port: 443, Protocol: gwv1.HTTPSProtocolType, TLS: &gwv1.ListenerTLSConfig{
				Mode: ptr(gwv1.TLSModeTerminate), CertificateRefs: []gwv1.SecretObjectReference{{Name: "www"}}}},
			{Name: "dns", Port: 53, Protocol: gwv1.UDPProtocolType},
		},
		Addresses: []gwv1.GatewaySpecAddress{{Type: ptr(gwv1.IPAddressType), Value: "192.0.2.10"}},
		Infrastructure: &gwv1.GatewayInfrastructure{Labels: map[gwv1.LabelKey]gwv1.LabelValue{"team": "edge"},
			Annotations: map[gwv1.AnnotationKey]gwv1.AnnotationValue{"example.com/lb": "internal"}},
	}}
	if _, err := e.gw.GatewayV1().Gateways(appNS).Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	www := model.SecretKey{Namespace: appNS, Name: "www"}
	edge := &model.EdgeGateway{Key: model.GatewayKey{Namespace: appNS, Name: "web"}, ServiceAccount: "web-aether-edge", Ports: []model.EdgePort{
		{Port: 443, Listeners: []model.EdgeListener{{Name: "https", Protocol: model.ListenerHTTPS, TLSMode: model.TLSTerminate,
			Certificates: []model.Certificate{{Ref: www, DNSNames: []string{"www.example.com"}}}}}},
	}}
	e.publish([]*model.EdgeGateway{edge}, modelStatus(e.gateway("web")))

	t.Run("classes", func(t *testing.T) {
		testenv.Eventually(t, converge, "GatewayClass conditions", func() error {
			for _, w := range []struct{ name, status, reason string }{
				{"aether", "True", "Accepted"}, {"tuned", "False", "InvalidParameters"},
				{"other", "Unknown", "Pending"}, // the CRD's default: not aether's to write
			} {
				gc, err := e.gw.GatewayV1().GatewayClasses().Get(ctx, w.name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				c := meta.FindStatusCondition(gc.Status.Conditions, "Accepted")
				if c == nil || string(c.Status) != w.status || c.Reason != w.reason {
					return fmt.Errorf("GatewayClass %s Accepted %+v, want %s/%s", w.name, c, w.status, w.reason)
				}
			}
			return nil
		})
	})

	name := types.NamespacedName{Namespace: appNS, Name: "web-aether-edge"}
	var sa corev1.ServiceAccount
	var dep appsv1.Deployment
	var svc corev1.Service
	t.Run("provisioned", func(t *testing.T) {
		testenv.Eventually(t, converge, "the edge objects", func() error {
			return errors.Join(e.admin.Get(ctx, name, &sa), e.admin.Get(ctx, name, &dep), e.admin.Get(ctx, name, &svc))
		})
		g := e.gateway("web")
		for _, o := range []client.Object{&sa, &dep, &svc} {
			refs := o.GetOwnerReferences()
			if len(refs) != 1 || refs[0].Kind != "Gateway" || refs[0].UID != g.UID || refs[0].Controller == nil || !*refs[0].Controller {
				t.Errorf("%T owner references %+v, want the Gateway %s as controller", o, refs, g.UID)
			}
			if l := o.GetLabels(); l[model.LabelManagedBy] != model.ManagedByAether || l[gwv1.GatewayNameLabelKey] != "web" || l["team"] != "edge" {
				t.Errorf("%T labels %v, want aether's and the Gateway's infrastructure label team=edge", o, l)
			}
			if a := o.GetAnnotations(); a["example.com/lb"] != "internal" {
				t.Errorf("%T annotations %v, want the Gateway's infrastructure annotation", o, a)
			}
		}
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Errorf("ServiceAccount automountServiceAccountToken %v, want false", sa.AutomountServiceAccountToken)
		}
		pod := dep.Spec.Template
		if pod.Labels["team"] != "edge" || pod.Annotations["example.com/lb"] != "internal" {
			t.Errorf("pod template labels %v annotations %v, want the Gateway's infrastructure ones", pod.Labels, pod.Annotations)
		}
		if pod.Annotations[model.AnnotationCapture] != "false" || pod.Spec.ServiceAccountName != "web-aether-edge" || len(pod.Spec.Containers) != 1 {
			t.Fatalf("pod template annotations %v, ServiceAccount %q, %d containers", pod.Annotations, pod.Spec.ServiceAccountName, len(pod.Spec.Containers))
		}
		c := pod.Spec.Containers[0]
		i := slices.Index(c.Args, "--config-yaml")
		var boot bootstrapv3.Bootstrap
		if c.Image != image || !slices.Equal(c.Command, []string{"envoy"}) || i < 0 {
			t.Fatalf("container image %q command %v args %v", c.Image, c.Command, c.Args)
		}
		if err := protojson.Unmarshal([]byte(c.Args[i+1]), &boot); err != nil || boot.GetNode().GetId() != "edge~shop~web" {
			t.Errorf("bootstrap: %v, node id %q", err, boot.GetNode().GetId())
		}
		if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/ready" || p.HTTPGet.Port.IntValue() != 15090 {
			t.Errorf("readiness probe %+v", p)
		}
		var ports []string
		for _, p := range c.Ports {
			ports = append(ports, fmt.Sprintf("%d/%s", p.ContainerPort, p.Protocol))
		}
		if want := []string{"53/UDP", "80/TCP", "443/TCP"}; !slices.Equal(ports, want) {
			t.Errorf("container ports %v, want %v", ports, want)
		}
		if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_BIND_SERVICE"}) {
			t.Errorf("container security context %+v, want NET_BIND_SERVICE added (ports below 1024)", sc)
		}
		var sports []string
		for _, p := range svc.Spec.Ports {
			sports = append(sports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		}
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || !slices.Equal(sports, ports) || !slices.Equal(svc.Spec.ExternalIPs, []string{"192.0.2.10"}) {
			t.Errorf("Service type %s ports %v externalIPs %v, want LoadBalancer %v [192.0.2.10]", svc.Spec.Type, sports, svc.Spec.ExternalIPs, ports)
		}
	})

	copyName := types.NamespacedName{Namespace: systemNS, Name: model.EdgeCertificateSecretName(www)}
	t.Run("certificate copy", func(t *testing.T) {
		var cp corev1.Secret
		testenv.Eventually(t, converge, "the certificate copy", func() error { return e.admin.Get(ctx, copyName, &cp) })
		if cp.Type != corev1.SecretTypeTLS || string(cp.Data[corev1.TLSCertKey]) != string(crt) || string(cp.Data[corev1.TLSPrivateKeyKey]) != string(key) ||
			cp.Labels[model.LabelEdgeCertificate] != "true" || cp.Labels[model.LabelManagedBy] != model.ManagedByAether ||
			cp.Annotations[model.AnnotationCertificateRef] != "shop/www" {
			t.Errorf("copy %s: type %s, labels %v, annotations %v, data equal %v", copyName, cp.Type, cp.Labels, cp.Annotations,
				string(cp.Data[corev1.TLSCertKey]) == string(crt))
		}
	})

	status := func(programmed, reason string, addresses ...string) func() error {
		return func() error {
			g := e.gateway("web")
			var got []string
			for _, a := range g.Status.Addresses {
				got = append(got, a.Value)
			}
			p := meta.FindStatusCondition(g.Status.Conditions, "Programmed")
			a := meta.FindStatusCondition(g.Status.Conditions, "Accepted")
			switch {
			case !slices.Equal(got, addresses):
				return fmt.Errorf("addresses %v, want %v", got, addresses)
			case p == nil || string(p.Status) != programmed || p.Reason != reason || p.ObservedGeneration != g.Generation:
				return fmt.Errorf("Programmed %+v, want %s/%s", p, programmed, reason)
			case a == nil || a.Status != metav1.ConditionTrue || len(g.Status.Listeners) != 3 || g.Status.Listeners[0].AttachedRoutes != 1:
				return fmt.Errorf("Accepted %+v, listeners %+v", a, g.Status.Listeners)
			}
			return nil
		}
	}
	t.Run("status", func(t *testing.T) {
		testenv.Eventually(t, converge, "Programmed=False Pending at the externalIP", status("False", "Pending", "192.0.2.10"))
		if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			var d appsv1.Deployment
			if err := e.admin.Get(ctx, name, &d); err != nil {
				return err
			}
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
			return e.admin.Status().Update(ctx, &d)
		}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "Programmed=True once a replica is available", status("True", "Programmed", "192.0.2.10"))
		if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			var s corev1.Service
			if err := e.admin.Get(ctx, name, &s); err != nil {
				return err
			}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}
			return e.admin.Status().Update(ctx, &s)
		}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "the load balancer's address", status("True", "Programmed", "203.0.113.7"))
	})

	t.Run("nothing to change writes nothing", func(t *testing.T) {
		versions := func() []string {
			var out []string
			var s corev1.Secret
			for _, o := range []client.Object{&sa, &dep, &svc, &s} {
				n := name
				if o == &s {
					n = copyName
				}
				if err := e.admin.Get(ctx, n, o); err != nil {
					t.Fatal(err)
				}
				out = append(out, o.GetResourceVersion())
			}
			out = append(out, e.gateway("web").ResourceVersion)
			return out
		}
		before, applies := versions(), e.applies.Load()
		for range 3 {
			e.publish([]*model.EdgeGateway{edge}, modelStatus(e.gateway("web")))
			time.Sleep(300 * time.Millisecond)
		}
		if after := versions(); !slices.Equal(before, after) {
			t.Errorf("resourceVersions of the ServiceAccount, Deployment, Service, copy and Gateway %v, then %v: written again", before, after)
		}
		if n := e.applies.Load() - applies; n != 0 {
			t.Errorf("%d server-side applies in passes that had nothing to change", n)
		}
	})

	t.Run("a deleted Service comes back", func(t *testing.T) {
		old := svc.UID
		if err := e.admin.Delete(ctx, &svc); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, "the Service recreated", func() error {
			var s corev1.Service
			if err := e.admin.Get(ctx, name, &s); err != nil {
				return err
			}
			if s.UID == old {
				return errors.New("still the old Service")
			}
			return nil
		})
	})

	t.Run("an unreferenced copy is deleted", func(t *testing.T) {
		e.publish(nil, modelStatus(e.gateway("web")))
		testenv.Eventually(t, converge, "the copy deleted", func() error {
			if err := e.admin.Get(ctx, copyName, &corev1.Secret{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("copy %s still there (%v)", copyName, err)
			}
			return nil
		})
	})

	t.Run("a class change removes the objects", func(t *testing.T) {
		if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			g := e.gateway("web")
			g.Spec.GatewayClassName = "other"
			_, err := e.gw.GatewayV1().Gateways(appNS).Update(ctx, g, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		e.publish(nil)
		testenv.Eventually(t, converge, "the edge objects removed", func() error {
			var errs []error
			for _, o := range []client.Object{&corev1.ServiceAccount{}, &appsv1.Deployment{}, &corev1.Service{}} {
				if err := e.admin.Get(ctx, name, o); !apierrors.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("%T still there (%v)", o, err))
				}
			}
			return errors.Join(errs...)
		})
	})

	t.Run("an object aether did not create is left alone", func(t *testing.T) {
		theirs := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: "api-aether-edge", Labels: map[string]string{"team": "api"}}}
		if err := e.admin.Create(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		api := web.DeepCopy()
		api.Name, api.Spec.Addresses = "api", nil
		api.Spec.Listeners = api.Spec.Listeners[:1]
		// The policy takes effect once the API server has loaded it.
		testenv.Eventually(t, converge, "the registrar's policy in force", func() error {
			if msg := policyRefusal(t, e, api); !strings.Contains(msg, "aether-registrar may update and delete only objects labelled") {
				return fmt.Errorf("the registrar's update of the user's ServiceAccount: %q, want the policy's refusal", msg)
			}
			return nil
		})
		if _, err := e.gw.GatewayV1().Gateways(appNS).Create(ctx, api, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.publish(nil, modelStatus(e.gateway("api")))
		apiName := types.NamespacedName{Namespace: appNS, Name: "api-aether-edge"}
		testenv.Eventually(t, converge, "the other edge objects of Gateway api", func() error {
			return errors.Join(e.admin.Get(ctx, apiName, &appsv1.Deployment{}), e.admin.Get(ctx, apiName, &corev1.Service{}))
		})
		time.Sleep(time.Second) // passes retried meanwhile
		var got corev1.ServiceAccount
		if err := e.admin.Get(ctx, apiName, &got); err != nil {
			t.Fatal(err)
		}
		if got.UID != theirs.UID || got.Labels[model.LabelManagedBy] != "" || len(got.OwnerReferences) != 0 || got.Labels["team"] != "api" {
			t.Errorf("the user's ServiceAccount was taken over: labels %v, owners %v", got.Labels, got.OwnerReferences)
		}
	})
}

// policyRefusal returns the error the registrar's ServiceAccount gets writing the edge
// ServiceAccount of gw over the user's ServiceAccount of that name (a dry run), "" for none.
func policyRefusal(t *testing.T, e *env, gw *gwv1.Gateway) string {
	t.Helper()
	reg := rest.CopyConfig(e.api.Config)
	reg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + systemNS + ":aether-registrar",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + systemNS, "system:authenticated"}}
	c, err := client.New(reg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gw = gw.DeepCopy()
	if gw.UID == "" {
		gw.UID = "not-created-yet"
	}
	sa := gateway.ServiceAccount(gw, nil)
	var live corev1.ServiceAccount
	if err := e.admin.Get(context.Background(), client.ObjectKeyFromObject(sa), &live); err != nil {
		t.Fatal(err)
	}
	sa.ResourceVersion = live.ResourceVersion
	err = c.Update(context.Background(), sa, client.DryRunAll)
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestControllerLeavesForeignObjects: objects that carry the edge labels and an edge name but no
// controller ownerReference to their Gateway are not aether's: a user who may only label objects
// cannot have the registrar delete one (removeStale), and a Gateway named after an existing
// Service does not take it over (apply refuses, the object is unchanged).
func TestControllerLeavesForeignObjects(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	if _, err := e.gw.GatewayV1().GatewayClasses().Create(ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "aether"},
		Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A labelled Service of no Gateway at all, and one named after the Gateway "db" about to be
	// created; both made by an administrator, not by aether.
	foreign := func(name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: name + "-aether-edge", Labels: gateway.Labels(name)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "keep", Port: 7777}}}}
	}
	for _, s := range []*corev1.Service{foreign("orphan"), foreign("db")} {
		if err := e.admin.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	db := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: "db"}, Spec: gwv1.GatewaySpec{
		GatewayClassName: "aether", Listeners: []gwv1.Listener{{Name: "pg", Port: 5432, Protocol: gwv1.TCPProtocolType}}}}
	if _, err := e.gw.GatewayV1().Gateways(appNS).Create(ctx, db, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g := e.gateway("db")
	e.publish(nil, modelStatus(g))
	// The Gateway's other objects are provisioned (the pass ran), the foreign Services stay as
	// they were.
	testenv.Eventually(t, converge, "the Deployment of Gateway db provisioned", func() error {
		return e.admin.Get(ctx, types.NamespacedName{Namespace: appNS, Name: "db-aether-edge"}, &appsv1.Deployment{})
	})
	time.Sleep(2 * time.Second) // more passes
	for _, name := range []string{"orphan-aether-edge", "db-aether-edge"} {
		var s corev1.Service
		if err := e.admin.Get(ctx, types.NamespacedName{Namespace: appNS, Name: name}, &s); err != nil {
			t.Fatalf("Service %s: %v (deleted by the registrar?)", name, err)
		}
		if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Name != "keep" || metav1.GetControllerOf(&s) != nil {
			t.Errorf("Service %s taken over: ports %+v owner %v", name, s.Spec.Ports, metav1.GetControllerOf(&s))
		}
	}
}

// TestControllerAddresses runs the controller (as in TestController) with Gateways asking for
// addresses inside its ranges (192.0.2.0/24 and the service range 10.96.0.0/16): two Gateways
// asking for one address and port, the older (created first, though its name sorts last) gets it
// as its edge Service's external IP and the newer is refused (Programmed=False,
// AddressNotUsable, naming the field, the value and the older Gateway); the older deleted, the
// newer gets it; a Service's cluster IP and a Node's InternalIP are refused, naming the Service
// and the Node, and are on no edge Service.
func TestControllerAddresses(t *testing.T) {
	e := startEnv(t, netip.MustParsePrefix("10.96.0.0/16"))
	ctx := context.Background()
	if _, err := e.gw.GatewayV1().GatewayClasses().Create(ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "aether"},
		Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	db := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: "db"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "pg", Port: 5432}}}}
	if err := e.admin.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	nodeA := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	if err := e.admin.Create(ctx, nodeA); err != nil {
		t.Fatal(err)
	}
	nodeA.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "node-a"}, {Type: corev1.NodeInternalIP, Address: "192.0.2.40"}}
	if err := e.admin.Status().Update(ctx, nodeA); err != nil {
		t.Fatal(err)
	}
	create := func(t *testing.T, name, address string) {
		t.Helper()
		g := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: name}, Spec: gwv1.GatewaySpec{
			GatewayClassName: "aether",
			Listeners:        []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}},
			Addresses:        []gwv1.GatewaySpecAddress{{Type: ptr(gwv1.IPAddressType), Value: address}},
		}}
		if _, err := e.gw.GatewayV1().Gateways(appNS).Create(ctx, g, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// publish hands the controller a View of every Gateway there is, each resolved valid.
	publish := func(t *testing.T) {
		t.Helper()
		gws, err := e.gw.GatewayV1().Gateways(appNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var sts []model.GatewayStatus
		for i := range gws.Items {
			sts = append(sts, modelStatus(&gws.Items[i]))
		}
		e.publish(nil, sts...)
	}
	// edge waits until Gateway name's edge Service has externalIPs ips and its Programmed
	// condition has reason (and, for AddressNotUsable, a message containing each of says).
	edge := func(t *testing.T, name string, ips []string, reason string, says ...string) {
		t.Helper()
		testenv.Eventually(t, converge, "Gateway "+name+": external IPs "+strings.Join(ips, ",")+", Programmed "+reason, func() error {
			var s corev1.Service
			if err := e.admin.Get(ctx, types.NamespacedName{Namespace: appNS, Name: name + "-aether-edge"}, &s); err != nil {
				return err
			}
			if !slices.Equal(s.Spec.ExternalIPs, ips) {
				return fmt.Errorf("edge Service externalIPs %v, want %v", s.Spec.ExternalIPs, ips)
			}
			g := e.gateway(name)
			p := meta.FindStatusCondition(g.Status.Conditions, "Programmed")
			if p == nil || p.Status != metav1.ConditionFalse || p.Reason != reason {
				return fmt.Errorf("Programmed %+v, want False %s", p, reason)
			}
			for _, w := range says {
				if !strings.Contains(p.Message, w) {
					return fmt.Errorf("Programmed message %q does not say %q", p.Message, w)
				}
			}
			return nil
		})
	}

	t.Run("two Gateways, one address: the older keeps it", func(t *testing.T) {
		create(t, "zz-first", "192.0.2.20")
		// creationTimestamp has a resolution of one second.
		time.Sleep(1100 * time.Millisecond)
		create(t, "aa-second", "192.0.2.20")
		publish(t)
		// No available replica here (no kube-controller-manager): Programmed stays Pending.
		edge(t, "zz-first", []string{"192.0.2.20"}, "Pending")
		edge(t, "aa-second", nil, "AddressNotUsable", "spec.addresses[0]: value 192.0.2.20", "port 80/TCP by Gateway shop/zz-first")
	})

	t.Run("the older deleted, the newer gets it", func(t *testing.T) {
		if err := e.gw.GatewayV1().Gateways(appNS).Delete(ctx, "zz-first", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		publish(t)
		edge(t, "aa-second", []string{"192.0.2.20"}, "Pending")
		if err := e.admin.Get(ctx, types.NamespacedName{Namespace: appNS, Name: "zz-first-aether-edge"}, &corev1.Service{}); !apierrors.IsNotFound(err) {
			t.Errorf("edge Service of the deleted Gateway: %v, want it deleted", err)
		}
	})

	t.Run("a Service's cluster IP is refused", func(t *testing.T) {
		if err := e.admin.Get(ctx, client.ObjectKeyFromObject(db), db); err != nil {
			t.Fatal(err)
		}
		create(t, "takes-db", db.Spec.ClusterIP)
		publish(t)
		edge(t, "takes-db", nil, "AddressNotUsable", "spec.addresses[0]: value "+db.Spec.ClusterIP+": in use by Service shop/db (spec.clusterIPs)")
	})

	t.Run("a node's address is refused", func(t *testing.T) {
		create(t, "takes-node", "192.0.2.40")
		publish(t)
		edge(t, "takes-node", nil, "AddressNotUsable", "spec.addresses[0]: value 192.0.2.40: the address of a Node")
	})
}

// failingClient is a direct API client that fails to list Nodes (failNodes) and to apply the
// object of kind and name failApply ("Service/newer-aether-edge").
type failingClient struct {
	client.Client
	failNodes bool
	failApply string
}

func (c *failingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*corev1.NodeList); ok && c.failNodes {
		return errors.New("injected: cannot list Nodes")
	}
	return c.Client.List(ctx, list, opts...)
}

func (c *failingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	if o, ok := obj.(interface {
		GetName() string
		GetKind() string
	}); ok && o.GetKind()+"/"+o.GetName() == c.failApply {
		return errors.New("injected: cannot apply " + c.failApply)
	}
	return c.Client.Apply(ctx, obj, opts...)
}

// TestControllerAddressesFailures runs passes of the controller (Reconcile called directly, a
// direct API client that fails where told) against a real kube-apiserver: a pass that cannot
// list the Nodes fails and applies nothing; a pass in which the Gateway losing an address cannot
// be written does not give that address to the Gateway gaining it (no address on two edge
// Services), and says so; the next pass, nothing failing, moves it. The same when two Gateways
// swap addresses.
func TestControllerAddressesFailures(t *testing.T) {
	api, _, admin := startAPI(t)
	ctx := context.Background()
	gwc := gwclient.NewForConfigOrDie(api.Config)
	class, err := gwc.GatewayV1().GatewayClasses().Create(ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "aether"},
		Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fc := &failingClient{Client: admin}
	ctl := &gateway.Controller{Client: fc, Gateway: gwc, Namespace: systemNS, EnvoyImage: image,
		AddressCIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, Log: testLogger()}
	create := func(name string, addresses ...string) {
		t.Helper()
		g := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: name}, Spec: gwv1.GatewaySpec{
			GatewayClassName: "aether", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}}}
		for _, a := range addresses {
			g.Spec.Addresses = append(g.Spec.Addresses, gwv1.GatewaySpecAddress{Value: a})
		}
		if _, err := gwc.GatewayV1().Gateways(appNS).Create(ctx, g, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// pass sets the View to every Gateway there is and runs one pass.
	pass := func() error {
		t.Helper()
		gws, err := gwc.GatewayV1().Gateways(appNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v := gateway.View{Classes: []*gwv1.GatewayClass{class}}
		for i := range gws.Items {
			v.Gateways = append(v.Gateways, &gws.Items[i])
		}
		ctl.SetView(v)
		_, err = ctl.Reconcile(ctx, reconcile.Request{})
		return err
	}
	externalIPs := func(name string) ([]string, error) {
		var s corev1.Service
		err := admin.Get(ctx, types.NamespacedName{Namespace: appNS, Name: name + "-aether-edge"}, &s)
		return s.Spec.ExternalIPs, err
	}
	// want checks the external IPs of the older and the newer Gateway's edge Services.
	want := func(what string, older, newer []string) {
		t.Helper()
		o, oerr := externalIPs("older")
		n, nerr := externalIPs("newer")
		if !slices.Equal(o, older) || !slices.Equal(n, newer) {
			t.Errorf("external IPs: older %v (%v), newer %v (%v); want %v and %v: %s", o, oerr, n, nerr, older, newer, what)
		}
	}

	create("older")
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has a resolution of one second
	create("newer", "192.0.2.20")
	fc.failNodes = true
	if err := pass(); err == nil || !strings.Contains(err.Error(), "list Nodes") {
		t.Fatalf("pass with the Nodes unreadable: %v, want the list error", err)
	}
	for _, name := range []string{"older", "newer"} {
		if _, err := externalIPs(name); !apierrors.IsNotFound(err) {
			t.Errorf("edge Service of %s after a failed read: %v, want none applied", name, err)
		}
	}
	fc.failNodes = false
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	if ips, err := externalIPs("newer"); err != nil || !slices.Equal(ips, []string{"192.0.2.20"}) {
		t.Fatalf("newer's external IPs %v (%v), want [192.0.2.20]", ips, err)
	}

	// ask sets Gateway name's spec.addresses to address.
	ask := func(name, address string) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			g, err := gwc.GatewayV1().Gateways(appNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			g.Spec.Addresses = []gwv1.GatewaySpecAddress{{Value: address}}
			_, err = gwc.GatewayV1().Gateways(appNS).Update(ctx, g, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The older Gateway asks for the newer's address: the newer keeps it (it has it).
	ask("older", "192.0.2.20")
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	want("192.0.2.20 stays on newer", nil, []string{"192.0.2.20"})
	// The newer lets it go: it moves to the older, unless the newer's Service cannot be written.
	ask("newer", "192.0.2.21")
	fc.failApply = "Service/newer-aether-edge"
	err = pass()
	if err == nil || !strings.Contains(err.Error(), "give Gateway shop/older external IP 192.0.2.20: not in this pass: Gateway shop/newer, which had it, could not be written") {
		t.Errorf("pass with newer's Service unwritable: %v, want it to say 192.0.2.20 is held back", err)
	}
	want("192.0.2.20 left on newer only", nil, []string{"192.0.2.20"})
	fc.failApply = ""
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	want("192.0.2.20 moved to older", []string{"192.0.2.20"}, []string{"192.0.2.21"})

	// The two swap addresses, each losing one and gaining the other's: with the newer's Service
	// unwritable, the older loses its address but does not get the newer's.
	ask("older", "192.0.2.21")
	ask("newer", "192.0.2.20")
	fc.failApply = "Service/newer-aether-edge"
	if err := pass(); err == nil || !strings.Contains(err.Error(), "give Gateway shop/older external IP 192.0.2.21: not in this pass") {
		t.Errorf("swap with newer's Service unwritable: %v, want 192.0.2.21 held back", err)
	}
	want("none on older, 192.0.2.21 left on newer", nil, []string{"192.0.2.21"})
	fc.failApply = ""
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	want("swapped", []string{"192.0.2.21"}, []string{"192.0.2.20"})
}
