package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/aethermesh/aether/model"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	"github.com/aethermesh/aether/internal/testenv"
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
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{model.LabelRegion: "eu", model.LabelZone: "eu-1"}},
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

	build := func() *model.Mesh {
		s := model.Sources{Cluster: "a", Attachments: map[string]cniv1.PodAttachment{string(pod.UID): {PodUID: string(pod.UID), NetnsPath: "/var/run/netns/x", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.9")}}}}
		if err := src.Fill(&s); err != nil {
			t.Fatal(err)
		}
		return model.Assemble(1, s)
	}
	testenv.Eventually(t, 30*time.Second, "model with web, pay and the pod", func() error {
		if m := build(); len(m.Services) != 2 || len(m.Pods) != 1 {
			return fmt.Errorf("%d services and %d pods, want 2 and 1", len(m.Services), len(m.Pods))
		}
		return nil
	})
	m := build()
	w := m.Service(model.ServiceKey{Namespace: "shop", Name: "web"})
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
		if w := build().Service(model.ServiceKey{Namespace: "shop", Name: "web"}); w != nil {
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

// TestNamedTargetPortPerPodRealAPIServer: a Service whose named targetPort is 5432 in one pod and
// 6432 in another (the API server accepts it), plus a pod that declares no port of that name
// and a headless Service. The model resolves each pod's own port, lists the pod without the
// name in Mesh.Skipped, keeps each registered endpoint's own port, and marks the headless
// Service Headless with no VIP.
func TestNamedTargetPortPerPodRealAPIServer(t *testing.T) {
	cs, mcs := startAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	must := fatalOnError(t)
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}))
	must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	sel := map[string]string{"app": "db"}
	must(cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       corev1.ServiceSpec{Selector: sel, Ports: []corev1.ServicePort{{Name: "sql", Port: 5432, TargetPort: intstr.FromString("pg")}}},
	}, metav1.CreateOptions{}))
	must(cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db-peers"},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: sel, Ports: []corev1.ServicePort{{Name: "sql", Port: 5432, TargetPort: intstr.FromString("pg")}}},
	}, metav1.CreateOptions{}))
	pods := map[string][]corev1.ContainerPort{
		"db-1": {{Name: "pg", ContainerPort: 5432}},
		"db-2": {{Name: "pg", ContainerPort: 6432}},
		"db-3": {{Name: "metrics", ContainerPort: 9187}},
	}
	att := map[string]cniv1.PodAttachment{}
	ips := map[string]netip.Addr{}
	for i, name := range slices.Sorted(maps.Keys(pods)) {
		p, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: sel},
			Spec: corev1.PodSpec{NodeName: "node-1", AutomountServiceAccountToken: new(bool),
				Containers: []corev1.Container{{Name: "app", Image: "db", Ports: pods[name]}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ips[name] = netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)})
		att[string(p.UID)] = cniv1.PodAttachment{PodUID: string(p.UID), NetnsPath: "/var/run/netns/" + name, IPs: []netip.Addr{ips[name]}}
	}
	src, err := NewKubeSource(cs, mcs, "node-1", 0, func() {})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	build := func(eps []model.Endpoint) *model.Mesh {
		s := model.Sources{Cluster: "a", Attachments: att, Endpoints: eps}
		if err := src.Fill(&s); err != nil {
			t.Fatal(err)
		}
		return model.Assemble(1, s)
	}
	testenv.Eventually(t, 30*time.Second, "model with both services and three pods", func() error {
		if m := build(nil); len(m.Services) != 2 || len(m.Pods) != 3 {
			return fmt.Errorf("%d services and %d pods, want 2 and 3", len(m.Services), len(m.Pods))
		}
		return nil
	})
	m := build(nil)
	dbKey, peersKey := model.ServiceKey{Namespace: "shop", Name: "db"}, model.ServiceKey{Namespace: "shop", Name: "db-peers"}
	if p := m.Service(peersKey); !p.Headless || len(p.VIPs) != 0 {
		t.Errorf("db-peers: Headless %v VIPs %v, want headless without VIP", p.Headless, p.VIPs)
	}
	if db := m.Service(dbKey); db.Headless || len(db.VIPs) != 1 {
		t.Errorf("db: Headless %v VIPs %v, want a VIP", db.Headless, db.VIPs)
	}

	// Each pod resolves the name to its own port; the agent registers that (desiredEndpoints).
	sp := m.Service(dbKey).Ports[0]
	wantPort := map[string]uint32{"db-1": 5432, "db-2": 6432}
	var eps []model.Endpoint
	for _, p := range m.Pods {
		got, ok := p.TargetPort(sp)
		if ok != (wantPort[p.Name] != 0) || got != wantPort[p.Name] {
			t.Errorf("%s: TargetPort = %d %v, want %d", p.Name, got, ok, wantPort[p.Name])
		}
		if !ok {
			continue
		}
		for _, k := range []model.ServiceKey{dbKey, peersKey} {
			eps = append(eps, model.Endpoint{Service: k, Cluster: "a", PodName: p.Name, PodUID: p.UID, IPs: p.IPs,
				Ports: []model.EndpointPort{{Name: sp.Name, Port: got, Protocol: model.ProtocolTCP}}})
		}
	}
	var skipped []string
	for _, s := range m.Skipped() {
		skipped = append(skipped, s.String())
	}
	if len(skipped) != 2 || !strings.Contains(skipped[0], "Pod shop/db-3") || !strings.Contains(skipped[0], `"pg"`) ||
		!strings.Contains(skipped[0], "shop/db port 5432") || !strings.Contains(skipped[1], "shop/db-peers port 5432") {
		t.Errorf("Skipped = %q, want db-3's missing port pg for shop/db and shop/db-peers", skipped)
	}

	// With the endpoints registered, every endpoint serves the port on its own number.
	m = build(eps)
	for _, k := range []model.ServiceKey{dbKey, peersKey} {
		sp := m.Service(k).Ports[0]
		got := map[string]uint32{}
		for _, e := range m.Endpoints[k] {
			if p, ok := sp.EndpointPort(&e, "a"); ok {
				got[e.PodName] = p.Port
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(wantPort) {
			t.Errorf("%s: endpoint ports = %v, want %v", k, got, wantPort)
		}
	}
}
