package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Protocol is the application protocol of a service or endpoint port, as declared by the
// Service's appProtocol or the pod annotation endpoint.aether.io/protocol (DESIGN.md, service
// model). HTTP is the default; UDP passes through uncaptured.
type Protocol string

// The protocols a port can declare.
const (
	ProtocolHTTP  Protocol = "HTTP"
	ProtocolHTTP2 Protocol = "HTTP2"
	ProtocolGRPC  Protocol = "GRPC"
	ProtocolTCP   Protocol = "TCP"
	ProtocolUDP   Protocol = "UDP"
)

// IsHTTP reports whether traffic of this protocol goes through an HTTP connection manager
// (HTTP/1.1, HTTP/2 and gRPC) rather than a TCP floor chain.
func (p Protocol) IsHTTP() bool {
	return p == ProtocolHTTP || p == ProtocolHTTP2 || p == ProtocolGRPC
}

// ParseProtocol maps an appProtocol or annotation value (case-insensitive; "h2c", "kubernetes.io/h2c",
// "http2", "grpc", "tcp", "udp", "http", "") to a Protocol. The empty string means HTTP. It returns
// an error naming the value for anything else.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "http", "http/1.1", "kubernetes.io/http":
		return ProtocolHTTP, nil
	case "http2", "h2c", "kubernetes.io/h2c":
		return ProtocolHTTP2, nil
	case "grpc":
		return ProtocolGRPC, nil
	case "tcp", "mysql", "redis", "mongo", "tls", "https", "kubernetes.io/ws", "kubernetes.io/wss":
		return ProtocolTCP, nil
	case "udp":
		return ProtocolUDP, nil
	}
	return "", fmt.Errorf("protocol %q: want one of HTTP, HTTP2, GRPC, TCP, UDP", s)
}

// ServiceKey names a mesh service: a Kubernetes Service by namespace and name in its home cluster.
type ServiceKey struct {
	Namespace string
	Name      string
}

// String returns "<namespace>/<name>".
func (k ServiceKey) String() string { return k.Namespace + "/" + k.Name }

// Compare orders keys by namespace, then name.
func (k ServiceKey) Compare(o ServiceKey) int {
	if c := strings.Compare(k.Namespace, o.Namespace); c != 0 {
		return c
	}
	return strings.Compare(k.Name, o.Name)
}

// ServicePort is one port of a mesh service.
type ServicePort struct {
	// Name is the Service port's name ("" for a single unnamed port).
	Name string
	// Port is the Service port clients dial on the VIP.
	Port uint32
	// TargetPort is the container port the application listens on. It is also the SNI
	// ("<port>") that selects the inbound filter chain at the destination pod. For a named
	// targetPort, or a port of a service known only from its ServiceImport, it is the number
	// most endpoints registered for the port, the lowest on a tie (Assemble): endpoints may
	// serve the port on different numbers, so each endpoint's own port comes from EndpointPort,
	// and the choice does not depend on the order of the endpoints, so that pod churn does not
	// flip it (which would rebuild the port's clusters).
	TargetPort uint32
	// TargetPortName is the Service's named targetPort ("" when numeric); the agent on each pod's
	// node resolves it against the pod's container ports when it registers the endpoint
	// (LocalPod.TargetPort), per pod, as the EndpointSlice controller does.
	TargetPortName string
	// Protocol decides HTTP routing or a TCP floor chain.
	Protocol Protocol
	// AppProtocol is true when Protocol was declared by the Service port's appProtocol (or its
	// UDP protocol), which takes precedence over the pod annotation endpoint.aether.io/protocol.
	AppProtocol bool
	// FromImport is true for a port of a service this cluster knows only from its ServiceImport
	// (not Local). An MCS ServiceImport port has no targetPort: the home cluster's agents
	// resolved it per pod (a named targetPort may be a different number in each pod) and
	// registered it under the port's Name, so endpoints serve it on their own numbers, matched by
	// Name (EndpointPort), and TargetPort is only the number most of them serve.
	FromImport bool
}

// PerEndpoint reports whether sp's endpoints in the cluster that defines it may serve it on
// different target ports: a named targetPort (TargetPortName) or a port of an imported service
// (FromImport). EndpointPort then matches every endpoint's port by the Service port's Name, not
// by TargetPort. Other clusters' endpoints (of an imported service) are matched by Name in any
// case, so an imported service's ports may be served on several numbers even when PerEndpoint
// is false.
func (sp ServicePort) PerEndpoint() bool { return sp.TargetPortName != "" || sp.FromImport }

// Service is a mesh service as one cluster's model sees it: a local Service (its ClusterIP is the
// local VIP) and/or a service imported through MCS (its <svc>-clusterset Service's ClusterIP is the
// clusterset VIP). A cluster's model never holds a remote service that is not exported.
type Service struct {
	Key ServiceKey
	// Local is true when the Service exists in this cluster.
	Local bool
	// VIPs are the local Service's ClusterIPs (empty when not Local or headless).
	VIPs []netip.Addr
	// Headless is true for a local Service with spec.clusterIP None: it has no VIP, its clients
	// resolve its pods' IPs (kube-dns) and connect to one pod directly.
	Headless bool
	// ExternalName is true for a local Service of type ExternalName: a DNS alias with no VIP and
	// no endpoints, which a route cannot send to (GEP-1294: such Services "SHOULD NOT be allowed
	// as parentRefs or backendRefs").
	ExternalName bool
	// Imported is true when a ServiceImport exists for it in this cluster (exported somewhere in
	// the clusterset).
	Imported bool
	// ClustersetVIPs are the ClusterIPs of the <svc>-clusterset Service (from ServiceImport
	// spec.ips).
	ClustersetVIPs []netip.Addr
	// Exported is true when this cluster exports the service (an export mark from this cluster).
	Exported bool
	// Ports are the service's ports, sorted by Port.
	Ports []ServicePort
	// Created is the local Service's creation time; the oldest wins a short-name clash.
	Created time.Time
}

// AllVIPs returns the local VIPs followed by the clusterset VIPs.
func (s *Service) AllVIPs() []netip.Addr {
	return append(slices.Clone(s.VIPs), s.ClustersetVIPs...)
}

// PortByTarget returns the service port whose TargetPort is p.
func (s *Service) PortByTarget(p uint32) (ServicePort, bool) {
	for _, sp := range s.Ports {
		if sp.TargetPort == p {
			return sp, true
		}
	}
	return ServicePort{}, false
}

// EndpointPort returns the port of e that serves sp in the model of cluster (Mesh.Cluster).
// e's port registered under sp's Name when sp.PerEndpoint (a named targetPort: each pod resolves
// the name to its own container port, as in an EndpointSlice, whose ports are per slice and whose
// controller groups pods by resolved port; or a port known only from a ServiceImport), and when
// e is another cluster's endpoint: its home cluster's agent registered the port under Name with
// the target port of that cluster's Service, which may be another number than this cluster's
// (MCS: exports agree on a port's name, number and protocol, not on its targetPort). Else, for
// this cluster's endpoint of a numeric targetPort, e's port numbered sp.TargetPort. It reports
// false when e does not serve sp: its pod declares no container port of that name (so its agent
// registered none), or, with a numeric targetPort, this cluster's endpoint was registered for
// another number.
func (sp ServicePort) EndpointPort(e *Endpoint, cluster string) (EndpointPort, bool) {
	if sp.PerEndpoint() || e.Cluster != cluster {
		return portNamed(e, sp.Name)
	}
	for _, p := range e.Ports {
		if p.Port == sp.TargetPort {
			return p, true
		}
	}
	return EndpointPort{}, false
}

// EndpointPort is one port a registered endpoint serves.
type EndpointPort struct {
	Name     string
	Port     uint32 // container (target) port
	Protocol Protocol
}

// Endpoint is one meshed pod backing a service, as registered in the registry by the agent on the
// pod's node. Cluster, Region and Zone come from the registry key path (the origin), never from
// the stored value.
type Endpoint struct {
	Service  ServiceKey
	Cluster  string
	Region   string
	Zone     string
	PodName  string
	PodUID   string
	IPs      []netip.Addr
	NodeName string
	// NodeIP is the pod's node InternalIP; invalid (zero) when unknown. The east-west waypoint
	// dials NodeIP:15443.
	NodeIP   netip.Addr
	Ports    []EndpointPort
	SPIFFEID string
	Healthy  bool
}

// PodPort is a container port of a local pod.
type PodPort struct {
	Name     string
	Port     uint32
	Protocol Protocol
}

// LocalPod is a meshed pod on this node: its cniv1.PodAttachment (from CNI ADD) joined with its
// Kubernetes metadata.
type LocalPod struct {
	UID            string
	Namespace      string
	Name           string
	ServiceAccount string
	ContainerID    string
	// NetnsPath is the pod's network namespace path (e.g. /var/run/netns/cni-...), which Envoy
	// uses for SocketAddress.network_namespace_filepath.
	NetnsPath string
	IPs       []netip.Addr
	Ports     []PodPort
	Ready     bool
	// Protocol is the pod's annotation endpoint.aether.io/protocol, HTTP when absent or invalid.
	Protocol Protocol
	// Services are the local services whose selector matches the pod's labels, sorted.
	Services []ServiceKey
}

// TargetPort returns the container port of the pod that serves sp: sp.TargetPort when the
// Service's targetPort is a number, else the pod's container port named sp.TargetPortName with
// the same L4 protocol (UDP or not), as the EndpointSlice controller's findPort matches. It
// reports false when the pod declares no container port of that name: the pod is then not an
// endpoint of that Service port (Kubernetes leaves it out of the EndpointSlices too).
func (p *LocalPod) TargetPort(sp ServicePort) (uint32, bool) {
	if sp.TargetPortName == "" {
		return sp.TargetPort, sp.TargetPort != 0
	}
	for _, pp := range p.Ports {
		if pp.Name == sp.TargetPortName && (pp.Protocol == ProtocolUDP) == (sp.Protocol == ProtocolUDP) {
			return pp.Port, true
		}
	}
	return 0, false
}

// SPIFFEID returns the pod's workload identity, spiffe://<trustDomain>/ns/<ns>/sa/<sa>.
func (p *LocalPod) SPIFFEID(trustDomain string) string {
	return SPIFFEID(trustDomain, p.Namespace, p.ServiceAccount)
}

// SPIFFEID returns spiffe://<trustDomain>/ns/<namespace>/sa/<serviceAccount> (DESIGN.md, names).
// An empty service account means "default", as in Kubernetes.
func SPIFFEID(trustDomain, namespace, serviceAccount string) string {
	if serviceAccount == "" {
		serviceAccount = "default"
	}
	return "spiffe://" + trustDomain + "/ns/" + namespace + "/sa/" + serviceAccount
}

// MeshAddr picks, of a pod's addresses (LocalPod.IPs, Endpoint.IPs), the one the mesh carries:
// the node proxy binds the pod's inbound mTLS listener to it and dials the endpoint at it, and
// the resolver answers a headless Service's names with it. It is the first IPv4 address, else
// the first address; false when there is none. On a dual-stack pod the other address is not
// the mesh's: a connection to it is passed through in plaintext.
func MeshAddr(ips []netip.Addr) (netip.Addr, bool) {
	for _, ip := range ips {
		if ip.Is4() {
			return ip, true
		}
	}
	if len(ips) > 0 {
		return ips[0], true
	}
	return netip.Addr{}, false
}
