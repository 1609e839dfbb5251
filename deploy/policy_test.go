package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

const (
	agentPolicy     = "aether-agent-node-pods"
	registrarPolicy = "aether-registrar-managed-objects"
)

// installForReal creates every object of files (namespaces and RBAC, policies) on the API server.
func installForReal(t *testing.T, cl client.Client, files ...string) {
	t.Helper()
	for _, f := range files {
		objs, err := Objects(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if err := cl.Create(context.Background(), o); err != nil {
				t.Fatalf("%s: create %s %s: %v", f, o.GetKind(), o.GetName(), err)
			}
		}
	}
}

// tokenConfig returns a client configuration that authenticates with a token of ServiceAccount
// aether-system/sa from the TokenRequest API: bound to pod (as the kubelet mints it for a pod's
// projected token volume) or, with pod nil, bound to nothing.
func tokenConfig(t *testing.T, api *testenv.KubeAPIServer, cs kubernetes.Interface, sa string, pod *corev1.Pod) *rest.Config {
	t.Helper()
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := cs.CoreV1().ServiceAccounts("aether-system").CreateToken(context.Background(), sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", sa, err)
	}
	return &rest.Config{Host: api.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: api.Config.CAData}, BearerToken: tr.Status.Token}
}

// wantDenied fails unless err is a Forbidden naming the policy and containing every part of want.
func wantDenied(t *testing.T, what string, err error, policy string, want ...string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: %v, want Forbidden by ValidatingAdmissionPolicy %s", what, err, policy)
		return
	}
	for _, w := range append([]string{"ValidatingAdmissionPolicy '" + policy + "'"}, want...) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v, want it to say %q", what, err, w)
		}
	}
}

// TestAdmissionPolicies installs deploy/'s namespace, RBAC and admission policies on a real
// kube-apiserver and acts as the agent and the registrar with tokens of their ServiceAccounts
// from the TokenRequest API. The agent's token is bound to its pod on node-1, as the kubelet
// mints it, so it carries the node-name claim: it may delete a pod on node-1 (with a UID
// precondition, as cni.KubePods.DeletePod does), and is refused, with the policy's message, for a pod
// on node-2, for an unscheduled pod, and for any pod with a token that names no node; evictions
// are not in its RBAC, and must not be: once granted, an eviction of a pod on node-2 passes (the
// policy cannot see an eviction's pod). The registrar may create, update and delete Services and ServiceImports
// labelled aether.io/managed-by=aether and is refused, naming the rule, for unlabelled ones
// (create, update, delete, status) and for removing the label; likewise for Deployments and
// ServiceAccounts (the edge Gateways'), and for Secrets, which it may write only in its own
// namespace (RBAC) and read anywhere (certificateRefs); an admin is not affected. The agent may read
// Secrets in the release namespace only (the certificate copies), and write none.
func TestAdmissionPolicies(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, mcsv1beta1.Install} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	admin, err := client.New(api.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	installForReal(t, admin, "namespace.yaml", "agent/rbac.yaml", "agent/policy.yaml", "registrar/rbac.yaml", "registrar/policy.yaml")
	cs := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, n := range []string{"node-1", "node-2"} {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller manager here: the namespace's default ServiceAccount is created by hand.
	if _, err := cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(ns, name, sa, node string) *corev1.Pod {
		t.Helper()
		p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, AutomountServiceAccountToken: new(false),
				Containers: []corev1.Container{{Name: "c", Image: "app"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("agent", func(t *testing.T) {
		agentPod := pod("aether-system", "aether-agent-node1", "aether-agent", "node-1")
		asAgent := kubernetes.NewForConfigOrDie(tokenConfig(t, api, cs, "aether-agent", agentPod))
		unbound := kubernetes.NewForConfigOrDie(tokenConfig(t, api, cs, "aether-agent", nil))
		// The claim the policy reads, as the API server sees the agent's token.
		ssr, err := asAgent.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ssr.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "node-1" {
			t.Fatalf("the agent's pod-bound token: user extra node-name %v, want [node-1] (user %+v)", got, ssr.Status.UserInfo)
		}
		local, local2 := pod("shop", "web-node1", "default", "node-1"), pod("shop", "api-node1", "default", "node-1")
		remote, pending := pod("shop", "web-node2", "default", "node-2"), pod("shop", "pending", "default", "")

		// A policy takes effect once the API server has loaded it: wait with dry runs.
		testenv.Eventually(t, 30*time.Second, "the agent's pod policy in force", func() error {
			err := asAgent.CoreV1().Pods("shop").Delete(ctx, remote.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
			if apierrors.IsForbidden(err) {
				return nil
			}
			return fmt.Errorf("not refused yet (%v)", err)
		})
		err = asAgent.CoreV1().Pods("shop").Delete(ctx, remote.Name, metav1.DeleteOptions{})
		wantDenied(t, "the agent on node-1 deletes a pod on node-2", err, agentPolicy,
			"aether-agent on node node-1 may delete only pods bound to that node", "shop/web-node2 is on node node-2")
		err = asAgent.CoreV1().Pods("shop").Delete(ctx, pending.Name, metav1.DeleteOptions{})
		wantDenied(t, "the agent deletes an unscheduled pod", err, agentPolicy, "shop/pending is not scheduled")
		err = unbound.CoreV1().Pods("shop").Delete(ctx, local2.Name, metav1.DeleteOptions{})
		wantDenied(t, "the agent's ServiceAccount with a token bound to no pod", err, agentPolicy,
			"authentication.kubernetes.io/node-name", "this request names none")
		for _, p := range []*corev1.Pod{remote, pending, local2} {
			if got, err := cs.CoreV1().Pods("shop").Get(ctx, p.Name, metav1.GetOptions{}); err != nil || got.DeletionTimestamp != nil {
				t.Errorf("pod shop/%s removed after a refused delete (%v)", p.Name, err)
			}
		}

		// The delete the agent makes on its own node (cni.KubePods.DeletePod: a UID precondition;
		// deploy sits below cni, so the request is spelled out here, and TestKubePods checks that
		// DeletePod sends exactly this).
		uid := local.UID
		if err := asAgent.CoreV1().Pods("shop").Delete(ctx, local.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil {
			t.Fatalf("the agent on node-1 removes pod shop/%s on node-1: %v", local.Name, err)
		}
		if got, err := cs.CoreV1().Pods("shop").Get(ctx, local.Name, metav1.GetOptions{}); err == nil && got.DeletionTimestamp == nil {
			t.Errorf("pod shop/%s still running after the agent's delete", local.Name)
		}

		// Evictions cannot be limited to a node (docs/deploy.md): RBAC grants none.
		err = asAgent.CoreV1().Pods("shop").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: local2.Name}})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "pods/eviction") {
			t.Errorf("the agent evicts a pod: %v, want Forbidden by RBAC (pods/eviction)", err)
		}
		// Why evictions are not granted: the policy cannot see an eviction's pod, and the delete an
		// eviction performs is not admitted again. With pods/eviction granted for a moment, the
		// agent on node-1 evicts the pod on node-2 it may not delete.
		grant := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-agent-evictions"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}}}}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-agent-evictions"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: grant.Name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "aether-system", Name: "aether-agent"}}}
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, grant, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the agent evicts a pod on node-2 once RBAC allows it", func() error {
			return asAgent.CoreV1().Pods("shop").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: remote.Name}})
		})
		if err := cs.RbacV1().ClusterRoleBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if got, err := cs.CoreV1().Pods("shop").Get(ctx, remote.Name, metav1.GetOptions{}); err == nil && got.DeletionTimestamp == nil {
			t.Errorf("pod shop/%s still running after its eviction", remote.Name)
		}

		// The policy binds the agent's ServiceAccount only.
		if err := cs.CoreV1().Pods("shop").Delete(ctx, pending.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("an admin deletes an unscheduled pod: %v", err)
		}
	})

	t.Run("registrar", func(t *testing.T) {
		reg, err := client.New(tokenConfig(t, api, cs, "aether-registrar", nil), client.Options{Scheme: scheme})
		if err != nil {
			t.Fatal(err)
		}
		managed := map[string]string{model.LabelManagedBy: model.ManagedByAether}
		svc := func(name string, labels map[string]string) *corev1.Service {
			return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: labels},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		}
		testenv.Eventually(t, 30*time.Second, "the registrar's policy in force", func() error {
			err := reg.Create(ctx, svc("probe", nil), client.DryRunAll)
			if apierrors.IsForbidden(err) {
				return nil
			}
			return fmt.Errorf("not refused yet (%v)", err)
		})

		// Services: create, update and delete of aether's own pass.
		ours := svc("web-clusterset", managed)
		if err := reg.Create(ctx, ours); err != nil {
			t.Fatalf("the registrar creates a managed Service: %v", err)
		}
		ours.Annotations = map[string]string{model.AnnotationMeshService: "shop/web"}
		if err := reg.Update(ctx, ours); err != nil {
			t.Fatalf("the registrar updates a managed Service: %v", err)
		}
		drop := ours.DeepCopy()
		drop.Labels = nil
		wantDenied(t, "the registrar removes the label from its Service", reg.Update(ctx, drop), registrarPolicy,
			"may not remove the label aether.io/managed-by=aether from Service shop/web-clusterset")
		wantDenied(t, "the registrar creates an unlabelled Service", reg.Create(ctx, svc("db", nil)), registrarPolicy,
			"may create only objects labelled aether.io/managed-by=aether; Service shop/db is not")
		wantDenied(t, "the registrar creates a Service labelled by someone else",
			reg.Create(ctx, svc("db", map[string]string{model.LabelManagedBy: "helm"})), registrarPolicy, "Service shop/db is not")

		// A user's Service: the registrar may neither adopt (label), change nor delete it.
		theirs := svc("api", nil)
		if err := admin.Create(ctx, theirs); err != nil {
			t.Fatalf("an admin creates an unlabelled Service: %v", err)
		}
		adopt := theirs.DeepCopy()
		adopt.Labels = managed
		wantDenied(t, "the registrar labels a user's Service", reg.Update(ctx, adopt), registrarPolicy,
			"may update and delete only objects labelled aether.io/managed-by=aether; Service shop/api is not")
		change := theirs.DeepCopy()
		change.Spec.Ports[0].Port = 81
		wantDenied(t, "the registrar changes a user's Service", reg.Update(ctx, change), registrarPolicy, "Service shop/api is not")
		wantDenied(t, "the registrar deletes a user's Service", reg.Delete(ctx, theirs), registrarPolicy,
			"may update and delete only objects labelled aether.io/managed-by=aether; Service shop/api is not")
		if err := reg.Delete(ctx, ours); err != nil {
			t.Errorf("the registrar deletes its managed Service: %v", err)
		}

		// ServiceImports, the status subresource included.
		si := func(name string, labels map[string]string) *mcsv1beta1.ServiceImport {
			return &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: labels},
				Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, Ports: []mcsv1beta1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
		}
		if err := reg.Create(ctx, si("web", managed)); err != nil {
			t.Errorf("the registrar creates a managed ServiceImport: %v", err)
		}
		wantDenied(t, "the registrar creates an unlabelled ServiceImport", reg.Create(ctx, si("db", nil)), registrarPolicy,
			"ServiceImport shop/db is not")
		userSI := si("api", nil)
		if err := admin.Create(ctx, userSI); err != nil {
			t.Fatalf("an admin creates an unlabelled ServiceImport: %v", err)
		}
		userSI.Status.Clusters = []mcsv1beta1.ClusterStatus{{Cluster: "east"}}
		wantDenied(t, "the registrar writes a user's ServiceImport status", reg.Status().Update(ctx, userSI), registrarPolicy,
			"ServiceImport shop/api is not")

		// The edge Gateways' Deployments and ServiceAccounts (registrar/gateway), in any namespace.
		dep := func(name string, labels map[string]string) *appsv1.Deployment {
			sel := map[string]string{"app": name}
			return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: labels},
				Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "envoy", Image: "envoy"}}}}}}
		}
		edgeDep := dep("web-aether-edge", managed)
		if err := reg.Create(ctx, edgeDep); err != nil {
			t.Errorf("the registrar creates a managed Deployment: %v", err)
		}
		if err := reg.Delete(ctx, edgeDep); err != nil {
			t.Errorf("the registrar deletes its managed Deployment: %v", err)
		}
		wantDenied(t, "the registrar creates an unlabelled Deployment", reg.Create(ctx, dep("db", nil)), registrarPolicy,
			"may create only objects labelled aether.io/managed-by=aether; Deployment shop/db is not")
		userDep := dep("api", nil)
		if err := admin.Create(ctx, userDep); err != nil {
			t.Fatal(err)
		}
		wantDenied(t, "the registrar deletes a user's Deployment", reg.Delete(ctx, userDep), registrarPolicy, "Deployment shop/api is not")
		if err := reg.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-aether-edge", Labels: managed}}); err != nil {
			t.Errorf("the registrar creates a managed ServiceAccount: %v", err)
		}
		wantDenied(t, "the registrar deletes a user's ServiceAccount", reg.Delete(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "default"}}),
			registrarPolicy, "ServiceAccount shop/default is not")

		// Secrets: the certificate copies, in its own namespace only (RBAC), labelled (the policy).
		secret := func(ns, name string, labels map[string]string) *corev1.Secret {
			return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Type: corev1.SecretTypeTLS,
				Data: map[string][]byte{corev1.TLSCertKey: []byte("c"), corev1.TLSPrivateKeyKey: []byte("k")}}
		}
		copied := secret("aether-system", "edge-cert-0123456789abcdef", managed)
		if err := reg.Create(ctx, copied); err != nil {
			t.Errorf("the registrar creates a managed Secret in its namespace: %v", err)
		}
		if err := reg.Delete(ctx, copied); err != nil {
			t.Errorf("the registrar deletes its managed Secret: %v", err)
		}
		wantDenied(t, "the registrar creates an unlabelled Secret in its namespace", reg.Create(ctx, secret("aether-system", "loose", nil)), registrarPolicy,
			"Secret aether-system/loose is not")
		if err := reg.Create(ctx, secret("shop", "edge-cert-0123456789abcdef", managed)); !apierrors.IsForbidden(err) || strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			t.Errorf("the registrar creates a Secret in another namespace: %v, want Forbidden by RBAC", err)
		}
		userSecret := secret("shop", "www", nil)
		if err := admin.Create(ctx, userSecret); err != nil {
			t.Fatal(err)
		}
		var read corev1.Secret
		if err := reg.Get(ctx, client.ObjectKeyFromObject(userSecret), &read); err != nil {
			t.Errorf("the registrar reads a certificate Secret in another namespace: %v", err)
		}

		// The policy binds the registrar's ServiceAccount only.
		if err := admin.Create(ctx, svc("db", nil)); err != nil {
			t.Errorf("an admin creates an unlabelled Service: %v", err)
		}
	})

	t.Run("agent secrets", func(t *testing.T) {
		agent := kubernetes.NewForConfigOrDie(tokenConfig(t, api, cs, "aether-agent", nil))
		if _, err := agent.CoreV1().Secrets("aether-system").List(ctx, metav1.ListOptions{LabelSelector: model.LabelEdgeCertificate + "=true"}); err != nil {
			t.Errorf("the agent lists the certificate copies in the release namespace: %v", err)
		}
		if _, err := agent.CoreV1().Secrets("shop").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the agent lists Secrets in another namespace: %v, want Forbidden", err)
		}
		if _, err := agent.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the agent lists Secrets cluster-wide: %v, want Forbidden", err)
		}
		if _, err := agent.CoreV1().Secrets("aether-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the agent creates a Secret: %v, want Forbidden", err)
		}
	})
}
