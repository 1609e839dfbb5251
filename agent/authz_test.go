package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
	"github.com/aethermesh/aether/internal/policysource"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestAuthzPoliciesFollowCRD runs the agent's AuthorizationPolicy source against a real
// kube-apiserver without the CRD at first: the model's sources have no policy, the CRD installed
// later is watched, a policy created, changed and deleted reaches the sources (reporting each
// change), and the model assembled from them selects the pod: an omitted sources list stays "any
// caller" and an empty one "no caller" through the API server and the typed conversion.
func TestAuthzPoliciesFollowCRD(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	cs := kubernetes.NewForConfigOrDie(api.Config)
	dyn := dynamic.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	var changes atomic.Int32
	src := &policysource.AuthorizationPolicies{Resource: sec.Resource, Dynamic: dyn, Discovery: cs.Discovery(), Log: slog.New(slog.DiscardHandler),
		OnChange: func() { changes.Add(1) }, Recheck: 200 * time.Millisecond}
	if err := src.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	fill := func() model.Sources {
		var s model.Sources
		if err := (authzPolicies{src}).Fill(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if !src.Known() {
		t.Error("a missing CRD is not Known after Start")
	}
	if s := fill(); s.AuthorizationPolicies != nil {
		t.Fatalf("policies without the CRD: %v", s.AuthorizationPolicies)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	testenv.InstallCRDs(t, api.Config, testenv.CRDSubset(t, "security.aether.io_authorizationpolicies.yaml"))
	p := &sec.AuthorizationPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: sec.GroupVersion.String(), Kind: "AuthorizationPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-allow"},
		Spec: sec.AuthorizationPolicySpec{
			Action:     sec.ActionAllow,
			TargetRefs: []sec.PolicyTargetReferenceWithLabelSelectors{{Kind: "Pod", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
			Rules: []sec.AuthorizationRule{
				{Sources: []sec.AuthorizationSource{}},
				{NetworkAttributes: &sec.AuthorizationNetworkAttributes{Ports: []int32{5432}}},
			},
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	res := dyn.Resource(sec.Resource).Namespace("shop")
	if _, err := res.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the policy in the model's sources", func() error {
		if s := fill(); len(s.AuthorizationPolicies) != 1 || s.AuthorizationPolicies[0].Name != "db-allow" {
			return fmt.Errorf("policies = %v", s.AuthorizationPolicies)
		}
		return nil
	})
	got := fill().AuthorizationPolicies[0]
	if got.Spec.TargetRefs[0].Group != "" || got.Spec.Rules[0].Sources == nil || len(got.Spec.Rules[0].Sources) != 0 || got.Spec.Rules[1].Sources != nil {
		t.Errorf("typed policy = %+v: want group defaulted to \"\", rule 0 sources [] (none), rule 1 sources omitted (any)", got.Spec)
	}

	// The model assembled from these sources applies it to the pod app=db.
	in := fill()
	in.Cluster, in.MeshNamespaces = "a", map[string]bool{"shop": true}
	in.Pods = []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-0", UID: "u1", Labels: map[string]string{"app": "db"}}}}
	in.Attachments = map[string]cniv1.PodAttachment{"u1": {PodUID: "u1", NetnsPath: "/var/run/netns/u1", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5")}}}
	m := model.Assemble(1, in)
	if ps := m.Authz["u1"]; len(ps) != 1 || ps[0].Name != "db-allow" || !ps[0].Rules[1].AnySource || ps[0].Rules[0].AnySource || len(ps[0].Rules[0].Sources) != 0 {
		t.Errorf("Mesh.Authz[u1] = %+v", ps)
	}

	before := changes.Load()
	u, err := res.Get(ctx, "db-allow", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, "DENY", "spec", "action"); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the changed policy in the model's sources", func() error {
		if s := fill(); len(s.AuthorizationPolicies) != 1 || s.AuthorizationPolicies[0].Spec.Action != sec.ActionDeny {
			return fmt.Errorf("policies = %v", s.AuthorizationPolicies)
		}
		if changes.Load() == before {
			return fmt.Errorf("no change reported")
		}
		return nil
	})
	if err := res.Delete(ctx, "db-allow", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the deleted policy gone", func() error {
		if s := fill(); len(s.AuthorizationPolicies) != 0 {
			return fmt.Errorf("policies = %v", s.AuthorizationPolicies)
		}
		return nil
	})
}

// TestPeerAuthnsFollowCRD runs the agent's PeerAuthentication source against a real
// kube-apiserver without the CRD at first: the model's sources have no policy, the CRD installed
// later is watched, and a policy created (Istio-shaped: numeric portLevelMtls keys), changed and
// deleted reaches the sources converted; the model assembled from them gives the namespace's pod
// its mode and strict port, and a pod of another namespace the mesh default.
func TestPeerAuthnsFollowCRD(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	cs := kubernetes.NewForConfigOrDie(api.Config)
	dyn := dynamic.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	src := &policysource.PeerAuthentications{Resource: sec.PeerAuthenticationResource, Dynamic: dyn, Discovery: cs.Discovery(),
		Log: slog.New(slog.DiscardHandler), Recheck: 200 * time.Millisecond}
	if err := src.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	fill := func() model.Sources {
		var s model.Sources
		if err := (peerAuthns{src}).Fill(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := fill(); s.PeerAuthns != nil || !src.Known() {
		t.Fatalf("without the CRD: policies %v, known %v", s.PeerAuthns, src.Known())
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "legacy"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.InstallCRDs(t, api.Config, testenv.CRDSubset(t, "security.aether.io_peerauthentications.yaml"))
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": sec.GroupVersion.String(), "kind": "PeerAuthentication",
		"metadata": map[string]any{"namespace": "legacy", "name": "migrate"},
		"spec": map[string]any{"mtls": map[string]any{"mode": "PERMISSIVE"},
			"portLevelMtls": map[string]any{"9090": map[string]any{"mode": "STRICT"}}},
	}}
	res := dyn.Resource(sec.PeerAuthenticationResource).Namespace("legacy")
	testenv.Eventually(t, 30*time.Second, "the policy created", func() error {
		_, err := res.Create(ctx, u, metav1.CreateOptions{})
		return err
	})
	testenv.Eventually(t, 30*time.Second, "the policy in the model's sources", func() error {
		if s := fill(); len(s.PeerAuthns) != 1 || s.PeerAuthns[0].Mode != model.MTLSPermissive || s.PeerAuthns[0].PortModes[9090] != model.MTLSStrict {
			return fmt.Errorf("policies = %+v", s.PeerAuthns)
		}
		return nil
	})

	in := fill()
	in.Cluster, in.MeshNamespaces, in.InboundDefault = "a", map[string]bool{"legacy": true, "shop": true}, model.MTLSStrict
	in.Pods = []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "legacy", Name: "old-0", UID: "u1"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0", UID: "u2"}},
	}
	in.Attachments = map[string]cniv1.PodAttachment{
		"u1": {PodUID: "u1", NetnsPath: "/var/run/netns/u1", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5")}},
		"u2": {PodUID: "u2", NetnsPath: "/var/run/netns/u2", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.6")}},
	}
	m := model.Assemble(1, in)
	// shop's pod keeps the mesh default: no entry.
	if _, ok := m.Inbound["u2"]; ok || fmt.Sprintf("%+v", m.Inbound["u1"]) != fmt.Sprintf("%+v",
		model.PodInbound{Mode: model.MTLSPermissive, StrictPorts: []uint32{9090}, Policy: "legacy/migrate"}) {
		t.Errorf("Mesh.Inbound = %+v", m.Inbound)
	}

	cur, err := res.Get(ctx, "migrate", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(cur.Object, "STRICT", "spec", "mtls", "mode"); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the changed policy in the model's sources", func() error {
		if s := fill(); len(s.PeerAuthns) != 1 || s.PeerAuthns[0].Mode != model.MTLSStrict {
			return fmt.Errorf("policies = %+v", s.PeerAuthns)
		}
		return nil
	})
	if err := res.Delete(ctx, "migrate", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the deleted policy gone", func() error {
		if s := fill(); len(s.PeerAuthns) != 0 {
			return fmt.Errorf("policies = %+v", s.PeerAuthns)
		}
		return nil
	})
}
