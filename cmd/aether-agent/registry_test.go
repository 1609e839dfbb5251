package main

import (
	"log/slog"
	"net/netip"
	"testing"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/registry"
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

func TestRegistryViewAppliesEndpointBatches(t *testing.T) {
	v := newRegistryView(slog.New(slog.DiscardHandler), func() {})
	rec := func(key, addr string) registry.Record[*registryv1.ServiceEndpoint] {
		return registry.Record[*registryv1.ServiceEndpoint]{Key: key, Origin: registry.Origin{Region: "eu", Cluster: "b"},
			Value: &registryv1.ServiceEndpoint{Service: &registryv1.ServiceRef{Namespace: "shop", Name: "web"}, Addresses: []string{addr},
				Kubernetes: &registryv1.KubernetesMetadata{PodUid: key}}}
	}
	ev := func(typ registry.EventType, key, addr string) registry.Event[*registryv1.ServiceEndpoint] {
		return registry.Event[*registryv1.ServiceEndpoint]{Type: typ, Record: rec(key, addr)}
	}
	addrs := func() map[string]string {
		eps, _ := v.Records()
		out := map[string]string{}
		for _, e := range eps {
			out[e.PodUID] = e.IPs[0].String()
		}
		return out
	}
	apply := func(evs ...registry.Event[*registryv1.ServiceEndpoint]) {
		v.mu.Lock()
		v.applyEndpoints(registry.Batch[*registryv1.ServiceEndpoint]{Events: evs})
		v.cacheOK = false
		v.mu.Unlock()
	}
	apply(ev(registry.Added, "p1", "10.0.0.1"), ev(registry.Added, "p2", "10.0.0.2"), ev(registry.Added, "bad", "not-an-ip"))
	if got := addrs(); len(got) != 2 || got["p1"] != "10.0.0.1" || got["p2"] != "10.0.0.2" {
		t.Fatalf("after snapshot: %v, want p1 and p2 (the bad record skipped)", got)
	}
	// An update converts only the changed record; a valid record turning bad leaves the view.
	apply(ev(registry.Updated, "p1", "10.0.0.9"), ev(registry.Updated, "p2", "999.1.1.1"))
	if got := addrs(); len(got) != 1 || got["p1"] != "10.0.0.9" {
		t.Fatalf("after update: %v, want only p1 at 10.0.0.9", got)
	}
	apply(ev(registry.Deleted, "p1", ""))
	if got := addrs(); len(got) != 0 {
		t.Fatalf("after delete: %v, want none", got)
	}
}
