package registry

import (
	"fmt"
	"net/netip"
	"time"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
)

// protocols maps registry protocols to model protocols.
var protocols = map[registryv1.Protocol]model.Protocol{
	registryv1.Protocol_PROTOCOL_HTTP:  model.ProtocolHTTP,
	registryv1.Protocol_PROTOCOL_HTTP2: model.ProtocolHTTP2,
	registryv1.Protocol_PROTOCOL_GRPC:  model.ProtocolGRPC,
	registryv1.Protocol_PROTOCOL_TCP:   model.ProtocolTCP,
	registryv1.Protocol_PROTOCOL_UDP:   model.ProtocolUDP,
}

// ProtocolFromModel maps a model protocol to its registry enum value; it returns an error naming
// the value for an unknown protocol.
func ProtocolFromModel(p model.Protocol) (registryv1.Protocol, error) {
	for k, v := range protocols {
		if v == p {
			return k, nil
		}
	}
	return registryv1.Protocol_PROTOCOL_UNSPECIFIED, fmt.Errorf("map protocol %q: want one of HTTP, HTTP2, GRPC, TCP, UDP", p)
}

// ToModelEndpoint converts a read endpoint record to the mesh model's Endpoint. Cluster and
// Region come from rec.Origin (the key path), never from the value. It returns an error naming
// the field when an address, the node IP or a protocol does not convert (records from
// ListEndpoints and WatchEndpoints are validated and always convert).
func ToModelEndpoint(rec Record[*registryv1.ServiceEndpoint]) (model.Endpoint, error) {
	ep := rec.Value
	out := model.Endpoint{
		Service:  model.ServiceKey{Namespace: ep.GetService().GetNamespace(), Name: ep.GetService().GetName()},
		Cluster:  rec.Origin.Cluster,
		Region:   rec.Origin.Region,
		Zone:     ep.GetZone(),
		PodName:  ep.GetKubernetes().GetPodName(),
		PodUID:   ep.GetKubernetes().GetPodUid(),
		NodeName: ep.GetKubernetes().GetNodeName(),
		SPIFFEID: ep.GetSpiffeId(),
		Healthy:  ep.GetHealth() == registryv1.Health_HEALTH_HEALTHY,
	}
	for i, a := range ep.GetAddresses() {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return model.Endpoint{}, fmt.Errorf("convert endpoint %q: addresses[%d] %q: %w", rec.Key, i, a, err)
		}
		out.IPs = append(out.IPs, ip)
	}
	if s := ep.GetKubernetes().GetNodeIp(); s != "" {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return model.Endpoint{}, fmt.Errorf("convert endpoint %q: kubernetes.node_ip %q: %w", rec.Key, s, err)
		}
		out.NodeIP = ip
	}
	for i, p := range ep.GetPorts() {
		proto, ok := protocols[p.GetProtocol()]
		if !ok {
			return model.Endpoint{}, fmt.Errorf("convert endpoint %q: ports[%d].protocol %v: unknown", rec.Key, i, p.GetProtocol())
		}
		out.Ports = append(out.Ports, model.EndpointPort{Name: p.GetName(), Port: p.GetPort(), Protocol: proto})
	}
	return out, nil
}

// ToModelExport converts a read export mark record to the mesh model's ExportMark: Cluster and
// Region from rec.Origin (the key path), Created from create_time (zero when it does not parse;
// records from ListExports and WatchExports are validated), and each port's name, port, target
// port and protocol (an unknown protocol converts to ""). The agents' model and the registrar
// merge an imported service's ports from exactly these (model.MergeExportPorts), so the
// ServiceImport's ports and the clusters each port's traffic reaches agree.
func ToModelExport(rec Record[*registryv1.ExportMark]) model.ExportMark {
	m := rec.Value
	x := model.ExportMark{
		Service: model.ServiceKey{Namespace: m.GetService().GetNamespace(), Name: m.GetService().GetName()},
		Cluster: rec.Origin.Cluster, Region: rec.Origin.Region,
	}
	if t, err := time.Parse(time.RFC3339Nano, m.GetCreateTime()); err == nil {
		x.Created = t
	}
	for _, p := range m.GetPorts() {
		x.Ports = append(x.Ports, model.ServicePort{Name: p.GetName(), Port: p.GetPort(), TargetPort: p.GetTargetPort(), Protocol: protocols[p.GetProtocol()]})
	}
	return x
}
