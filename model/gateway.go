package model

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Edge Gateways (north-south, docs/gateway.md): the Gateways of GatewayClasses whose
// spec.controllerName is GatewayControllerName, each served by an edge Envoy that aether
// provisions (a Deployment and a Service in the Gateway's namespace) and that the node agent of
// the edge pod's node programs over xDS. The types here are plain values: ResolveGateways makes
// them from the cluster's Gateway API objects; the registrar writes the statuses, the agent's
// xDS builder serves the EdgeGateways.

// Route kinds served on Gateway listeners (and, for the L4 kinds, in the mesh), Gateway API v1.6.3
// (gateway.networking.k8s.io/v1).
const (
	KindTCPRoute RouteKind = "TCPRoute"
	KindTLSRoute RouteKind = "TLSRoute"
	KindUDPRoute RouteKind = "UDPRoute"
)

// ListenerProtocol is Listener.protocol (Gateway API ProtocolType) as aether serves it.
type ListenerProtocol string

// The listener protocols aether serves (Gateway API v1.6.3, "Listener.protocol": core HTTP, HTTPS,
// TLS, TCP, UDP).
const (
	ListenerHTTP  ListenerProtocol = "HTTP"
	ListenerHTTPS ListenerProtocol = "HTTPS"
	ListenerTLS   ListenerProtocol = "TLS"
	ListenerTCP   ListenerProtocol = "TCP"
	ListenerUDP   ListenerProtocol = "UDP"
)

// TLSMode is GatewayTLSConfig.mode: Terminate or Passthrough.
type TLSMode string

// TLS modes (GatewayTLSConfig.mode).
const (
	TLSTerminate   TLSMode = "Terminate"
	TLSPassthrough TLSMode = "Passthrough"
)

// GatewayKey names a Gateway.
type GatewayKey struct {
	Namespace string
	Name      string
}

// String returns "<namespace>/<name>".
func (k GatewayKey) String() string { return k.Namespace + "/" + k.Name }

// SecretKey names a Secret (a listener's certificateRef).
type SecretKey struct {
	Namespace string
	Name      string
}

// String returns "<namespace>/<name>".
func (k SecretKey) String() string { return k.Namespace + "/" + k.Name }

// GatewayParentRef is one parentRef of a route whose kind is Gateway (group
// gateway.networking.k8s.io, the parentRef default).
type GatewayParentRef struct {
	// Index is the parentRef's index in spec.parentRefs.
	Index int
	// Gateway is the parent (its namespace defaults to the route's).
	Gateway GatewayKey
	// SectionName is parentRef.sectionName, a listener name ("" when unset: every listener).
	SectionName string
	// Port is parentRef.port, 0 when unset.
	Port uint32
}

// Certificate is one TLS certificate a Terminate listener presents: its certificateRef and, once
// the registrar has published it for the agents (docs/gateway.md, "Certificates"), the PEM data.
type Certificate struct {
	Ref SecretKey
	// CertPEM and KeyPEM are the Secret's tls.crt and tls.key; empty in the registrar's view
	// (which only checks them) and while the published copy has not reached the agent.
	CertPEM, KeyPEM []byte
	// DNSNames are the certificate's SAN DNS names (lower case), for SNI selection among a
	// listener's certificates.
	DNSNames []string
}

// CertificateState is what the resolver knows about one certificateRef's Secret.
type CertificateState struct {
	// Problem says why the Secret cannot be used ("" when it can): missing, not of type
	// kubernetes.io/tls, no tls.crt/tls.key, a certificate and key that do not parse or do not
	// match. It becomes the listener's ResolvedRefs=False InvalidCertificateRef message.
	Problem string
	// Certificate is the usable certificate (Problem "").
	Certificate Certificate
}

// NamespaceRef is a reference a grant may allow: from kind (route or Gateway) in namespace
// From, to an object of group/kind To (name ToName, "" for any) in namespace ToNamespace.
type NamespaceRef struct {
	FromGroup, FromKind, FromNamespace string
	ToGroup, ToKind, ToNamespace       string
	ToName                             string
}

// GatewayInputs are what ResolveGateways reads: plain values the caller builds from its
// informers (the registrar and the agents read the same objects, so both compute the same
// EdgeGateways and statuses).
type GatewayInputs struct {
	// Classes are the GatewayClasses by name with their controllerName.
	Classes map[string]string
	// Gateways are the cluster's Gateways (every class; only aether's classes are resolved).
	Gateways []GatewaySpec
	// Routes are the cluster's routes of every kind (HTTPRoute, GRPCRoute, TCPRoute, TLSRoute,
	// UDPRoute) with their Gateway parentRefs (Route.GatewayParents).
	Routes []Route
	// NamespaceLabels are the labels of every namespace (allowedRoutes.namespaces.selector).
	NamespaceLabels map[string]map[string]string
	// Grants are the ReferenceGrants of the cluster, as the references they allow
	// (ReferenceGrantRefs).
	Grants []NamespaceRef
	// Certificates are the certificateRefs' Secrets as the caller found them; a ref not in the
	// map is a Secret that does not exist.
	Certificates map[SecretKey]CertificateState
	// Services are the mesh model's services by key (backendRefs resolve against them, as
	// ResolveRoutes does).
	Services map[ServiceKey]*Service
	// CrossNamespaceCertificates lets a listener use a certificateRef in another namespace when a
	// ReferenceGrant allows it. Off by default: the edge pods run in the Gateway's namespace and
	// get the listener's private key, so whoever may run pods there as the edge's
	// ServiceAccount could read a Secret of another namespace (docs/gateway.md, "Security").
	CrossNamespaceCertificates bool
	// InfrastructureKeys is the registrar's --gateway-infrastructure-keys
	// (InfrastructureKeyAllowed): an accepted Gateway's Accepted message names the
	// spec.infrastructure labels and annotations not in it, which its edge objects do not get.
	InfrastructureKeys []string
}

// GatewaySpec is a Gateway as ResolveGateways reads it (GatewaySpecModel makes one from the
// Kubernetes object).
type GatewaySpec struct {
	Key        GatewayKey
	UID        string
	Generation int64
	Created    time.Time
	Class      string
	Listeners  []ListenerSpec
	// Addresses are spec.addresses values of type IPAddress (others are in Unsupported).
	Addresses []string
	// InfrastructureLabels and InfrastructureAnnotations are the keys of spec.infrastructure's
	// labels and annotations, sorted.
	InfrastructureLabels, InfrastructureAnnotations []string
	// Unsupported lists what the Gateway asks for that aether does not do, "<field>: <reason>"
	// each (spec.infrastructure parametersRef, an address type other than IPAddress, ...).
	Unsupported []string
}

// ListenerSpec is one spec.listeners entry.
type ListenerSpec struct {
	Name     string
	Port     uint32
	Protocol string // as written: an unknown protocol is reported, not served
	Hostname string // "" matches every host
	TLS      *ListenerTLSSpec
	// AllowedRoutes is allowedRoutes with the API defaults applied (namespaces From: Same).
	AllowedRoutes AllowedRoutes
	// Unsupported lists what the listener asks for that aether does not do or cannot read,
	// "<field>: <reason>" each (a namespace selector that does not convert, tls.options): the
	// listener is not accepted (UnsupportedValue).
	Unsupported []string
}

// ListenerTLSSpec is a listener's tls block.
type ListenerTLSSpec struct {
	Mode            TLSMode
	CertificateRefs []CertificateRef
}

// CertificateRef is one tls.certificateRefs entry as written (group "" and kind Secret are the
// only ones served).
type CertificateRef struct {
	Group, Kind string
	Ref         SecretKey
}

// AllowedRoutes is Listener.allowedRoutes.
type AllowedRoutes struct {
	// From is All, Same (the default) or Selector.
	From string
	// Selector is the namespace selector for From Selector, as a label selector string
	// (metav1.FormatLabelSelector) that labels.Parse accepts; "" selects every namespace.
	Selector string
	// Kinds are the route kinds allowed (group/kind as written); empty means the kinds the
	// listener's protocol supports.
	Kinds []RouteGroupKind
}

// RouteGroupKind is one allowedRoutes.kinds entry.
type RouteGroupKind struct{ Group, Kind string }

// EdgeGateway is one Gateway as its edge Envoy serves it: the listeners that are programmed,
// grouped by port, and the routes bound to each.
type EdgeGateway struct {
	Key GatewayKey
	UID string
	// ServiceAccount is the name of the ServiceAccount the edge pods run as
	// (EdgeServiceAccountName): the node agent serves this Gateway's configuration only to pods
	// of its namespace running as it, and their SPIFFE ID is the edge's identity.
	ServiceAccount string
	Ports          []EdgePort
}

// EdgePort is one port of an edge Gateway: every programmed TCP-based listener on it shares its
// protocol family (HTTP and HTTPS do not share a port; TLS and HTTPS may, told apart by SNI; a
// TCP listener has its port alone), and at most one UDP listener may use the same port number
// (a separate socket).
type EdgePort struct {
	Port uint32
	// Listeners are the port's programmed listeners, most specific hostname first (exact, then
	// longer wildcard suffixes, then no hostname).
	Listeners []EdgeListener
}

// EdgeListener is one programmed listener.
type EdgeListener struct {
	Name     string
	Protocol ListenerProtocol
	// Hostname is the listener's hostname ("" for any).
	Hostname string
	// TLSMode is Terminate for HTTPS, Terminate or Passthrough for TLS, "" otherwise.
	TLSMode TLSMode
	// Certificates are the resolved certificates of a Terminate listener, in certificateRefs
	// order (the first is the default when SNI matches none of their names).
	Certificates []Certificate
	// Hosts are the HTTP virtual hosts (HTTP, HTTPS): one per distinct hostname the bound
	// HTTPRoutes and GRPCRoutes intersect with the listener's hostname, most specific first,
	// except the hostnames a more specific programmed listener of the port covers (listener
	// isolation: those requests are that listener's, and get 404 there when none of its routes
	// matches).
	Hosts []EdgeHost
	// L4 are the bound TCPRoutes (TCP; TLS Terminate), TLSRoutes (TLS) or UDPRoutes (UDP), in
	// precedence order (oldest first, then namespace/name). A TCP or UDP listener serves the
	// first only (the others are Accepted, as the spec's conformance tests ask). On a TLS
	// listener a TLSRoute serves its Hostnames and a TCPRoute (Terminate) every SNI name that no
	// TLSRoute lists.
	L4 []EdgeL4Route
}

// EdgeHost is one HTTP virtual host of a listener.
type EdgeHost struct {
	// Hostname is the intersection of the listener's hostname and a route's ("*" when both
	// match every host; a leading "*." is a wildcard).
	Hostname string
	// Entries are the served matches of every route bound with this hostname, in the
	// precedence order of HTTPRouteRule.matches (as ResolveRoutes orders a frontend's), then
	// those of the routes bound with a wildcard hostname covering it, the less specific last.
	Entries []RouteEntry
}

// EdgeL4Route is one L4 route bound to a listener.
type EdgeL4Route struct {
	Route RouteRef
	// Hostnames are the SNI names of a TLSRoute: its hostnames intersected with the listener's,
	// less those an older TLSRoute of the listener has and those a more specific listener of the
	// port covers ("*" is any name; a TLSRoute left with none is not listed); empty for TCPRoutes
	// and UDPRoutes.
	Hostnames []string
	// Backends are the route's first rule's backendRefs, resolved (Invalid set).
	Backends []BackendRef
}

// GatewayStatus is what ResolveGateways found for one of aether's Gateways.
type GatewayStatus struct {
	Key        GatewayKey
	Generation int64
	Accepted   Condition
	Programmed Condition
	Listeners  []ListenerStatus
}

// ListenerStatus is one listener's status entry (GatewayStatus.listeners).
type ListenerStatus struct {
	Name           string
	SupportedKinds []RouteGroupKind
	AttachedRoutes int32
	Accepted       Condition
	Programmed     Condition
	ResolvedRefs   Condition
	Conflicted     Condition
	// OverlappingTLSConfig is set (Status true, reason OverlappingHostnames) on a Terminate
	// listener whose hostname overlaps another Terminate listener's on the same port; nil
	// otherwise (a negative-polarity condition, never written False).
	OverlappingTLSConfig *Condition
}

// GatewayParentStatus is the status of one Gateway parentRef of a route.
type GatewayParentStatus struct {
	Index        int
	Accepted     Condition
	ResolvedRefs Condition
	// PartiallyInvalid is set when some rules were dropped ("Dropped Rule(s): ..."), nil
	// otherwise.
	PartiallyInvalid *Condition
}

// GatewayRouteStatus is what ResolveGateways found for one route's Gateway parentRefs.
type GatewayRouteStatus struct {
	Route      RouteRef
	Generation int64
	Parents    []GatewayParentStatus
}

// EdgeReservedPorts are the TCP ports the edge pod uses itself: 15010, where the node agent
// serves the edge Envoy's xDS on 127.0.0.1, and 15090, Envoy's metrics and readiness listener. A
// TCP-based listener on one of them is refused (PortUnavailable).
var EdgeReservedPorts = []uint32{15010, 15090}

// EdgeServiceAccountName is the ServiceAccount aether provisions for a Gateway's edge pods.
func EdgeServiceAccountName(gateway string) string { return gateway + "-aether-edge" }

// Published certificates (docs/gateway.md, "Certificates"): the registrar copies every usable
// certificateRef of an accepted Terminate listener into its own namespace, as a Secret of type
// kubernetes.io/tls named EdgeCertificateSecretName(ref), labelled LabelEdgeCertificate "true"
// (and LabelManagedBy) and annotated AnnotationCertificateRef "<namespace>/<name>" of the
// original; agents, which may not read Secrets cluster-wide, watch only these.
const (
	LabelEdgeCertificate     = "aether.io/edge-certificate"
	AnnotationCertificateRef = "aether.io/certificate-ref"
)

// EdgeCertificateSecretName returns the name of the published copy of certificateRef ref:
// "edge-cert-" and the first 16 hex digits of the SHA-256 of "<namespace>/<name>".
func EdgeCertificateSecretName(ref SecretKey) string {
	sum := sha256.Sum256([]byte(ref.String()))
	return "edge-cert-" + hex.EncodeToString(sum[:])[:16]
}
