package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// gatewayAPIVersion is the sigs.k8s.io/gateway-api release whose CRDs deploy/crds ships (go.mod
// pins the same module version; hack/verify-crds.sh checks the files against it).
const gatewayAPIVersion = "v1.6.3"

// TestGatewayAPICRDs checks the shipped Gateway API CRDs: every one is of the experimental
// channel and of gatewayAPIVersion; installed in a real kube-apiserver, they take a GAMMA
// HTTPRoute (a Service parentRef with a port) and a GRPCRoute written with the Go types of the
// same version, and keep the experimental retry fields (GEP-1731) that the standard channel's CRDs
// would prune; aether's GatewayClass controllerName is valid.
func TestGatewayAPICRDs(t *testing.T) {
	files, err := filepath.Glob("crds/gateway.networking.k8s.io_*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Gateway API CRDs in deploy/crds: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		a := crd.Metadata.Annotations
		if a["gateway.networking.k8s.io/channel"] != "experimental" || a["gateway.networking.k8s.io/bundle-version"] != gatewayAPIVersion {
			t.Errorf("%s: channel %q, bundle version %q; want experimental %s", f, a["gateway.networking.k8s.io/channel"], a["gateway.networking.k8s.io/bundle-version"], gatewayAPIVersion)
		}
	}

	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	scheme := runtime.NewScheme()
	if err := gatewayv1.Install(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(api.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	port := gatewayv1.PortNumber(80)
	attempts := 3
	backoff := gatewayv1.Duration("100ms")
	svcKind, core := gatewayv1.Kind("Service"), gatewayv1.Group(corev1.GroupName)
	parent := gatewayv1.ParentReference{Group: &core, Kind: &svcKind, Name: "web", Port: &port}
	hr := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-canary"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{parent}},
			Rules: []gatewayv1.HTTPRouteRule{{
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "web-v2", Port: &port}}}},
				Retry:       &gatewayv1.HTTPRouteRetry{Codes: []gatewayv1.HTTPRouteRetryStatusCode{503}, Attempts: &attempts, Backoff: &backoff},
			}},
		},
	}
	if err := c.Create(ctx, hr); err != nil {
		t.Fatalf("create a GAMMA HTTPRoute: %v", err)
	}
	var got gatewayv1.HTTPRoute
	if err := c.Get(ctx, client.ObjectKeyFromObject(hr), &got); err != nil {
		t.Fatal(err)
	}
	r := got.Spec.Rules[0].Retry
	if r == nil || r.Attempts == nil || *r.Attempts != 3 || len(r.Codes) != 1 || r.Codes[0] != 503 || r.Backoff == nil || *r.Backoff != "100ms" {
		t.Fatalf("the stored route lost its retry (the CRD pruned an experimental field?): %+v", r)
	}
	if p := got.Spec.ParentRefs[0]; p.Kind == nil || *p.Kind != "Service" || p.Port == nil || *p.Port != 80 {
		t.Fatalf("the stored route's parentRef: %+v", p)
	}
	method := gatewayv1.GRPCMethodMatchExact
	svc, meth := "aether.e2e.Echo", "Echo"
	gr := &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "echo-method"},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{parent}},
			Rules: []gatewayv1.GRPCRouteRule{{
				Matches:     []gatewayv1.GRPCRouteMatch{{Method: &gatewayv1.GRPCMethodMatch{Type: &method, Service: &svc, Method: &meth}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "web", Port: &port}}}},
			}},
		},
	}
	if err := c.Create(ctx, gr); err != nil {
		t.Fatalf("create a GAMMA GRPCRoute: %v", err)
	}
	// aether's controller name is one the CRDs accept (a domain-prefixed path).
	gc := &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "aether"},
		Spec: gatewayv1.GatewayClassSpec{ControllerName: gatewayv1.GatewayController(model.GatewayControllerName)}}
	if err := c.Create(ctx, gc); err != nil {
		t.Fatalf("a GatewayClass with controllerName %s: %v", model.GatewayControllerName, err)
	}
	// The CRDs' own validation is in force: a rule with a retry count below zero is refused.
	bad := hr.DeepCopy()
	bad.ResourceVersion, bad.Name = "", "bad-retry"
	neg := -1
	bad.Spec.Rules[0].Retry.Attempts = &neg
	if err := c.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "attempts") {
		t.Fatalf("a negative retry count: %v, want the CRD's validation error naming attempts", err)
	}
}
