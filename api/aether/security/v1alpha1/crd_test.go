package v1alpha1_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
	"github.com/aethermesh/aether/internal/testenv"
)

// TestCRDValidation installs the generated CRD (deploy/crds) in a real kube-apiserver and checks
// its OpenAPI and CEL validation: a full valid policy is stored with its defaults, and each
// malformed one is refused with the message of the rule it breaks.
func TestCRDValidation(t *testing.T) {
	create := crdClient(t, "security.aether.io_authorizationpolicies.yaml", sec.Resource, "AuthorizationPolicy")

	got, err := create("full", `
  action: DENY
  dryRun: true
  targetRefs:
  - kind: Service
    name: web
  - kind: Pod
    selector: {}
  rules:
  - sources:
    - type: ServiceAccount
      serviceAccount: {name: frontend}
    - type: SPIFFE
      spiffe: spiffe://partner.example/*
    - type: Namespace
      namespace: monitoring
    networkAttributes: {ports: [8080]}
    http:
      methods: [GET]
      paths: [{value: /api}, {type: Exact, value: /healthz}]
  - sources: []
`)
	if err != nil {
		t.Fatalf("valid policy refused: %v", err)
	}
	var p sec.AuthorizationPolicy
	b, _ := yaml.Marshal(got.Object)
	if err := yaml.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.TargetRefs[0].Group != "" || p.Spec.Rules[0].HTTP.Paths[0].Type != sec.PathMatchPathPrefix ||
		p.Spec.Rules[1].Sources == nil || len(p.Spec.Rules[1].Sources) != 0 || p.Spec.TargetRefs[1].Selector == nil {
		t.Errorf("stored policy = %+v: want group and path type defaulted, rule 1's sources [] kept, the Pod target's {} selector kept", p.Spec)
	}

	for _, tc := range []struct{ name, spec, want string }{
		{"no targets", "  action: ALLOW\n  targetRefs: []\n", "should have at least 1 items"},
		{"action", "  action: AUDIT\n  targetRefs: [{kind: Service, name: web}]\n", `Unsupported value: "AUDIT"`},
		{"target kind", "  action: ALLOW\n  targetRefs: [{kind: Deployment, name: web}]\n", `Unsupported value: "Deployment"`},
		{"target group", "  action: ALLOW\n  targetRefs: [{group: apps, kind: Service, name: web}]\n", `Unsupported value: "apps"`},
		{"pod with name", "  action: ALLOW\n  targetRefs: [{kind: Pod, name: web, selector: {}}]\n", "a Pod target takes a selector and no name"},
		{"pod without selector", "  action: ALLOW\n  targetRefs: [{kind: Pod}]\n", "a Pod target takes a selector and no name"},
		{"service with selector", "  action: ALLOW\n  targetRefs: [{kind: Service, name: web, selector: {}}]\n", "a Service target takes a name and no selector"},
		{"service without name", "  action: ALLOW\n  targetRefs: [{kind: Service}]\n", "a Service target takes a name and no selector"},
		{"source type", "  action: ALLOW\n  targetRefs: [{kind: Service, name: web}]\n  rules: [{sources: [{type: IP}]}]\n", `Unsupported value: "IP"`},
		{"source field missing", "  action: ALLOW\n  targetRefs: [{kind: Service, name: web}]\n  rules: [{sources: [{type: SPIFFE}]}]\n",
			"exactly the field that type names must be set"},
		{"source two fields", "  action: ALLOW\n  targetRefs: [{kind: Service, name: web}]\n  rules: [{sources: [{type: Namespace, namespace: a, spiffe: 'spiffe://td/x'}]}]\n",
			"exactly the field that type names must be set"},
		{"spiffe scheme", "  action: ALLOW\n  targetRefs: [{kind: Service, name: web}]\n  rules: [{sources: [{type: SPIFFE, spiffe: 'spiffe:/x'}]}]\n",
			"a SPIFFE ID starts with spiffe://"},
		{"port", "  action: ALLOW\n  targetRefs: [{kind: Service, name: web}]\n  rules: [{networkAttributes: {ports: [0]}}]\n", "should be greater than or equal to 1"},
		{"method", "  action: ALLOW\n  targetRefs: [{kind: Service, name: web}]\n  rules: [{http: {methods: [get]}}]\n", `Unsupported value: "get"`},
		{"path", "  action: ALLOW\n  targetRefs: [{kind: Service, name: web}]\n  rules: [{http: {paths: [{value: api}]}}]\n", "a path starts with /"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := create(strings.ReplaceAll(strings.ToLower(tc.name), " ", "-"), tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("create: %v, want a refusal containing %q", err, tc.want)
			}
		})
	}
}

// TestPeerAuthenticationCRDValidation installs the generated PeerAuthentication CRD in a real
// kube-apiserver: an Istio-shaped policy (numeric portLevelMtls keys, as YAML writes them) is
// stored with its defaults, and DISABLE, ports out of range or aether's own, and modes outside
// the enum are refused with the message of the rule they break.
func TestPeerAuthenticationCRDValidation(t *testing.T) {
	create := crdClient(t, "security.aether.io_peerauthentications.yaml", sec.PeerAuthenticationResource, "PeerAuthentication")

	got, err := create("istio-shaped", `
  selector:
    matchLabels: {app: web}
  mtls: {mode: PERMISSIVE}
  portLevelMtls:
    8080: {mode: STRICT}
    9090: {}
`)
	if err != nil {
		t.Fatalf("valid policy refused: %v", err)
	}
	var p sec.PeerAuthentication
	b, _ := yaml.Marshal(got.Object)
	if err := yaml.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.MTLS.Mode != sec.MTLSPermissive || p.Spec.PortLevelMTLS["8080"].Mode != sec.MTLSStrict || p.Spec.PortLevelMTLS["9090"].Mode != sec.MTLSUnset {
		t.Errorf("stored policy = %+v: want mode PERMISSIVE, 8080 STRICT, 9090 defaulted to UNSET", p.Spec)
	}
	if _, err := create("namespace-wide", "  portLevelMtls: {'8443': {mode: PERMISSIVE}}\n"); err != nil {
		t.Errorf("namespace-wide portLevelMtls (allowed by aether, not by Istio) refused: %v", err)
	}
	if _, err := create("empty", "  {}\n"); err != nil {
		t.Errorf("empty spec (namespace-wide, UNSET) refused: %v", err)
	}

	for _, tc := range []struct{ name, spec, want string }{
		{"disable", "  mtls: {mode: DISABLE}\n", "mode DISABLE is not supported: aether has no plaintext-only mode; use PERMISSIVE"},
		{"port disable", "  portLevelMtls: {'8080': {mode: DISABLE}}\n", "mode DISABLE is not supported"},
		{"mode", "  mtls: {mode: strict}\n", `Unsupported value: "strict"`},
		{"port 0", "  portLevelMtls: {'0': {mode: STRICT}}\n", "portLevelMtls keys are port numbers 1-65535"},
		{"port too big", "  portLevelMtls: {'65536': {mode: STRICT}}\n", "portLevelMtls keys are port numbers 1-65535"},
		{"port leading zero", "  portLevelMtls: {'08080': {mode: STRICT}}\n", "portLevelMtls keys are port numbers 1-65535"},
		{"port name", "  portLevelMtls: {http: {mode: STRICT}}\n", "portLevelMtls keys are port numbers 1-65535"},
		{"inbound port", "  portLevelMtls: {'15008': {mode: PERMISSIVE}}\n", "may not name 15001, 15008 or 18054"},
		{"capture port", "  portLevelMtls: {'15001': {mode: STRICT}}\n", "may not name 15001, 15008 or 18054"},
		{"dns port", "  portLevelMtls: {'18054': {mode: STRICT}}\n", "may not name 15001, 15008 or 18054"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := create(strings.ReplaceAll(strings.ToLower(tc.name), " ", "-"), tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("create: %v, want a refusal containing %q", err, tc.want)
			}
		})
	}
}

// crdClient starts a kube-apiserver with the CRD file crd (of deploy/crds) installed and the
// namespace shop, and returns a function that creates an object of kind at resource in shop
// from its spec (YAML, indented under "spec:") and returns what the API server stored or its
// refusal. The API server may serve a new CRD a moment after it is Established: a "not found"
// is retried.
func crdClient(t *testing.T, crd string, resource schema.GroupVersionResource, kind string) func(name, spec string) (*unstructured.Unstructured, error) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, testenv.CRDSubset(t, crd))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if _, err := kubernetes.NewForConfigOrDie(api.Config).CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	res := dynamic.NewForConfigOrDie(api.Config).Resource(resource).Namespace("shop")
	return func(name, spec string) (*unstructured.Unstructured, error) {
		t.Helper()
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte("spec:\n"+spec), &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetAPIVersion(sec.GroupVersion.String())
		u.SetKind(kind)
		u.SetName(name)
		var got *unstructured.Unstructured
		var err error
		testenv.Eventually(t, 30*time.Second, "the API server knows the CRD", func() error {
			got, err = res.Create(ctx, u, metav1.CreateOptions{})
			if err != nil && strings.Contains(err.Error(), "the server could not find the requested resource") {
				return err
			}
			return nil
		})
		return got, err
	}
}
