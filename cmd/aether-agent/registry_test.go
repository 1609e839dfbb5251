package main

import (
	"net/netip"
	"testing"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
)

func TestDesiredEndpoints(t *testing.T) {
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	db := model.ServiceKey{Namespace: "shop", Name: "db"}
	m := model.New(1, "a", "", "", model.Node{Name: "n1", IP: netip.MustParseAddr("172.30.0.11"), Zone: "z1"},
		[]*model.Service{
			{Key: web, Local: true, Ports: []model.ServicePort{
				{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP},
				{Name: "admin", Port: 9000, TargetPortName: "admin", Protocol: model.ProtocolHTTP},
				{Name: "raw", Port: 7000, TargetPort: 7000, Protocol: model.ProtocolTCP, AppProtocol: true},
			}},
			{Key: db, Local: true, Ports: []model.ServicePort{{Name: "pg", Port: 5432, TargetPortName: "missing"}}},
		}, nil,
		[]*model.LocalPod{
			{UID: "u1", Namespace: "shop", Name: "web-1", ServiceAccount: "web", Ready: true, Protocol: model.ProtocolGRPC,
				IPs:      []netip.Addr{netip.MustParseAddr("10.244.1.5")},
				Ports:    []model.PodPort{{Name: "admin", Port: 9901}},
				Services: []model.ServiceKey{db, web}},
			{UID: "u2", Namespace: "shop", Name: "web-2", Services: []model.ServiceKey{web}}, // no IPs: not registrable
		})
	got := desiredEndpoints(m)
	if len(got) != 1 {
		t.Fatalf("desired endpoints = %v, want only shop/web/u1 (db's named port is missing on the pod; u2 has no IP)", got)
	}
	ep := got["shop/web/u1"]
	if ep == nil {
		t.Fatalf("no shop/web/u1 in %v", got)
	}
	if ep.Health != registryv1.Health_HEALTH_HEALTHY || ep.SpiffeId != "spiffe://aether.internal/ns/shop/sa/web" ||
		ep.Kubernetes.NodeIp != "172.30.0.11" || ep.Zone != "z1" || ep.Addresses[0] != "10.244.1.5" {
		t.Errorf("endpoint = %v", ep)
	}
	// Service ports in model order (by port: 80, 7000, 9000).
	want := []*registryv1.EndpointPort{
		{Name: "http", Port: 8080, Protocol: registryv1.Protocol_PROTOCOL_GRPC}, // the pod annotation wins over the default
		{Name: "raw", Port: 7000, Protocol: registryv1.Protocol_PROTOCOL_TCP},   // appProtocol wins over the annotation
		{Name: "admin", Port: 9901, Protocol: registryv1.Protocol_PROTOCOL_GRPC},
	}
	if len(ep.Ports) != len(want) {
		t.Fatalf("ports = %v", ep.Ports)
	}
	for i, w := range want {
		g := ep.Ports[i]
		if g.Name != w.Name || g.Port != w.Port || g.Protocol != w.Protocol {
			t.Errorf("port %d = %v, want %v", i, g, w)
		}
	}
}
