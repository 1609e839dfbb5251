package model

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"
)

// TestKubeSourceRealAPIServer feeds a KubeSource from a real kube-apiserver and checks that the
// assembled model follows creates and deletes.
func TestKubeSourceRealAPIServer(t *testing.T) {
	cs, mcs := startAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	mustCreate := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{LabelMeshNamespace: MeshNamespaceEnabled}}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{LabelRegion: "eu", LabelZone: "eu-1"}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.30.0.11"}}},
	}, metav1.CreateOptions{})
	mustCreate(err)

	var changes atomic.Int32
	src, err := NewKubeSource(cs, mcs, "node-1", 0, func() { changes.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := src.Healthy(ctx, 5*time.Second); err != nil {
		t.Fatalf("Healthy: %v", err)
	}

	web, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.CoreV1().Services("plain").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = mcs.MulticlusterV1beta1().ServiceImports("shop").Create(ctx, &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Name: "pay"},
		Spec:       mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.96.9.9"}, Ports: []mcsv1beta1.ServicePort{{Name: "grpc", Port: 9000, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	mustCreate(err)
	// There is no controller manager: the ServiceAccount admission plugin needs the account.
	_, err = cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1"},
		Spec:       corev1.PodSpec{NodeName: "node-1", AutomountServiceAccountToken: new(bool), Containers: []corev1.Container{{Name: "app", Image: "echo"}}},
	}, metav1.CreateOptions{})
	mustCreate(err)
	pod, err := cs.CoreV1().Pods("shop").Get(ctx, "web-1", metav1.GetOptions{})
	mustCreate(err)

	build := func() *Mesh {
		s := Sources{Cluster: "a", Attachments: map[string]PodAttachment{string(pod.UID): {PodUID: string(pod.UID), NetnsPath: "/var/run/netns/x", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.9")}}}}
		if err := src.Fill(&s); err != nil {
			t.Fatal(err)
		}
		return Assemble(1, s)
	}
	testenv.Eventually(t, 30*time.Second, "model with web, pay and the pod", func() error {
		if m := build(); len(m.Services) != 2 || len(m.Pods) != 1 {
			return fmt.Errorf("%d services and %d pods, want 2 and 1", len(m.Services), len(m.Pods))
		}
		return nil
	})
	m := build()
	w := m.Service(ServiceKey{"shop", "web"})
	if w == nil || !w.Local || len(w.VIPs) != 1 || w.VIPs[0].String() != web.Spec.ClusterIP {
		t.Fatalf("web = %+v, want local with VIP %s", w, web.Spec.ClusterIP)
	}
	if p := m.ServiceByVIP(netip.MustParseAddr("10.96.9.9")); p == nil || p.Key.Name != "pay" {
		t.Fatalf("clusterset VIP 10.96.9.9 -> %v, want shop/pay", p)
	}
	if m.Node.IP.String() != "172.30.0.11" || m.Node.Region != "eu" || m.Node.Zone != "eu-1" {
		t.Errorf("node = %+v", m.Node)
	}
	if changes.Load() == 0 {
		t.Error("onChange was never called")
	}

	if err := cs.CoreV1().Services("shop").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "web removed from the model", func() error {
		if w := build().Service(ServiceKey{"shop", "web"}); w != nil {
			return fmt.Errorf("shop/web still in the model: %+v", w)
		}
		return nil
	})
}

// startAPI starts a real kube-apiserver with aether's CRDs (deploy/crds) for the test and
// returns clients of it.
func startAPI(t *testing.T) (*kubernetes.Clientset, *mcsclient.Clientset) {
	t.Helper()
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	return kubernetes.NewForConfigOrDie(api.Config), mcsclient.NewForConfigOrDie(api.Config)
}

// fatalOnError returns a function that fails t at once on a non-nil error, for the two results
// of a client's Create.
func fatalOnError(t *testing.T) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}
