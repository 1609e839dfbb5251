package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

func svc(ns, name, ip string, created time.Time, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec:       corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: ports},
	}
}

func ptr[T any](v T) *T { return &v }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestAssembleServicesAndPorts(t *testing.T) {
	in := Sources{
		Cluster:        "a",
		MeshNamespaces: map[string]bool{"shop": true},
		Services: []*corev1.Service{
			svc("shop", "web", "10.96.0.10", t0,
				corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
				corev1.ServicePort{Name: "db", Port: 5432, TargetPort: intstr.FromString("pg"), AppProtocol: ptr("tcp")},
				corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			),
			svc("other", "ignored", "10.96.0.99", t0, corev1.ServicePort{Port: 80}),
		},
		Endpoints: []Endpoint{{
			Service: ServiceKey{"shop", "web"}, Cluster: "a", PodUID: "p1",
			Ports: []EndpointPort{{Name: "http", Port: 8080, Protocol: ProtocolHTTP}, {Name: "db", Port: 15432, Protocol: ProtocolTCP}},
		}},
	}
	m := Assemble(7, in)
	if m.Version != 7 || m.MeshDomain != DefaultMeshDomain || m.TrustDomain != DefaultTrustDomain {
		t.Fatalf("mesh header = %d %q %q", m.Version, m.MeshDomain, m.TrustDomain)
	}
	if len(m.Services) != 1 {
		t.Fatalf("services = %d, want 1 (the unmeshed namespace is ignored)", len(m.Services))
	}
	s := m.Service(ServiceKey{"shop", "web"})
	want := []ServicePort{
		{Name: "dns", Port: 53, TargetPort: 53, Protocol: ProtocolUDP, AppProtocol: true},
		{Name: "http", Port: 80, TargetPort: 8080, Protocol: ProtocolHTTP},
		{Name: "db", Port: 5432, TargetPort: 15432, TargetPortName: "pg", Protocol: ProtocolTCP, AppProtocol: true},
	}
	if len(s.Ports) != len(want) {
		t.Fatalf("ports = %+v", s.Ports)
	}
	for i := range want {
		if s.Ports[i] != want[i] {
			t.Errorf("port %d = %+v, want %+v", i, s.Ports[i], want[i])
		}
	}
	if got := m.ServiceByVIP(netip.MustParseAddr("10.96.0.10")); got != s {
		t.Errorf("ServiceByVIP = %v, want shop/web", got)
	}
	if m.FQDN(s.Key) != "web.shop.mesh" || m.ShortName(s.Key) != "web.mesh" {
		t.Errorf("names = %q %q", m.FQDN(s.Key), m.ShortName(s.Key))
	}
}

func TestAssembleClusterset(t *testing.T) {
	web := ServiceKey{"shop", "web"}
	pay := ServiceKey{"shop", "pay"}
	secret := ServiceKey{"shop", "secret"}
	cs := svc("shop", "pay-clusterset", "10.96.5.5", t0, corev1.ServicePort{Port: 80})
	cs.Labels = map[string]string{LabelManagedBy: ManagedByAether}
	cs.Annotations = map[string]string{AnnotationMeshService: "shop/pay"}
	in := Sources{
		Cluster:        "a",
		MeshNamespaces: map[string]bool{"shop": true},
		Services:       []*corev1.Service{svc("shop", "web", "10.96.0.10", t0, corev1.ServicePort{Name: "http", Port: 80}), cs},
		Imports: []*mcsv1beta1.ServiceImport{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "pay"},
			Spec:       mcsv1beta1.ServiceImportSpec{IPs: []string{"10.96.5.5"}, Ports: []mcsv1beta1.ServicePort{{Name: "grpc", Port: 9000, AppProtocol: ptr("grpc")}}},
		}},
		Endpoints: []Endpoint{
			{Service: web, Cluster: "a", PodUID: "w1"},
			{Service: web, Cluster: "b", PodUID: "w2"},                                                    // b does not export web
			{Service: pay, Cluster: "b", PodUID: "p1", Ports: []EndpointPort{{Name: "grpc", Port: 9090}}}, // exported by b
			{Service: pay, Cluster: "b", PodUID: "p3", Ports: []EndpointPort{{Name: "grpc", Port: 9091}}}, // a named targetPort resolved otherwise
			{Service: pay, Cluster: "c", PodUID: "p2"},                                                    // c does not export pay
			{Service: secret, Cluster: "b", PodUID: "s1"},                                                 // remote, unexported
		},
		Exports: []ExportMark{{Service: pay, Cluster: "b"}, {Service: secret, Cluster: "z"}},
	}
	m := Assemble(1, in)
	if m.Service(secret) != nil {
		t.Error("a remote service that this cluster does not import is in the model")
	}
	p := m.Service(pay)
	if p == nil || p.Local || !p.Imported {
		t.Fatalf("pay = %+v, want imported, not local", p)
	}
	if len(p.ClustersetVIPs) != 1 || p.ClustersetVIPs[0] != netip.MustParseAddr("10.96.5.5") {
		t.Errorf("pay clusterset VIPs = %v, want [10.96.5.5] once", p.ClustersetVIPs)
	}
	if len(p.Ports) != 1 || p.Ports[0].TargetPort != 9090 || p.Ports[0].Protocol != ProtocolGRPC || !p.Ports[0].FromImport {
		t.Fatalf("pay ports = %+v, want grpc 9000 -> 9090, from the import", p.Ports)
	}
	// The ServiceImport has no targetPort: each endpoint serves the port on the number its
	// home cluster's agent registered under the port's name.
	for _, e := range m.Endpoints[pay] {
		want := map[string]uint32{"p1": 9090, "p3": 9091}[e.PodUID]
		if got, ok := p.Ports[0].EndpointPort(&e, "a"); !ok || got.Port != want {
			t.Errorf("pay endpoint %s serves grpc on %d %v, want %d", e.PodUID, got.Port, ok, want)
		}
	}
	if m.ServiceByVIP(netip.MustParseAddr("10.96.5.5")) != p {
		t.Error("clusterset VIP does not find pay")
	}
	if eps := m.Endpoints[pay]; len(eps) != 2 || eps[0].PodUID != "p1" || eps[1].PodUID != "p3" {
		t.Errorf("pay endpoints = %+v, want only b's (c does not export)", eps)
	}
	if eps := m.Endpoints[web]; len(eps) != 1 || eps[0].Cluster != "a" {
		t.Errorf("web endpoints = %+v, want only the local one (web is not exported by b)", eps)
	}
	if m.Service(ServiceKey{"shop", "pay-clusterset"}) != nil {
		t.Error("the <svc>-clusterset Service itself became a mesh service")
	}
}

// permutations returns every order of eps.
func permutations(eps []Endpoint) [][]Endpoint {
	if len(eps) <= 1 {
		return [][]Endpoint{slices.Clone(eps)}
	}
	var out [][]Endpoint
	for i := range eps {
		rest := append(slices.Clone(eps[:i]), eps[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]Endpoint{eps[i]}, p...))
		}
	}
	return out
}

// TestAssembleTargetPortIndependentOfOrder: where endpoints serve a port on different numbers (a
// named targetPort, a port known only from a ServiceImport) or declare different protocols, the
// port's TargetPort is the number most endpoints registered, the lowest on a tie, and its
// protocol likewise, in every order of the registry's endpoints. Before, both were the first
// endpoint's: the order (the registry's listing, pod churn) flipped them, and with them the
// port's Envoy clusters.
func TestAssembleTargetPortIndependentOfOrder(t *testing.T) {
	pay, db := ServiceKey{"shop", "pay"}, ServiceKey{"shop", "db"}
	ep := func(k ServiceKey, cluster, uid, name string, port uint32, proto Protocol) Endpoint {
		return Endpoint{Service: k, Cluster: cluster, PodUID: uid, Ports: []EndpointPort{{Name: name, Port: port, Protocol: proto}}}
	}
	local := svc("shop", "db", "10.96.0.11", t0, corev1.ServicePort{Name: "sql", Port: 5432, TargetPort: intstr.FromString("pg")})
	imp := &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "pay"},
		Spec: mcsv1beta1.ServiceImportSpec{IPs: []string{"10.96.5.5"}, Ports: []mcsv1beta1.ServicePort{{Name: "grpc", Port: 9000}}}}
	tests := []struct {
		name      string
		key       ServiceKey
		eps       []Endpoint
		wantPort  uint32
		wantProto Protocol
	}{
		{"imported: the number most pods serve", pay, []Endpoint{
			ep(pay, "b", "p1", "grpc", 9091, ProtocolGRPC), ep(pay, "b", "p2", "grpc", 9090, ProtocolGRPC), ep(pay, "c", "p3", "grpc", 9091, ProtocolGRPC)},
			9091, ProtocolGRPC},
		{"imported: a tie goes to the lowest", pay, []Endpoint{
			ep(pay, "b", "p1", "grpc", 9091, ProtocolTCP), ep(pay, "b", "p2", "grpc", 9090, ProtocolTCP), ep(pay, "b", "p4", "other", 9089, ProtocolTCP)},
			9090, ProtocolTCP},
		{"imported: the protocol most pods declare", pay, []Endpoint{
			ep(pay, "b", "p1", "grpc", 9090, ProtocolTCP), ep(pay, "b", "p2", "grpc", 9090, ProtocolHTTP2), ep(pay, "c", "p3", "grpc", 9090, ProtocolTCP)},
			9090, ProtocolTCP},
		{"local named targetPort: the number most pods serve", db, []Endpoint{
			ep(db, "a", "d1", "sql", 6432, ProtocolTCP), ep(db, "a", "d2", "sql", 5432, ProtocolTCP), ep(db, "a", "d3", "sql", 6432, ProtocolTCP)},
			6432, ProtocolTCP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, eps := range permutations(tt.eps) {
				m := Assemble(1, Sources{
					Cluster: "a", MeshNamespaces: map[string]bool{"shop": true},
					Services: []*corev1.Service{local}, Imports: []*mcsv1beta1.ServiceImport{imp}, Endpoints: eps,
					Exports: []ExportMark{{Service: pay, Cluster: "b"}, {Service: pay, Cluster: "c"}},
				})
				sp := m.Service(tt.key).Ports[0]
				if sp.TargetPort != tt.wantPort || sp.Protocol != tt.wantProto {
					var order []string
					for _, e := range eps {
						order = append(order, fmt.Sprintf("%s:%d/%s", e.PodUID, e.Ports[0].Port, e.Ports[0].Protocol))
					}
					t.Errorf("endpoints in order %v: TargetPort %d protocol %s, want %d %s", order, sp.TargetPort, sp.Protocol, tt.wantPort, tt.wantProto)
				}
			}
		})
	}
}

// TestAssembleLocalAndImportedNumericTargetPort: a local Service whose targetPort is a number
// (8080) and which is also imported (exported by b, whose pods serve the port on 9090). This
// cluster's endpoints serve it on 8080, matched by number; b's each on the number its agent
// registered under the port's name. TargetPort stays the local Service's number, even though
// most endpoints serve 9090. Before, b's pods on 9090 were dropped from the service.
func TestAssembleLocalAndImportedNumericTargetPort(t *testing.T) {
	web := ServiceKey{"shop", "web"}
	ep := func(cluster, uid string, ports ...EndpointPort) Endpoint {
		return Endpoint{Service: web, Cluster: cluster, PodUID: uid, Ports: ports}
	}
	http := func(port uint32) EndpointPort { return EndpointPort{Name: "http", Port: port, Protocol: ProtocolHTTP} }
	m := Assemble(1, Sources{
		Cluster: "a", MeshNamespaces: map[string]bool{"shop": true},
		Services: []*corev1.Service{svc("shop", "web", "10.96.0.10", t0, corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)})},
		Imports: []*mcsv1beta1.ServiceImport{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
			Spec: mcsv1beta1.ServiceImportSpec{IPs: []string{"10.96.5.10"}, Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80}}}}},
		Endpoints: []Endpoint{
			ep("a", "w1", http(8080)),
			ep("a", "w2", http(9090)), // registered for another number (a stale registration): not served
			ep("b", "w3", http(9090)),
			ep("b", "w4", EndpointPort{Name: "admin", Port: 8080, Protocol: ProtocolHTTP}, http(9091)),
			ep("b", "w5", http(8080)),
			ep("b", "w6", http(9090)),
		},
		Exports: []ExportMark{{Service: web, Cluster: "b"}},
	})
	s := m.Service(web)
	if s == nil || !s.Local || !s.Imported {
		t.Fatalf("web = %+v, want local and imported", s)
	}
	sp := s.Ports[0]
	if sp.TargetPort != 8080 || sp.PerEndpoint() {
		t.Errorf("web port = %+v, want the local Service's targetPort 8080", sp)
	}
	got := map[string]uint32{}
	for _, e := range m.Endpoints[web] {
		if p, ok := sp.EndpointPort(&e, m.Cluster); ok {
			got[e.PodUID] = p.Port
		}
	}
	want := map[string]uint32{"w1": 8080, "w3": 9090, "w4": 9091, "w5": 8080, "w6": 9090}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("endpoint ports = %v, want %v", got, want)
	}
}

func TestAssembleShortNameClash(t *testing.T) {
	in := Sources{
		Cluster:        "a",
		MeshNamespaces: map[string]bool{"x": true, "y": true, "z": true},
		Services: []*corev1.Service{
			svc("y", "api", "10.96.0.2", t0.Add(time.Hour)),
			svc("x", "api", "10.96.0.1", t0.Add(2*time.Hour)),
			svc("z", "api", "10.96.0.3", t0),
			svc("x", "solo", "10.96.0.4", t0),
		},
	}
	m := Assemble(1, in)
	if owner, _ := m.ShortNameOwner("api"); owner != (ServiceKey{"z", "api"}) {
		t.Errorf("api.mesh owner = %v, want z/api (oldest)", owner)
	}
	if m.ShortName(ServiceKey{"x", "api"}) != "" || m.ShortName(ServiceKey{"x", "solo"}) != "solo.mesh" {
		t.Error("short names wrong for x/api or x/solo")
	}
	c := m.ShortNameClashes()
	if len(c) != 1 || c[0].Name != "api" || len(c[0].Losers) != 2 || c[0].Losers[0] != (ServiceKey{"y", "api"}) {
		t.Errorf("clashes = %+v, want api won by z/api, losers y/api then x/api", c)
	}
}

func TestAssemblePods(t *testing.T) {
	pod := func(uid, name string, ready bool, ann map[string]string) *corev1.Pod {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID(uid), Annotations: ann, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{ServiceAccountName: "sa-" + name, Containers: []corev1.Container{{
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "q", ContainerPort: 53, Protocol: corev1.ProtocolUDP}},
			}}},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
		}
	}
	sel := svc("shop", "web", "10.96.0.10", t0)
	sel.Spec.Selector = map[string]string{"app": "web"}
	in := Sources{
		Cluster:        "a",
		MeshNamespaces: map[string]bool{"shop": true},
		Services:       []*corev1.Service{sel, svc("shop", "noselector", "10.96.0.11", t0)},
		Pods: []*corev1.Pod{
			func() *corev1.Pod {
				p := pod("u1", "b-ready", true, map[string]string{AnnotationPortProtocol: "tcp"})
				p.Labels["app"] = "web"
				return p
			}(),
			pod("u2", "a-notready", false, nil),
			pod("u3", "optout", true, map[string]string{AnnotationCapture: "false"}),
			pod("u4", "noattach", true, nil),
		},
		Attachments: map[string]cniv1.PodAttachment{
			"u1": {PodUID: "u1", NetnsPath: "/var/run/netns/u1", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5")}, ContainerID: "c1"},
			"u2": {PodUID: "u2", NetnsPath: "/var/run/netns/u2", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.6")}},
			"u3": {PodUID: "u3", NetnsPath: "/var/run/netns/u3"},
		},
	}
	m := Assemble(1, in)
	if len(m.Pods) != 2 || m.Pods[0].Name != "a-notready" || m.Pods[1].Name != "b-ready" {
		t.Fatalf("pods = %+v, want a-notready and b-ready (sorted; opted-out and unattached left out)", m.Pods)
	}
	p := m.Pod("u1")
	if !p.Ready || p.NetnsPath != "/var/run/netns/u1" || p.ContainerID != "c1" || p.IPs[0].String() != "10.244.0.5" {
		t.Errorf("pod u1 = %+v", p)
	}
	if p.Ports[0] != (PodPort{Name: "http", Port: 8080, Protocol: ProtocolTCP}) || p.Ports[1].Protocol != ProtocolUDP {
		t.Errorf("pod u1 ports = %+v", p.Ports)
	}
	if p.SPIFFEID(m.TrustDomain) != "spiffe://aether.internal/ns/shop/sa/sa-b-ready" {
		t.Errorf("SPIFFE ID = %q", p.SPIFFEID(m.TrustDomain))
	}
	if len(p.Services) != 1 || p.Services[0] != (ServiceKey{"shop", "web"}) {
		t.Errorf("pod u1 services = %v, want [shop/web] (selector app=web)", p.Services)
	}
	if len(m.Pod("u2").Services) != 0 {
		t.Errorf("pod u2 has no app=web label but is selected by %v", m.Pod("u2").Services)
	}
	if m.Pod("u2").Ready {
		t.Error("u2 is not Ready but the model says it is")
	}
}

func TestParseProtocol(t *testing.T) {
	for in, want := range map[string]Protocol{"": ProtocolHTTP, "HTTP": ProtocolHTTP, "kubernetes.io/h2c": ProtocolHTTP2,
		"gRPC": ProtocolGRPC, "tcp": ProtocolTCP, "mysql": ProtocolTCP, "UDP": ProtocolUDP} {
		if got, err := ParseProtocol(in); err != nil || got != want {
			t.Errorf("ParseProtocol(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseProtocol("sctp"); err == nil {
		t.Error(`ParseProtocol("sctp") succeeded, want an error naming the value`)
	}
}

// TestPodMeshed: the one rule for a pod's membership, and the assembly follows it: a pod with a
// CNI attachment is left out of the model when any condition fails (a host-network pod with an
// attachment record, which only an old or edited record can give, was served before the rule
// was shared with the CNI server).
func TestPodMeshed(t *testing.T) {
	pod := func(hostNet bool, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: "u1", Annotations: ann},
			Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: hostNet}}
	}
	for _, c := range []struct {
		name   string
		p      *corev1.Pod
		nsMesh bool
		reason string // "" when meshed
	}{
		{"meshed", pod(false, nil), true, ""},
		{"capture annotation other than false", pod(false, map[string]string{AnnotationCapture: "true"}), true, ""},
		{"namespace not opted in", pod(false, nil), false, LabelMeshNamespace + "=" + MeshNamespaceEnabled},
		{"opted out", pod(false, map[string]string{AnnotationCapture: "false"}), true, AnnotationCapture},
		{"host network", pod(true, nil), true, "host network"},
	} {
		t.Run(c.name, func(t *testing.T) {
			meshed, reason := PodMeshed(c.p, c.nsMesh)
			if meshed != (c.reason == "") || (c.reason != "" && !strings.Contains(reason, c.reason)) {
				t.Fatalf("PodMeshed = %v, %q; want meshed=%v, reason naming %q", meshed, reason, c.reason == "", c.reason)
			}
			m := Assemble(1, Sources{Cluster: "a", MeshNamespaces: map[string]bool{"shop": c.nsMesh}, Pods: []*corev1.Pod{c.p},
				Attachments: map[string]cniv1.PodAttachment{"u1": {PodUID: "u1", NetnsPath: "/run/netns/x",
					IPs: []netip.Addr{netip.MustParseAddr("10.244.0.9")}}}})
			if got := m.Pod("u1") != nil; got != meshed {
				t.Fatalf("pod in the model = %v, want %v", got, meshed)
			}
		})
	}
	if !NamespaceMeshed(map[string]string{LabelMeshNamespace: MeshNamespaceEnabled}) || NamespaceMeshed(map[string]string{LabelMeshNamespace: "true"}) || NamespaceMeshed(nil) {
		t.Fatal("NamespaceMeshed accepts only aether.io/mesh=enabled")
	}
}
