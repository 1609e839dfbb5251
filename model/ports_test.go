package model

import (
	"testing"
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
