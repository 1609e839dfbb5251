//go:build linux

package spire

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
)

var (
	clusterSPIFFEIDs     = schema.GroupVersionResource{Group: "spire.spiffe.io", Version: "v1alpha1", Resource: "clusterspiffeids"}
	clusterStaticEntries = schema.GroupVersionResource{Group: "spire.spiffe.io", Version: "v1alpha1", Resource: "clusterstaticentries"}
)

// delegateID is the SPIFFE ID the test process gets (it plays the aether agent: the SPIRE agent's
// authorized delegate).
const delegateID = "spiffe://aether.internal/ns/aether/sa/aether-agent"

// TestPrivilegedSPIRE gets pods' SVIDs from a real SPIRE agent through its Delegated Identity
// API, on a real spire-server with k8s_psat node attestation against a real kube-apiserver and
// the SPIRE Controller Manager registering the pods a ClusterSPIFFEID selects (aether writes no
// entry): a meshed pod of the node gets the SVID of its service account, which verifies against
// the bundle the same API serves, and a new one before it expires (rotation); a pod of another
// node, and a pod no ClusterSPIFFEID selects, get none; a caller that is not an authorized
// delegate is refused; a pod taken out of the ClusterSPIFFEID's selector keeps its last SVID,
// not renewed, until it expires.
func TestPrivilegedSPIRE(t *testing.T) {
	testenv.RequireRoot(t)
	kube := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	srv := testenv.StartSPIREServer(t, kube, testenv.SPIREOptions{})
	agentA := srv.StartAgent(t, "node-a", delegateID)
	agentB := srv.StartAgent(t, "node-b", delegateID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs, err := kubernetes.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}

	// The delegate's own entry, on node-a's agent (a ClusterStaticEntry: the Controller Manager
	// writes it); the pods' from a ClusterSPIFFEID selecting aether.io/mesh=true.
	create := func(gvr schema.GroupVersionResource, obj map[string]any) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, "create "+gvr.Resource, func() error {
			_, err := dyn.Resource(gvr).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
			return err
		})
	}
	create(clusterStaticEntries, map[string]any{
		"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterStaticEntry", "metadata": map[string]any{"name": "aether-agent-node-a"},
		"spec": map[string]any{"spiffeID": delegateID, "parentID": agentA.ID, "selectors": []any{"unix:uid:0"}},
	})
	create(clusterSPIFFEIDs, map[string]any{
		"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID", "metadata": map[string]any{"name": "mesh"},
		"spec": map[string]any{
			"spiffeIDTemplate": "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}",
			"podSelector":      map[string]any{"matchLabels": map[string]any{"aether.io/mesh": "true"}},
			"ttl":              svidTTL.String(),
		},
	})
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, node, sa string, meshed bool) *corev1.Pod {
		t.Helper()
		labels := map[string]string{}
		if meshed {
			labels["aether.io/mesh"] = "true"
		}
		if _, err := cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	web := pod("web", "node-a", "web", true)
	db := pod("db", "node-b", "db", true)           // another node's pod
	plain := pod("plain", "node-a", "plain", false) // not selected

	d, err := New(Config{AdminSocket: agentA.Admin, RetryMin: 100 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(ctx)
	// Edge pods as the chart registers them (ClusterSPIFFEID aether-edge): selected by labels any
	// pod may set, so the entry also requires the ServiceAccount the label names.
	create(clusterSPIFFEIDs, map[string]any{
		"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID", "metadata": map[string]any{"name": "edge"},
		"spec": map[string]any{
			"spiffeIDTemplate":          "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}",
			"podSelector":               map[string]any{"matchExpressions": []any{map[string]any{"key": "gw", "operator": "Exists"}}},
			"workloadSelectorTemplates": []any{`k8s:sa:{{ index .PodMeta.Labels "gw" }}-aether-edge`},
		},
	})
	edgePod := func(name, sa string) *corev1.Pod {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"gw": "front"}},
			Spec:       corev1.PodSpec{NodeName: "node-a", ServiceAccountName: sa, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	edge := edgePod("front-edge", "front-aether-edge")
	intruder := edgePod("intruder", "intruder") // the edge's labels, another ServiceAccount
	wl := func(p *corev1.Pod) identity.Workload {
		return identity.Workload{UID: string(p.UID), SPIFFEID: "spiffe://aether.internal/ns/" + p.Namespace + "/sa/" + p.Spec.ServiceAccountName}
	}
	d.SetPods("test", []identity.Workload{wl(web), wl(db), wl(plain), wl(edge), wl(intruder)})
	wantWeb := "spiffe://aether.internal/ns/shop/sa/web"
	var svid *identity.SVID
	took := testenv.Eventually(t, 90*time.Second, "web's SVID from SPIRE", func() error {
		st, _ := d.Pod(string(web.UID))
		if len(st.SVIDs) != 1 || st.SVIDs[0].SPIFFEID != wantWeb {
			return fmt.Errorf("%d SVIDs (%v), err %v", len(st.SVIDs), ids(st.SVIDs), st.Err)
		}
		svid = st.SVIDs[0]
		return nil
	})
	t.Logf("web's SVID %s after %s", svid.SPIFFEID, took)
	// The bundle stream opened before the delegate's entry existed, was refused, and is retried.
	var bundle []byte
	testenv.Eventually(t, 30*time.Second, "the trust bundle", func() error {
		bundles, err := d.Bundles()
		if bundle = bundles["aether.internal"]; len(bundle) == 0 {
			return fmt.Errorf("bundles %v, %v; want the trust domain's", bundles, err)
		}
		return nil
	})
	verify(t, svid, bundle)
	testenv.Eventually(t, 90*time.Second, "the edge pod's SVID (its ServiceAccount the one the entry requires)", func() error {
		st, _ := d.Pod(string(edge.UID))
		if len(st.SVIDs) != 1 || st.SVIDs[0].SPIFFEID != wl(edge).SPIFFEID {
			return fmt.Errorf("%d SVIDs (%v), err %v", len(st.SVIDs), ids(st.SVIDs), st.Err)
		}
		return nil
	})
	for _, p := range []*corev1.Pod{db, plain, intruder} {
		if st, _ := d.Pod(string(p.UID)); len(st.SVIDs) != 0 {
			t.Errorf("pod %s got %v through node-a's agent, want none", p.Name, ids(st.SVIDs))
		}
	}

	// On node-b the test process has no entry (its ClusterStaticEntry is node-a's), so it is no
	// authorized delegate there, whatever the agent's list says: refused, nothing served.
	refused, err := New(Config{AdminSocket: agentB.Admin, RetryMin: 100 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	refused.Start(ctx)
	refused.SetPods("test", []identity.Workload{wl(db)})
	testenv.Eventually(t, 30*time.Second, "node-b's agent refusing the caller", func() error {
		st, _ := refused.Pod(string(db.UID))
		if len(st.SVIDs) != 0 || status.Code(st.Err) != codes.PermissionDenied {
			return fmt.Errorf("%v, err %v; want none, PermissionDenied", ids(st.SVIDs), st.Err)
		}
		return nil
	})

	// SPIRE rotates web's SVID before it expires (the entry's TTL is svidTTL): a new one arrives
	// on the same subscription.
	testenv.Eventually(t, 2*svidTTL, "web's SVID rotated", func() error {
		st, _ := d.Pod(string(web.UID))
		if len(st.SVIDs) != 1 || string(st.SVIDs[0].CertChainPEM) == string(svid.CertChainPEM) {
			return fmt.Errorf("%d SVIDs, the first one still", len(st.SVIDs))
		}
		verify(t, st.SVIDs[0], bundle)
		svid = st.SVIDs[0]
		return nil
	})

	// web leaves the ClusterSPIFFEID's selector: its entry goes, the agent sends no SVID; the
	// last one is kept, not renewed, until it expires.
	patch := []byte(`{"metadata":{"labels":{"aether.io/mesh":null}}}`)
	if _, err := cs.CoreV1().Pods("shop").Patch(ctx, "web", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "web's SVID withdrawn", func() error {
		st, _ := d.Pod(string(web.UID))
		if !st.Withdrawn {
			return fmt.Errorf("not withdrawn: %v", ids(st.SVIDs))
		}
		if len(st.SVIDs) == 1 && st.SVIDs[0].NotAfter.Equal(svid.NotAfter) {
			return nil // the last one, kept until its expiry
		}
		if time.Now().Before(svid.NotAfter) {
			return fmt.Errorf("withdrawn, but the last SVID is gone before its expiry (%s): %v", svid.NotAfter, ids(st.SVIDs))
		}
		return nil
	})
	testenv.Eventually(t, 2*svidTTL, "web's last SVID gone at its expiry", func() error {
		if st, _ := d.Pod(string(web.UID)); len(st.SVIDs) != 0 {
			return fmt.Errorf("still %v, expiring %s", ids(st.SVIDs), st.SVIDs[0].NotAfter)
		}
		return nil
	})
	if now := time.Now(); now.Before(svid.NotAfter) {
		t.Fatalf("web's SVID dropped at %s, before its expiry %s", now, svid.NotAfter)
	}
}

// svidTTL is the TTL of the pods' SVIDs (the ClusterSPIFFEID's ttl): short, so that rotation and
// expiry happen within the test.
const svidTTL = 20 * time.Second

func ids(svids []*identity.SVID) []string {
	out := make([]string, len(svids))
	for i, s := range svids {
		out[i] = s.SPIFFEID
	}
	return out
}

// verify checks that svid's leaf verifies against bundle (PEM) for client and server use.
func verify(t *testing.T, svid *identity.SVID, bundle []byte) {
	t.Helper()
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle holds no certificate")
	}
	var leaf *x509.Certificate
	for rest := svid.CertChainPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if leaf == nil {
			leaf = c
		} else {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("SVID %s does not verify against the bundle: %v", svid.SPIFFEID, err)
	}
}
