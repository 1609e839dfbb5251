package authzstatus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

func TestStatus(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Hour))
	svc := sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Service", Name: "web"}
	pods := sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Pod", Selector: &metav1.LabelSelector{}}
	gone := sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Service", Name: "gone"}
	policy := func(action sec.AuthorizationPolicyAction, refs ...sec.PolicyTargetReferenceWithLabelSelectors) *sec.AuthorizationPolicy {
		return &sec.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "p", Generation: 2},
			Spec: sec.AuthorizationPolicySpec{Action: action, TargetRefs: refs, Rules: []sec.AuthorizationRule{{}}}}
	}
	badRule := func(p *sec.AuthorizationPolicy) *sec.AuthorizationPolicy {
		p.Spec.Rules = []sec.AuthorizationRule{{Sources: []sec.AuthorizationSource{{Type: sec.SourceSPIFFE, SPIFFE: "spiffe://td/a/../b"}}}}
		return p
	}
	exists := func(k model.ServiceKey) bool { return k.Name == "web" }
	for _, tc := range []struct {
		name           string
		p              *sec.AuthorizationPolicy
		status, reason string
		message        string
		targets        []sec.PolicyTargetReferenceWithLabelSelectors
	}{
		{"accepted", policy(sec.ActionAllow, svc, pods), "True", sec.ReasonAccepted, "applies to its targets", []sec.PolicyTargetReferenceWithLabelSelectors{svc, pods}},
		{"some missing", policy(sec.ActionAllow, gone, svc), "True", sec.ReasonAccepted, `applies to the targets found; Service "gone" not found in namespace shop`,
			[]sec.PolicyTargetReferenceWithLabelSelectors{svc}},
		{"none found", policy(sec.ActionAllow, gone), "False", sec.ReasonTargetNotFound, `no target found: Service "gone" not found in namespace shop`, nil},
		{"invalid allow", badRule(policy(sec.ActionAllow, svc)), "False", sec.ReasonInvalid,
			`invalid: it fails closed as an ALLOW policy that allows nothing: its targets accept only what their other ALLOW policies allow until it is fixed: spec.rules[0].sources[0].spiffe "spiffe://td/a/../b": path segment ".."`, []sec.PolicyTargetReferenceWithLabelSelectors{svc}},
		{"invalid deny fails closed", badRule(policy(sec.ActionDeny, svc, gone)), "False", sec.ReasonInvalid,
			`invalid: as a DENY policy it fails closed: every caller of its targets is refused until it is fixed: spec.rules[0]`,
			[]sec.PolicyTargetReferenceWithLabelSelectors{svc}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := model.ResolveAuthz([]*sec.AuthorizationPolicy{tc.p}, exists)[0]
			st, changed := Status(tc.p, r, t0)
			if !changed {
				t.Error("a status never written is not changed")
			}
			if len(st.Conditions) != 1 {
				t.Fatalf("conditions = %+v", st.Conditions)
			}
			c := st.Conditions[0]
			if c.Type != "Accepted" || string(c.Status) != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.message) ||
				c.ObservedGeneration != 2 || !c.LastTransitionTime.Equal(&t0) {
				t.Errorf("condition = %+v, want %s %s %q at generation 2", c, tc.status, tc.reason, tc.message)
			}
			if fmt.Sprint(st.Targets) != fmt.Sprint(tc.targets) {
				t.Errorf("targets = %v, want %v", st.Targets, tc.targets)
			}
			// Written, the same pass later changes nothing and keeps the transition time.
			tc.p.Status = st
			again, changed := Status(tc.p, r, t1)
			if changed || !again.Conditions[0].LastTransitionTime.Equal(&t0) {
				t.Errorf("second pass: changed %v, condition %+v", changed, again.Conditions[0])
			}
			// A new generation changes observedGeneration only.
			tc.p.Generation, r.Generation = 3, 3
			next, changed := Status(tc.p, r, t1)
			if !changed || next.Conditions[0].ObservedGeneration != 3 || !next.Conditions[0].LastTransitionTime.Equal(&t0) {
				t.Errorf("new generation: changed %v, condition %+v", changed, next.Conditions[0])
			}
		})
	}
}

// TestControllerRealAPIServer runs the controller in a manager against a real kube-apiserver
// whose AuthorizationPolicy CRD is installed only after the start: the policies get their
// Accepted condition and targets, a Service created later turns TargetNotFound into Accepted in
// the pass its event brings, and that pass writes nothing to a policy whose status holds.
func TestControllerRealAPIServer(t *testing.T) {
	ctx, cl, c := startController(t, "security.aether.io_authorizationpolicies.yaml")
	create := func(o client.Object) {
		t.Helper()
		if err := cl.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}, Selector: map[string]string{"app": "web"}}})

	policy := func(name string, action sec.AuthorizationPolicyAction, spiffe string, refs ...sec.PolicyTargetReferenceWithLabelSelectors) *sec.AuthorizationPolicy {
		return &sec.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
			Spec: sec.AuthorizationPolicySpec{Action: action, TargetRefs: refs, Rules: []sec.AuthorizationRule{
				{Sources: []sec.AuthorizationSource{{Type: sec.SourceSPIFFE, SPIFFE: spiffe}}}}}}
	}
	web := sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Service", Name: "web"}
	later := sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Service", Name: "later"}
	// Discovery may list the new group a moment after the CRD is Established.
	testenv.Eventually(t, 30*time.Second, "the first policy created", func() error {
		return cl.Create(ctx, policy("ok", sec.ActionAllow, "spiffe://td/ns/a/sa/b", web))
	})
	// The CRD lets "spiffe://td/a/../b" through (it checks the scheme only); the conversion does not.
	create(policy("missing", sec.ActionAllow, "spiffe://td/*", later))
	create(policy("bad-deny", sec.ActionDeny, "spiffe://td/a/../b", web))
	create(policy("bad-allow", sec.ActionAllow, "spiffe://td/a/../b", web))

	type want struct{ status, reason, targets string }
	wait := func(name string, w want) *sec.AuthorizationPolicy {
		t.Helper()
		var p sec.AuthorizationPolicy
		testenv.Eventually(t, 60*time.Second, "status of "+name, func() error {
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "shop", Name: name}, &p); err != nil {
				return err
			}
			var targets []string
			for _, t := range p.Status.Targets {
				targets = append(targets, t.Kind+"/"+t.Name)
			}
			c := findAccepted(p.Status.Conditions)
			if c == nil || string(c.Status) != w.status || c.Reason != w.reason || strings.Join(targets, ",") != w.targets || c.ObservedGeneration != p.Generation {
				return fmt.Errorf("status = %+v", p.Status)
			}
			return nil
		})
		return &p
	}
	ok := wait("ok", want{"True", sec.ReasonAccepted, "Service/web"})
	wait("missing", want{"False", sec.ReasonTargetNotFound, ""})
	if c := findAccepted(wait("bad-deny", want{"False", sec.ReasonInvalid, "Service/web"}).Status.Conditions); !strings.Contains(c.Message, "fails closed") ||
		!strings.Contains(c.Message, `spec.rules[0].sources[0].spiffe "spiffe://td/a/../b"`) {
		t.Errorf("bad-deny message = %q", c.Message)
	}
	if c := findAccepted(wait("bad-allow", want{"False", sec.ReasonInvalid, "Service/web"}).Status.Conditions); !strings.Contains(c.Message, "allows nothing") {
		t.Errorf("bad-allow message = %q", c.Message)
	}
	for _, f := range ok.ManagedFields {
		if f.Subresource == "status" && f.Manager != FieldManager {
			t.Errorf("status field manager %q, want %q", f.Manager, FieldManager)
		}
	}

	before := c.writes.Load()
	create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "later"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}})
	wait("missing", want{"True", sec.ReasonAccepted, "Service/later"})
	if n := c.writes.Load() - before; n != 1 {
		t.Errorf("%d status writes after the Service was created, want 1 (policy missing's; the others hold)", n)
	}
	var again sec.AuthorizationPolicy
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "ok"}, &again); err != nil {
		t.Fatal(err)
	}
	if again.ResourceVersion != ok.ResourceVersion {
		t.Errorf("policy ok written again (resourceVersion %s -> %s) by a pass that found the same status", ok.ResourceVersion, again.ResourceVersion)
	}
}

func findAccepted(conds []metav1.Condition) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == sec.ConditionAccepted {
			return &conds[i]
		}
	}
	return nil
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// startController starts the controller in a manager against a real kube-apiserver, then
// installs the CRDs named (files of deploy/crds), so that the controller meets them after its
// start. It returns a context that ends with the test, a client and the controller.
func startController(t *testing.T, crds ...string) (context.Context, client.Client, *Controller) {
	t.Helper()
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), sec.AddToScheme(scheme)); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	mgr, err := ctrl.NewManager(api.Config, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	c := &Controller{Client: mgr.GetClient(), Dynamic: dynamic.NewForConfigOrDie(api.Config),
		Discovery: discovery.NewDiscoveryClientForConfigOrDie(api.Config), Log: log, CRDRecheck: 200 * time.Millisecond, SkipNameValidation: true}
	if err := c.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	cl, err := client.New(api.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	testenv.InstallCRDs(t, api.Config, testenv.CRDSubset(t, crds...))
	return ctx, cl, c
}
