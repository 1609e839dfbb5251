package model

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/aethermesh/aether/internal/testenv"
)

// ServicePort.EndpointPort resolves a named targetPort and an imported service's port per
// endpoint, by the port each endpoint registered under the Service port's name, and a numeric one
// by number for this cluster's endpoints; another cluster's endpoint always by name (its home
// cluster's Service may give the port another targetPort). Before, a local numeric targetPort
// matched other clusters' endpoints by number, and dropped those whose pods serve another one.
func TestServicePortEndpointPort(t *testing.T) {
	ep := func(cluster string, ports ...EndpointPort) *Endpoint {
		return &Endpoint{Cluster: cluster, Ports: ports}
	}
	named := ServicePort{Name: "db", Port: 5432, TargetPort: 5432, TargetPortName: "pg"}
	numeric := ServicePort{Name: "http", Port: 80, TargetPort: 8080}
	imported := ServicePort{Name: "http", Port: 80, TargetPort: 8080, FromImport: true}
	tests := []struct {
		name string
		sp   ServicePort
		ep   *Endpoint
		want uint32 // 0: the endpoint does not serve the port
	}{
		{"named, the chosen port", named, ep("a", EndpointPort{Name: "db", Port: 5432}), 5432},
		{"named, another pod's own port", named, ep("a", EndpointPort{Name: "db", Port: 6432}), 6432},
		{"named, beside other ports", named, ep("a", EndpointPort{Name: "http", Port: 5432}, EndpointPort{Name: "db", Port: 7432}), 7432},
		{"named, pod without the name", named, ep("a", EndpointPort{Name: "http", Port: 8080}), 0},
		{"named, a number alone does not serve", named, ep("a", EndpointPort{Name: "metrics", Port: 5432}), 0},
		{"named, another cluster's pod", named, ep("b", EndpointPort{Name: "db", Port: 6432}), 6432},
		{"numeric", numeric, ep("a", EndpointPort{Name: "http", Port: 8080}), 8080},
		{"numeric, other number", numeric, ep("a", EndpointPort{Name: "http", Port: 9090}), 0},
		{"numeric, another cluster's pod on another number", numeric, ep("b", EndpointPort{Name: "http", Port: 9090}), 9090},
		{"numeric, another cluster's pod on the same number", numeric, ep("b", EndpointPort{Name: "http", Port: 8080}), 8080},
		{"numeric, another cluster's pod: by name, not number", numeric, ep("b", EndpointPort{Name: "admin", Port: 8080}, EndpointPort{Name: "http", Port: 9090}), 9090},
		{"numeric, another cluster's pod: a number alone does not serve", numeric, ep("b", EndpointPort{Name: "metrics", Port: 8080}), 0},
		{"imported, the chosen port", imported, ep("b", EndpointPort{Name: "http", Port: 8080}), 8080},
		{"imported, another pod's own port", imported, ep("b", EndpointPort{Name: "http", Port: 8082}), 8082},
		{"imported, a number alone does not serve", imported, ep("b", EndpointPort{Name: "metrics", Port: 8080}), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := tt.sp.EndpointPort(tt.ep, "a")
			if ok != (tt.want != 0) || p.Port != tt.want {
				t.Errorf("EndpointPort = %d %v, want %d", p.Port, ok, tt.want)
			}
		})
	}
}

// LocalPod.TargetPort resolves a named targetPort against the pod's own container ports, with
// the Service port's L4 protocol, as the EndpointSlice controller does.
func TestLocalPodTargetPort(t *testing.T) {
	pod := &LocalPod{Ports: []PodPort{{Name: "dns", Port: 5353, Protocol: ProtocolUDP}, {Name: "pg", Port: 6432, Protocol: ProtocolTCP}, {Name: "dns", Port: 5354, Protocol: ProtocolHTTP}}}
	tests := []struct {
		name string
		sp   ServicePort
		want uint32
	}{
		{"numeric", ServicePort{Port: 80, TargetPort: 8080}, 8080},
		{"named", ServicePort{Port: 5432, TargetPortName: "pg", TargetPort: 5432}, 6432},
		{"named, UDP service port", ServicePort{Port: 53, TargetPortName: "dns", Protocol: ProtocolUDP}, 5353},
		{"named, TCP service port skips the UDP container port", ServicePort{Port: 53, TargetPortName: "dns", Protocol: ProtocolTCP}, 5354},
		{"named, not declared", ServicePort{Port: 9, TargetPortName: "nope"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := pod.TargetPort(tt.sp)
			if ok != (tt.want != 0) || got != tt.want {
				t.Errorf("TargetPort = %d %v, want %d", got, ok, tt.want)
			}
		})
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
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{LabelMeshNamespace: MeshNamespaceEnabled}}}, metav1.CreateOptions{}))
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
	att := map[string]PodAttachment{}
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
		att[string(p.UID)] = PodAttachment{PodUID: string(p.UID), NetnsPath: "/var/run/netns/" + name, IPs: []netip.Addr{ips[name]}}
	}
	src, err := NewKubeSource(cs, mcs, "node-1", 0, func() {})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	build := func(eps []Endpoint) *Mesh {
		s := Sources{Cluster: "a", Attachments: att, Endpoints: eps}
		if err := src.Fill(&s); err != nil {
			t.Fatal(err)
		}
		return Assemble(1, s)
	}
	testenv.Eventually(t, 30*time.Second, "model with both services and three pods", func() error {
		if m := build(nil); len(m.Services) != 2 || len(m.Pods) != 3 {
			return fmt.Errorf("%d services and %d pods, want 2 and 3", len(m.Services), len(m.Pods))
		}
		return nil
	})
	m := build(nil)
	dbKey, peersKey := ServiceKey{"shop", "db"}, ServiceKey{"shop", "db-peers"}
	if p := m.Service(peersKey); !p.Headless || len(p.VIPs) != 0 {
		t.Errorf("db-peers: Headless %v VIPs %v, want headless without VIP", p.Headless, p.VIPs)
	}
	if db := m.Service(dbKey); db.Headless || len(db.VIPs) != 1 {
		t.Errorf("db: Headless %v VIPs %v, want a VIP", db.Headless, db.VIPs)
	}

	// Each pod resolves the name to its own port; the agent registers that (desiredEndpoints).
	sp := m.Service(dbKey).Ports[0]
	wantPort := map[string]uint32{"db-1": 5432, "db-2": 6432}
	var eps []Endpoint
	for _, p := range m.Pods {
		got, ok := p.TargetPort(sp)
		if ok != (wantPort[p.Name] != 0) || got != wantPort[p.Name] {
			t.Errorf("%s: TargetPort = %d %v, want %d", p.Name, got, ok, wantPort[p.Name])
		}
		if !ok {
			continue
		}
		for _, k := range []ServiceKey{dbKey, peersKey} {
			eps = append(eps, Endpoint{Service: k, Cluster: "a", PodName: p.Name, PodUID: p.UID, IPs: p.IPs,
				Ports: []EndpointPort{{Name: sp.Name, Port: got, Protocol: ProtocolTCP}}})
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
	for _, k := range []ServiceKey{dbKey, peersKey} {
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
