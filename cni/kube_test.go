package cni

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestKubePods runs the client-go pod lookup against a real kube-apiserver: service account,
// container ports, the opt-out annotation and the namespace opt-in label; a bounded lookup of an
// unreachable API server fails within its deadline; meshed pods on a node are listed and one is
// removed by DeletePod (a delete with a UID precondition: a stale UID leaves the pod alone, and a
// pod already gone is no error).
func TestKubePods(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	createNamespaces(t, cs)
	mkPod := func(ns, name string, ann map[string]string) *corev1.Pod { return createPod(t, cs, ns, name, ann, true) }
	web := mkPod("mesh", "web", map[string]string{model.AnnotationPortProtocol: "tcp"})
	mkPod("mesh", "optout", map[string]string{model.AnnotationCapture: "false"})
	mkPod("plain", "other", nil)

	k := &KubePods{Client: cs}
	info, err := k.LookupPod(ctx, "mesh", "web")
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := info.Meshed(); !ok || info.UID != string(web.UID) || info.ServiceAccount != "web" || len(info.Ports) != 2 ||
		info.Ports[0] != (model.PodPort{Name: "http", Port: 8080, Protocol: model.ProtocolTCP}) || info.Ports[1].Protocol != model.ProtocolUDP {
		t.Fatalf("LookupPod(mesh/web) = %+v", info)
	}
	for _, tc := range []struct{ ns, name, reason string }{{"mesh", "optout", model.AnnotationCapture}, {"plain", "other", model.LabelMeshNamespace}} {
		info, err := k.LookupPod(ctx, tc.ns, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if ok, why := info.Meshed(); ok || !strings.Contains(why, tc.reason) {
			t.Fatalf("%s/%s meshed = %v (%s), want not meshed because of %s", tc.ns, tc.name, ok, why, tc.reason)
		}
	}
	if _, err := k.LookupPod(ctx, "mesh", "missing"); !apierrors.IsNotFound(err) {
		t.Fatalf("lookup of a missing pod = %v, want NotFound", err)
	}

	// A lookup against an API server that does not answer ends at its deadline.
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts into the backlog, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	dead, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + silent.Addr().String(), TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = (&KubePods{Client: dead}).LookupPod(lctx, "mesh", "web")
	lcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lookup against a silent API server = %v, want the deadline", err)
	}

	pods, err := k.MeshedPodsOnNode(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].Name != "web" || pods[0].UID != string(web.UID) {
		t.Fatalf("MeshedPodsOnNode = %+v, want only mesh/web", pods)
	}
	stale := pods[0]
	stale.UID = "00000000-0000-0000-0000-000000000000" // an earlier pod of the same name
	if err := k.DeletePod(ctx, stale); !apierrors.IsConflict(err) || !strings.Contains(err.Error(), "mesh/web") {
		t.Fatalf("DeletePod with a stale UID = %v, want a precondition conflict naming mesh/web", err)
	}
	if p, err := cs.CoreV1().Pods("mesh").Get(ctx, "web", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("DeletePod with a stale UID removed the pod (%v)", err)
	}
	if err := k.DeletePod(ctx, pods[0]); err != nil {
		t.Fatal(err)
	}
	p, err := cs.CoreV1().Pods("mesh").Get(ctx, "web", metav1.GetOptions{})
	if err == nil && p.DeletionTimestamp == nil {
		t.Fatal("removed pod is neither gone nor terminating")
	}
	if err := k.DeletePod(ctx, PodRef{Namespace: "mesh", Name: "gone"}); err != nil {
		t.Fatalf("DeletePod of a pod already gone = %v, want nil", err)
	}
}

// createNamespaces creates namespace mesh (labelled aether.io/mesh=enabled) and plain, each with
// service account web.
func createNamespaces(t testing.TB, cs kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	for name, labels := range map[string]map[string]string{"mesh": {model.LabelMeshNamespace: model.MeshNamespaceEnabled}, "plain": nil} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// createPod creates a pod bound to node-a with service account web and ports 8080/TCP and
// 8125/UDP; running sets its status to Running with a pod IP (as a kubelet would).
func createPod(t testing.TB, cs kubernetes.Interface, ns, name string, ann map[string]string, running bool) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "web", AutomountServiceAccountToken: new(bool), Containers: []corev1.Container{{
			Name: "app", Image: "app", Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
				{Name: "stats", ContainerPort: 8125, Protocol: corev1.ProtocolUDP}}}}},
	}
	p, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !running {
		return p
	}
	p.Status.Phase, p.Status.PodIP = corev1.PodRunning, "10.244.0.9"
	if p, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}
