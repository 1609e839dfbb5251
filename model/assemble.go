package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	secv1alpha1 "github.com/aethermesh/aether/api/aether/security/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// Well-known labels and annotations (DESIGN.md, service model: keys).
const (
	LabelManagedBy          = "aether.io/managed-by"
	ManagedByAether         = "aether"
	AnnotationMeshService   = "aether.io/mesh-service"
	AnnotationMeshPort      = "aether.io/mesh-port"
	AnnotationCapture       = "aether.io/capture"
	LabelMeshNamespace      = "aether.io/mesh"
	MeshNamespaceEnabled    = "enabled"
	AnnotationPortProtocol  = "endpoint.aether.io/protocol"
	ClustersetServiceSuffix = "-clusterset"
)

// GatewayControllerName is aether's Gateway API controller name (GatewayClass
// spec.controllerName, and the controllerName of the route status aether writes for mesh routes;
// Gateway API v1.6.3, GEP-1294). docs/routing.md.
const GatewayControllerName = "aether.io/gateway-controller"

// NamespaceMeshed reports whether a namespace's labels opt its pods into the mesh
// (LabelMeshNamespace: MeshNamespaceEnabled).
func NamespaceMeshed(labels map[string]string) bool {
	return labels[LabelMeshNamespace] == MeshNamespaceEnabled
}

// PodMeshed is the one rule for whether pod p is in the mesh, used by the CNI server (capture
// at ADD, repair) and the assembly alike. p is meshed when its namespace is opted in
// (namespaceMeshed, see NamespaceMeshed), it is not on the host network (it shares the node's
// netns: there is nothing to capture) and it does not opt out (AnnotationCapture "false"). When
// it is not, reason says why, naming the field.
func PodMeshed(p *corev1.Pod, namespaceMeshed bool) (meshed bool, reason string) {
	switch {
	case p.Spec.HostNetwork:
		return false, "host network pod"
	case !namespaceMeshed:
		return false, "namespace not labelled " + LabelMeshNamespace + "=" + MeshNamespaceEnabled
	case p.Annotations[AnnotationCapture] == "false":
		return false, "pod annotated " + AnnotationCapture + `="false"`
	}
	return true, ""
}

// Node labels read for locality (the well-known topology labels).
const (
	LabelRegion = "topology.kubernetes.io/region"
	LabelZone   = "topology.kubernetes.io/zone"
)

// ExportMark records that a cluster exports a service (an MCS ServiceExport turned into a registry
// record by that cluster's registrar). Cluster and Region come from the registry key path.
type ExportMark struct {
	Service ServiceKey
	Cluster string
	Region  string
	Ports   []ServicePort
	Created time.Time
}

// Sources are the inputs one agent joins into a Mesh: its cluster's Kubernetes objects (as the
// informers hold them) and the registry's clusterset-wide records.
type Sources struct {
	Cluster     string
	MeshDomain  string
	TrustDomain string
	Node        Node
	// MeshNamespaces are the namespaces labelled aether.io/mesh: enabled.
	MeshNamespaces map[string]bool
	// Services are the Services of the meshed namespaces, including aether's <svc>-clusterset
	// Services.
	Services []*corev1.Service
	// Imports are the MCS ServiceImports of the meshed namespaces.
	Imports []*mcsv1beta1.ServiceImport
	// Pods are the Pods bound to this node.
	Pods []*corev1.Pod
	// Attachments are the persisted CNI attachments of this node, by pod UID.
	Attachments map[string]cniv1.PodAttachment
	// Uncaptured are the attachments of this node's pods left uncaptured (not meshed), by pod
	// UID: only edge Gateway pods are served from them (EdgePod), never as LocalPods.
	Uncaptured map[string]cniv1.PodAttachment
	// Endpoints and Exports are the registry's records from every cluster.
	Endpoints []Endpoint
	Exports   []ExportMark
	// HTTPRoutes and GRPCRoutes are the cluster's Gateway API routes (every namespace: a
	// consumer route lives in its callers' namespace).
	HTTPRoutes []*gwv1.HTTPRoute
	GRPCRoutes []*gwv1.GRPCRoute
	// Projections are the ServiceConfigProjections of every origin this agent imports
	// (--import-config; empty otherwise), and ControlCluster the only origin whose projections
	// apply when set (--control-cluster): SelectProjections, ImportRoutes.
	Projections    []Projection
	ControlCluster string
	// Edge holds the Gateway API objects of edge Gateways (docs/gateway.md); empty fields where
	// the CRDs are not installed.
	Edge EdgeSources
	// AuthorizationPolicies are the cluster's AuthorizationPolicies (every namespace; none where
	// the CRD is not installed): ResolveAuthz, SelectAuthz.
	AuthorizationPolicies []*secv1alpha1.AuthorizationPolicy
	// AuthzCache, when set, keeps the conversions of AuthorizationPolicies between assemblies
	// (the Assembler sets its own).
	AuthzCache *AuthzCache
	// InboundDefault is the mesh default inbound mTLS mode (the agent's --inbound-mode;
	// MTLSUnset: STRICT) and PeerAuthns the cluster's PeerAuthentication policies (every
	// namespace): with the authorization policies they give each local pod its Mesh.Inbound
	// (ResolveInbound).
	InboundDefault MTLSMode
	PeerAuthns     []PeerAuthn
}

// EdgeSources are the inputs of the edge Gateways an agent serves: the cluster's Gateway API
// objects, every namespace's labels (allowedRoutes selectors) and the listener certificates the
// registrar published for the agents.
type EdgeSources struct {
	GatewayClasses  []*gwv1.GatewayClass
	Gateways        []*gwv1.Gateway
	ReferenceGrants []*gwv1.ReferenceGrant
	// TCPRoutes, TLSRoutes and UDPRoutes serve edge Gateways (their Gateway parentRefs) and the
	// mesh (their Service and ServiceImport parentRefs: ResolveL4Routes).
	TCPRoutes       []*gwv1.TCPRoute
	TLSRoutes       []*gwv1.TLSRoute
	UDPRoutes       []*gwv1.UDPRoute
	NamespaceLabels map[string]map[string]string
	// Certificates are the Secrets labelled LabelEdgeCertificate in aether's namespace, each the
	// copy of the certificateRef its AnnotationCertificateRef names.
	Certificates []*corev1.Secret
	// CrossNamespaceCertificates is GatewayInputs.CrossNamespaceCertificates.
	CrossNamespaceCertificates bool
}

// Assemble joins Sources into a Mesh of the given version, following DESIGN.md's service model:
//   - a local Service in a meshed namespace is a mesh service whose VIPs are its ClusterIPs;
//   - a ServiceImport (or aether's <svc>-clusterset Service, annotation aether.io/mesh-service)
//     makes the service visible with its clusterset VIP;
//   - endpoints from this cluster count for every service in the model; endpoints from another
//     cluster count only while that cluster exports the service and this cluster imports it, so
//     remote unexported services never appear;
//   - this node's pods become LocalPods when they have a CNI attachment (with a netns path and an
//     IP address, else the pod is listed in Mesh.Skipped) and are not opted out (annotation
//     aether.io/capture: "false").
//
// Ports: a Service port's target port is its numeric targetPort, or, when named, the container port
// each endpoint registered for it (per pod: ServicePort.EndpointPort); another cluster's endpoint
// always serves it on the number its own agent registered under the port's name (the exporting
// clusters' Services agree on the port, not on its targetPort). The protocol is the port's
// appProtocol, else the one most registered endpoints declare, else HTTP. A local pod that a Service
// selects but that declares no container port of a named targetPort is not an endpoint of that
// port and is listed in Mesh.Skipped. A Service with clusterIP None is Headless. Assemble is
// pure: the same Sources give the same Mesh.
//
// Routes: HTTPRoutes and GRPCRoutes with a Service or ServiceImport parentRef, and the routes of
// the projections SelectProjections applies (ImportRoutes), bind as ResolveRoutes says
// (Mesh.Routing; Mesh.ConfigImports says what was imported, ignored or overridden), TCPRoutes, TLSRoutes and UDPRoutes as ResolveL4Routes says
// (Mesh.L4Routing); Mesh.RouteStatuses holds the statuses of both.
//
// Authorization: each AuthorizationPolicy is resolved as ResolveAuthz says, a Service target found
// when it is a local service of the model, and selects this node's pods as SelectAuthz says
// (Mesh.Authz; Mesh.AuthzResolved holds every policy's result, the inputs of its status).
//
// Parts of an object the model cannot hold are left out and listed in Mesh.Skipped, so one odd
// object never costs the other services their routing: a port number outside 1-65535 (a
// ServiceImport's CRD does not bound it), an SCTP port (not captured, so not meshed), a second
// non-UDP port with the same number as an earlier one (80/TCP beside 80/SCTP is valid in a
// Service; a ServiceImport may list a port twice), a VIP that is not an IP address, and an
// aether.io/mesh-service annotation that does not name a service in the Service's own namespace,
// and a whole ServiceImport whose name is not a DNS label (MCS names it after its Service). An
// appProtocol or endpoint.aether.io/protocol annotation ParseProtocol does not know is listed too
// (the default applies).
func Assemble(version uint64, in Sources) *Mesh {
	var skipped []Skipped
	skip := func(kind string, obj ServiceKey, field, value, reason string) {
		skipped = append(skipped, Skipped{Object: kind + " " + obj.String(), Field: field, Value: value, Reason: reason})
	}
	byKey := map[ServiceKey]*Service{}
	get := func(k ServiceKey) *Service {
		s := byKey[k]
		if s == nil {
			s = &Service{Key: k}
			byKey[k] = s
		}
		return s
	}
	type selected struct {
		key ServiceKey
		sel labels.Selector
	}
	var selectors []selected
	exported := map[ServiceKey]map[string]bool{}
	for _, x := range in.Exports {
		if exported[x.Service] == nil {
			exported[x.Service] = map[string]bool{}
		}
		exported[x.Service][x.Cluster] = true
	}

	for _, svc := range in.Services {
		if !in.MeshNamespaces[svc.Namespace] {
			continue
		}
		k := ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
		skipIP := func(i int, v, reason string) { skip("Service", k, fmt.Sprintf("spec.clusterIPs[%d]", i), v, reason) }
		if svc.Labels[LabelManagedBy] == ManagedByAether {
			v, ok := svc.Annotations[AnnotationMeshService]
			if !ok {
				continue
			}
			target, err := parseMeshService(v, svc.Namespace)
			if err != nil {
				skip("Service", k, "metadata.annotations["+AnnotationMeshService+"]", v, err.Error())
				continue
			}
			s := get(target)
			s.Imported = true
			s.ClustersetVIPs = appendIPs(s.ClustersetVIPs, svc.Spec.ClusterIPs, skipIP)
			continue
		}
		if len(svc.Spec.Selector) > 0 {
			selectors = append(selectors, selected{k, labels.SelectorFromSet(svc.Spec.Selector)})
		}
		s := get(k)
		s.Local = true
		s.Created = svc.CreationTimestamp.Time
		s.VIPs = appendIPs(nil, svc.Spec.ClusterIPs, skipIP)
		s.Headless = svc.Spec.ClusterIP == corev1.ClusterIPNone
		s.ExternalName = svc.Spec.Type == corev1.ServiceTypeExternalName
		s.Exported = exported[k][in.Cluster]
		s.Ports = nil
		for i, p := range svc.Spec.Ports {
			if f, v, reason := badPort(i, p.Port, p.Protocol, s.Ports); reason != "" {
				skip("Service", k, f, v, reason)
				continue
			}
			sp := ServicePort{Name: p.Name, Port: uint32(p.Port)}
			switch {
			case p.TargetPort.Type == intstr.String && p.TargetPort.StrVal != "":
				sp.TargetPortName = p.TargetPort.StrVal
			case p.TargetPort.IntValue() > 0:
				sp.TargetPort = uint32(p.TargetPort.IntValue())
			default: // unset targetPort defaults to the port (Kubernetes API semantics)
				sp.TargetPort = uint32(p.Port)
			}
			sp.Protocol = portProtocol(p.Protocol, p.AppProtocol, func(v, reason string) {
				skip("Service", k, fmt.Sprintf("spec.ports[%d].appProtocol", i), v, reason)
			})
			sp.AppProtocol = sp.Protocol != ""
			s.Ports = append(s.Ports, sp)
		}
	}
	for _, imp := range in.Imports {
		if !in.MeshNamespaces[imp.Namespace] {
			continue
		}
		k := ServiceKey{Namespace: imp.Namespace, Name: imp.Name}
		if errs := validation.IsDNS1123Label(imp.Name); len(errs) > 0 {
			// A CRD object's name may be 253 characters with dots; the mesh names and waypoint
			// SNI built from it would not be DNS names (Envoy refuses an SNI over 255 bytes).
			skip("ServiceImport", k, "metadata.name", imp.Name, "want a DNS label, the name of the Service it imports: "+strings.Join(errs, "; "))
			continue
		}
		s := get(k)
		s.Imported = true
		s.ClustersetVIPs = appendIPs(s.ClustersetVIPs, imp.Spec.IPs, func(i int, v, reason string) {
			skip("ServiceImport", k, fmt.Sprintf("spec.ips[%d]", i), v, reason)
		})
		if !s.Local {
			s.Ports = nil
			for i, p := range imp.Spec.Ports {
				if f, v, reason := badPort(i, p.Port, p.Protocol, s.Ports); reason != "" {
					skip("ServiceImport", k, f, v, reason)
					continue
				}
				proto := portProtocol(p.Protocol, p.AppProtocol, func(v, reason string) {
					skip("ServiceImport", k, fmt.Sprintf("spec.ports[%d].appProtocol", i), v, reason)
				})
				s.Ports = append(s.Ports, ServicePort{Name: p.Name, Port: uint32(p.Port), Protocol: proto, FromImport: true})
			}
		}
	}

	services := make([]*Service, 0, len(byKey))
	for _, s := range byKey {
		if s.Local || s.Imported {
			s.ClustersetVIPs = dedupIPs(s.ClustersetVIPs)
			services = append(services, s)
		}
	}
	// Endpoints are copied once, straight into slices of their final size: with many endpoints a
	// second copy and slice growth would cost more than the rest of Assemble.
	counts := map[ServiceKey]int{}
	for i := range in.Endpoints {
		if e := &in.Endpoints[i]; endpointCounts(byKey[e.Service], e, in.Cluster, exported) {
			counts[e.Service]++
		}
	}
	endpoints := make(map[ServiceKey][]Endpoint, len(counts))
	for k, n := range counts {
		endpoints[k] = make([]Endpoint, 0, n)
	}
	portFilter := newImportPortFilter(in.Exports) // mcsports.go: each port only to the clusters defining it the winning way
	for i := range in.Endpoints {
		if e := &in.Endpoints[i]; endpointCounts(byKey[e.Service], e, in.Cluster, exported) {
			endpoints[e.Service] = append(endpoints[e.Service], portFilter.endpoint(e, in.Cluster))
		}
	}
	for _, s := range services {
		resolvePorts(s, endpoints[s.Key])
	}

	var pods []*LocalPod
	podLabels := map[string]map[string]string{}
	for _, p := range in.Pods {
		att, ok := in.Attachments[string(p.UID)]
		if meshed, _ := PodMeshed(p, in.MeshNamespaces[p.Namespace]); !ok || !meshed {
			continue
		}
		// The CNI server refuses an ADD without these, but a record in the state directory may be
		// old or edited: a pod Envoy cannot serve is left out, not the node's whole snapshot.
		podKey := ServiceKey{Namespace: p.Namespace, Name: p.Name}
		if att.NetnsPath == "" {
			skip("Pod", podKey, "attachment.netnsPath", "", "want the pod's netns path (CNI_NETNS); the pod is not served")
			continue
		}
		if !slices.ContainsFunc(att.IPs, netip.Addr.IsValid) {
			skip("Pod", podKey, "attachment.ips", fmt.Sprint(att.IPs), "want an IP address; the pod is not served")
			continue
		}
		lp := &LocalPod{
			UID: string(p.UID), Namespace: p.Namespace, Name: p.Name,
			ServiceAccount: p.Spec.ServiceAccountName, ContainerID: att.ContainerID,
			NetnsPath: att.NetnsPath, IPs: slices.DeleteFunc(slices.Clone(att.IPs), func(a netip.Addr) bool { return !a.IsValid() }), Ready: podReady(p),
		}
		proto, err := ParseProtocol(p.Annotations[AnnotationPortProtocol])
		if err != nil {
			skip("Pod", ServiceKey{Namespace: p.Namespace, Name: p.Name}, "metadata.annotations["+AnnotationPortProtocol+"]",
				p.Annotations[AnnotationPortProtocol], err.Error()+"; HTTP is used")
			proto = ProtocolHTTP
		}
		lp.Protocol = proto
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				pp := proto
				if cp.Protocol == corev1.ProtocolUDP {
					pp = ProtocolUDP
				}
				lp.Ports = append(lp.Ports, PodPort{Name: cp.Name, Port: uint32(cp.ContainerPort), Protocol: pp})
			}
		}
		for _, s := range selectors {
			if s.key.Namespace == p.Namespace && s.sel.Matches(labels.Set(p.Labels)) {
				lp.Services = append(lp.Services, s.key)
			}
		}
		slices.SortFunc(lp.Services, ServiceKey.Compare)
		for _, k := range lp.Services {
			for _, sp := range byKey[k].Ports {
				if _, ok := lp.TargetPort(sp); !ok && sp.TargetPortName != "" {
					skip("Pod", podKey, "spec.containers[*].ports", sp.TargetPortName, fmt.Sprintf(
						"no container port of that name: not an endpoint of Service %s port %d (nor in its EndpointSlices)", k, sp.Port))
				}
			}
		}
		pods = append(pods, lp)
		podLabels[lp.UID] = p.Labels
	}
	routes := make([]Route, 0, len(in.HTTPRoutes)+len(in.GRPCRoutes))
	for _, r := range in.GRPCRoutes {
		routes = append(routes, GRPCRouteModel(r))
	}
	for _, r := range in.HTTPRoutes {
		routes = append(routes, HTTPRouteModel(r))
	}
	m := New(version, in.Cluster, in.MeshDomain, in.TrustDomain, in.Node, services, endpoints, pods)
	m.skipped = skipped
	m.imports = &ConfigImports{Selection: SelectProjections(in.Projections, in.Exports, in.ControlCluster)}
	imported, overridden := ImportRoutes(m.imports.Selection.Applied, routes, in.Exports)
	m.imports.Overridden = overridden
	var statuses []RouteStatus
	m.Routing, statuses = ResolveRoutes(m.byKey, append(slices.Clip(routes), imported...))
	m.routeStatuses = statuses[:len(routes)]
	m.imports.problems(imported, statuses[len(routes):])
	l4 := make([]Route, 0, len(in.Edge.TCPRoutes)+len(in.Edge.TLSRoutes)+len(in.Edge.UDPRoutes))
	for _, r := range in.Edge.TCPRoutes {
		l4 = append(l4, TCPRouteModel(r))
	}
	for _, r := range in.Edge.TLSRoutes {
		l4 = append(l4, TLSRouteModel(r))
	}
	for _, r := range in.Edge.UDPRoutes {
		l4 = append(l4, UDPRouteModel(r))
	}
	var l4st []RouteStatus
	m.L4Routing, l4st = ResolveL4Routes(m.byKey, l4)
	m.routeStatuses = append(m.routeStatuses, l4st...)
	assembleEdges(m, in, routes)
	m.authz = resolveAuthz(in.AuthorizationPolicies, func(k ServiceKey) bool {
		s := m.byKey[k]
		return s != nil && s.Local
	}, in.AuthzCache)
	m.Authz = SelectAuthz(m.authz, m.Pods, podLabels)
	m.Inbound = make(map[string]PodInbound)
	def := in.InboundDefault
	if def == MTLSUnset {
		def = MTLSStrict
	}
	for _, p := range m.Pods {
		// Only pods a policy decides: the others keep the node's own default (and their capture
		// rules are never rewritten for nothing).
		if ib := ResolveInbound(def, in.PeerAuthns, p.Namespace, podLabels[p.UID], m.Authz[p.UID]); ib.Policy != "" || ib.Mode != def ||
			len(ib.StrictPorts) > 0 || len(ib.PermissivePorts) > 0 {
			m.Inbound[p.UID] = ib
		}
	}
	return m
}

// badPort checks port i of a Service or ServiceImport against the ports kept so far. It returns
// the field, its value and why the port is left out of the model, or reason "" to keep it.
func badPort(i int, port int32, proto corev1.Protocol, kept []ServicePort) (field, value, reason string) {
	field = fmt.Sprintf("spec.ports[%d]", i)
	switch {
	case port < 1 || port > 65535:
		return field + ".port", strconv.Itoa(int(port)), "want 1-65535"
	case proto == corev1.ProtocolSCTP:
		return field + ".protocol", string(proto), "SCTP is not captured, so not meshed"
	case proto != corev1.ProtocolUDP && slices.ContainsFunc(kept, func(sp ServicePort) bool {
		return sp.Port == uint32(port) && sp.Protocol != ProtocolUDP
	}):
		// Two ports with one number would be two clusters with one name and two lane virtual
		// hosts with the same domains, which Envoy rejects for the whole route table.
		return field + ".port", strconv.Itoa(int(port)), "duplicate port: an earlier port has this number"
	}
	return "", "", ""
}

// endpointCounts reports whether e serves s in this cluster's model: endpoints of this cluster
// serve its local services, another cluster's only imported services that cluster exports.
func endpointCounts(s *Service, e *Endpoint, cluster string, exported map[ServiceKey]map[string]bool) bool {
	switch {
	case s == nil || (!s.Local && !s.Imported):
		return false
	case e.Cluster == cluster:
		return s.Local
	default:
		return s.Imported && exported[e.Service][e.Cluster]
	}
}

// resolvePorts fills a port's unknown target port and protocol from the registered endpoints'
// port of the same name (the agent registers each Service port under its name with its container
// port). For a named targetPort, or a port known only from a ServiceImport, endpoints may serve
// the port on different numbers (ServicePort.EndpointPort gives each its own): TargetPort is the
// number most endpoints registered, the lowest on a tie, and the protocol likewise the one most
// registered (the first in Protocol's string order on a tie). Neither depends on the order of
// eps, which follows the registry's listing and pod churn: a choice that flipped with it would
// change the port's Envoy clusters (their default SNI and transport sockets, so Envoy drains
// their connections) and every endpoint's EDS metadata for nothing.
func resolvePorts(s *Service, eps []Endpoint) {
	// Room for the usual few values, on the stack.
	ports, protos := make(tally[uint32], 0, 4), make(tally[Protocol], 0, 4)
	for i := range s.Ports {
		sp := &s.Ports[i]
		if sp.TargetPort == 0 || sp.Protocol == "" {
			ports, protos = ports[:0], protos[:0]
			for j := range eps {
				if ep, ok := portNamed(&eps[j], sp.Name); ok {
					ports, protos = ports.add(ep.Port), protos.add(ep.Protocol)
				}
			}
			if sp.TargetPort == 0 {
				sp.TargetPort = ports.most()
			}
			if sp.Protocol == "" {
				sp.Protocol = protos.most()
			}
		}
		if sp.Protocol == "" {
			sp.Protocol = ProtocolHTTP
		}
		if sp.TargetPort == 0 && !s.Local {
			sp.TargetPort = sp.Port
		}
	}
}

// portNamed returns e's first port registered under name.
func portNamed(e *Endpoint, name string) (EndpointPort, bool) {
	for _, p := range e.Ports {
		if p.Name == name {
			return p, true
		}
	}
	return EndpointPort{}, false
}

// tally counts the values of one port field over a service's endpoints. The distinct values are
// few (usually one), so a slice searched linearly beats a map at 100k endpoints.
type tally[K cmp.Ordered] []tallied[K]

// tallied is one value of a tally and how many endpoints registered it.
type tallied[K cmp.Ordered] struct {
	v K
	n int
}

// add returns t with v counted once more; the zero value (not registered) is not counted.
func (t tally[K]) add(v K) tally[K] {
	var zero K
	if v == zero {
		return t
	}
	for i := range t {
		if t[i].v == v {
			t[i].n++
			return t
		}
	}
	return append(t, tallied[K]{v, 1})
}

// most returns the value counted most often, the lowest on a tie; the zero value when none was.
func (t tally[K]) most() K {
	var best K
	bn := 0
	for _, c := range t {
		if c.n > bn || c.n == bn && c.v < best {
			best, bn = c.v, c.n
		}
	}
	return best
}

// portProtocol maps a Kubernetes port protocol and appProtocol to a Protocol; "" means "decide
// from the endpoints, else HTTP" (see resolvePorts). An appProtocol ParseProtocol does not know
// is passed to unknown and ignored.
func portProtocol(l4 corev1.Protocol, app *string, unknown func(v, reason string)) Protocol {
	if l4 == corev1.ProtocolUDP {
		return ProtocolUDP
	}
	if app != nil {
		p, err := ParseProtocol(*app)
		if err == nil {
			return p
		}
		unknown(*app, err.Error()+"; ignored: the protocol comes from the endpoints, else HTTP")
	}
	return ""
}

// parseMeshService parses the annotation aether.io/mesh-service ("<ns>/<svc>") of a
// <svc>-clusterset Service in namespace ns: the namespace must be ns (aether creates the
// clusterset Service beside the service it stands for) and the name a DNS label.
func parseMeshService(v, ns string) (ServiceKey, error) {
	n, name, ok := strings.Cut(v, "/")
	switch {
	case !ok:
		return ServiceKey{}, fmt.Errorf("want <namespace>/<service>")
	case n != ns:
		return ServiceKey{}, fmt.Errorf("want a service in namespace %q", ns)
	case len(validation.IsDNS1123Label(name)) > 0:
		return ServiceKey{}, fmt.Errorf("service name: %s", strings.Join(validation.IsDNS1123Label(name), "; "))
	}
	return ServiceKey{Namespace: ns, Name: name}, nil
}

// appendIPs appends the VIPs in ips to dst. "None" (a headless Service) and "" are no VIP;
// anything else that is not an IP address without a zone is passed to bad with its index.
func appendIPs(dst []netip.Addr, ips []string, bad func(i int, v, reason string)) []netip.Addr {
	for i, s := range ips {
		if s == "" || s == corev1.ClusterIPNone {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			bad(i, s, "want an IPv4 or IPv6 address")
			continue
		}
		dst = append(dst, a)
	}
	return dst
}

func dedupIPs(ips []netip.Addr) []netip.Addr {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, a := range ips {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
