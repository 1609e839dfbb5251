package model

import (
	"net/netip"
	"testing"
	"time"

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
		if got, ok := p.Ports[0].EndpointPort(&e); !ok || got.Port != want {
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
		Attachments: map[string]PodAttachment{
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
