package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/aethermesh/aether/model"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestAssembleSkipsHostileParts feeds objects that a real kube-apiserver accepts but whose parts
// the model cannot hold (80/TCP beside 80/SCTP; a ServiceImport with port 80 twice, ports 0,
// 70000 and -1 and a VIP that is no IP; clusterset Services whose mesh-service annotation names
// another namespace or no DNS label; a ServiceImport named with 253 characters) through a KubeSource into Assemble: exactly those parts are
// left out and listed in Mesh.Skipped by object, field and value, as are an unknown appProtocol
// and an unknown endpoint.aether.io/protocol pod annotation (the defaults apply), and everything
// else stays in the model (53/UDP beside 53/TCP, headless and ExternalName Services; 9 Services
// with the API server's own "kubernetes").
func TestAssembleSkipsHostileParts(t *testing.T) {
	cs, mcs := startAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	must := fatalOnError(t)
	for _, ns := range []string{"shop", "other"} {
		must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}))
	}
	port := func(name string, n int32, p corev1.Protocol) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Port: n, Protocol: p}
	}
	for _, s := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "dns"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			port("udp", 53, corev1.ProtocolUDP), port("tcp", 53, corev1.ProtocolTCP), port("http", 80, corev1.ProtocolTCP)}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "dual"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			port("tcp", 80, corev1.ProtocolTCP), port("sctp", 80, corev1.ProtocolSCTP)}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "ext"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "web"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "steal-clusterset", Labels: map[string]string{model.LabelManagedBy: model.ManagedByAether},
			Annotations: map[string]string{model.AnnotationMeshService: "other/web"}}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "odd-clusterset", Labels: map[string]string{model.LabelManagedBy: model.ManagedByAether},
			Annotations: map[string]string{model.AnnotationMeshService: "shop/a/b"}}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}}},
	} {
		must(cs.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{}))
	}
	must(mcs.MulticlusterV1beta1().ServiceImports("shop").Create(ctx, &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Name: "api"},
		Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.96.9.9", "not-an-ip"}, Ports: []mcsv1beta1.ServicePort{
			{Name: "a", Port: 80, Protocol: corev1.ProtocolTCP}, {Name: "b", Port: 80, Protocol: corev1.ProtocolTCP},
			{Name: "zero", Port: 0}, {Name: "big", Port: 70000}, {Name: "neg", Port: -1}}},
	}, metav1.CreateOptions{}))

	custom := "example.com/custom"
	must(cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "custom"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "c", Port: 80, AppProtocol: &custom}}}}, metav1.CreateOptions{}))
	// There is no controller manager: the ServiceAccount admission plugin needs the account.
	must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	pod, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "quic", Annotations: map[string]string{model.AnnotationPortProtocol: "quic"}},
		Spec:       corev1.PodSpec{NodeName: "node-1", AutomountServiceAccountToken: new(bool), Containers: []corev1.Container{{Name: "app", Image: "echo"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a.", 126) + "b"
	must(mcs.MulticlusterV1beta1().ServiceImports("shop").Create(ctx, &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Name: long},
		Spec:       mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.96.9.10"}, Ports: []mcsv1beta1.ServicePort{{Name: "a", Port: 80}}},
	}, metav1.CreateOptions{}))

	src, err := NewKubeSource(cs, mcs, "node-1", 0, func() {})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	var m *model.Mesh
	testenv.Eventually(t, time.Minute, "every object in the informers", func() error {
		s := model.Sources{Cluster: "c1", Attachments: map[string]cniv1.PodAttachment{string(pod.UID): {PodUID: string(pod.UID), NetnsPath: "/var/run/netns/x", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.9")}}}}
		if err := src.Fill(&s); err != nil {
			return err
		}
		if len(s.Services) != 9 || len(s.Imports) != 2 || len(s.MeshNamespaces) != 2 || len(s.Pods) != 1 {
			return fmt.Errorf("%d services, %d imports, %d namespaces, %d pods", len(s.Services), len(s.Imports), len(s.MeshNamespaces), len(s.Pods))
		}
		m = model.Assemble(1, s)
		return nil
	})

	ports := func(ns, name string) string {
		s := m.Service(model.ServiceKey{Namespace: ns, Name: name})
		if s == nil {
			return "absent"
		}
		var out []string
		for _, p := range s.Ports {
			out = append(out, fmt.Sprintf("%s:%d/%s", p.Name, p.Port, p.Protocol))
		}
		return fmt.Sprint(out)
	}
	for _, c := range []struct{ ns, name, want string }{
		{"shop", "dns", "[udp:53/UDP tcp:53/HTTP http:80/HTTP]"},
		{"shop", "dual", "[tcp:80/HTTP]"},
		{"shop", "headless", "[http:80/HTTP]"},
		{"shop", "ext", "[]"},
		{"shop", "api", "[a:80/HTTP]"},
		{"other", "web", "[http:80/HTTP]"},
		{"shop", "custom", "[c:80/HTTP]"},
	} {
		if got := ports(c.ns, c.name); got != c.want {
			t.Errorf("%s/%s ports = %s, want %s", c.ns, c.name, got, c.want)
		}
	}
	if s := m.Service(model.ServiceKey{Namespace: "shop", Name: "api"}); s == nil || !slices.Equal(s.ClustersetVIPs, []netip.Addr{netip.MustParseAddr("10.96.9.9")}) {
		t.Errorf("shop/api = %+v, want clusterset VIP 10.96.9.9 only", s)
	}
	if s := m.Service(model.ServiceKey{Namespace: "other", Name: "web"}); s == nil || s.Imported || len(s.ClustersetVIPs) > 0 {
		t.Errorf("other/web = %+v: a clusterset Service in another namespace made it imported", s)
	}
	if m.Service(model.ServiceKey{Namespace: "shop", Name: long}) != nil {
		t.Errorf("the ServiceImport named %q is in the model", long)
	}
	if s := m.Service(model.ServiceKey{Namespace: "shop", Name: "headless"}); s == nil || len(s.VIPs) > 0 {
		t.Errorf("shop/headless = %+v, want no VIP", s)
	}
	var got []string
	for _, s := range m.Skipped() {
		got = append(got, s.Object+" "+s.Field+"="+s.Value)
	}
	slices.Sort(got)
	want := []string{
		"Service shop/dual spec.ports[1].protocol=SCTP",
		"Service shop/odd-clusterset metadata.annotations[aether.io/mesh-service]=shop/a/b",
		"Service shop/steal-clusterset metadata.annotations[aether.io/mesh-service]=other/web",
		"ServiceImport shop/api spec.ips[1]=not-an-ip",
		"ServiceImport shop/api spec.ports[1].port=80",
		"ServiceImport shop/api spec.ports[2].port=0",
		"ServiceImport shop/api spec.ports[3].port=70000",
		"ServiceImport shop/api spec.ports[4].port=-1",
		"ServiceImport shop/" + long + " metadata.name=" + long,
		"Service shop/custom spec.ports[0].appProtocol=example.com/custom",
		"Pod shop/quic metadata.annotations[endpoint.aether.io/protocol]=quic",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Skipped =\n%q\nwant\n%q", got, want)
	}
	for _, s := range m.Skipped() {
		if s.Reason == "" {
			t.Errorf("%s has no reason", s)
		}
	}
}
