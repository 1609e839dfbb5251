package xds

import (
	"strconv"

	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
)

// Fixed ports and addresses of the per-pod listeners (DESIGN.md, ports).
const (
	// CapturePort is the capture listener's port on 127.0.0.1 in the pod netns (the target of the
	// capture redirect).
	CapturePort = 15001
	// InboundPort is the inbound mTLS listener's port on the pod IP.
	InboundPort = 15008
	// LanePort is the explicit HTTP lane's port on 127.0.0.1 in the pod netns.
	LanePort = 18081
	// WaypointPort is the east-west tunnel listener's port on a node IP.
	WaypointPort = 15443
	// RuntimeLayerName is the RTDS resource holding the pods' per-listener connection caps
	// (Options.PodMaxConnections).
	RuntimeLayerName = "aether-listener-limits"
)

// Resource names. Clusters and their EDS resources are named "<svc>.<ns>.<meshDomain>:<port>"
// (the service port).
const (
	// LaneRouteName is the route configuration of every pod's explicit HTTP lane.
	LaneRouteName = "lane"
	// CaptureRouteName is the route configuration of every pod's capture HTTP chain: the
	// routes of the HTTP service ports' VIPs, "VIP:port".
	CaptureRouteName = "capture-http"
	// CaptureHeadlessRouteName is the route configuration of every pod's capture HTTP chain for
	// headless Services' pods: the routes "<pod_ip>:<port>" of the HTTP ports' endpoints in this
	// cluster. Served only while there are any (the chain exists only then), and kept apart from
	// CaptureRouteName so that a headless Service's endpoint change resends this table, not the
	// VIP routes of every service.
	CaptureHeadlessRouteName = "capture-http-headless"
	// DstHeader carries the original destination "VIP:port" from the capture HTTP connection
	// manager's early header mutation to route selection; it is removed before forwarding.
	DstHeader = "x-aether-original-dst"
	// captureHTTPChain names the capture listener's HTTP filter chain for VIPs (CaptureRouteName).
	captureHTTPChain = "http"
	// captureHeadlessChain names the capture listener's HTTP filter chain for headless Services'
	// pods (CaptureHeadlessRouteName); the listener has it only while some headless HTTP port has
	// an endpoint in this cluster.
	captureHeadlessChain = "http-headless"
	// TrustBundleSecret is the SDS validation context holding the trust domain's CA bundle.
	TrustBundleSecret = "trust-bundle"
	// CertMapperFilterStateKey is the filter-state key the upstream certificate mapper
	// (envoy.tls.upstream_certificate_mappers.filter_state_override) reads the client
	// certificate's secret name from; each pod listener sets it to the pod's SPIFFE ID.
	CertMapperFilterStateKey = "envoy.tls.certificate_mappers.on_demand_secret"
	// HeadlessFilterName is the ECDS resource (a set_filter_state listener filter) every capture
	// listener runs on the target ports of headless Services: it maps the restored destination
	// "<pod_ip>:<port>" of a headless endpoint in this cluster to its capture chain's name, in the
	// filter state DirectFilterStateKey, which the capture filter-chain matcher reads.
	HeadlessFilterName = "aether-headless"
	// DirectFilterStateKey is the filter-state key HeadlessFilterName sets.
	DirectFilterStateKey = "aether.direct"
)

// ClusterName returns the outbound EDS cluster name of a service port:
// "<svc>.<ns>.<meshDomain>:<port>".
func ClusterName(m *model.Mesh, k model.ServiceKey, port uint32) string {
	return m.FQDN(k) + ":" + strconv.FormatUint(uint64(port), 10)
}

// LocalClusterName returns the EDS cluster of a service port that holds this cluster's endpoints
// only: "local|<svc>.<ns>.<meshDomain>:<port>". Only a service that is local and imported has one
// (hasLocalCluster): a route's backendRef of kind Service (GAMMA or L4) means the Service's
// endpoints in this cluster (GEP-1748), while ClusterName holds every exporting cluster's, local
// ones first.
func LocalClusterName(m *model.Mesh, k model.ServiceKey, port uint32) string {
	return "local|" + ClusterName(m, k, port)
}

// mirrorClusterPrefix starts the names of mirror clusters (mirrorClusterName).
const mirrorClusterPrefix = "mirror|"

// mirrorClusterName is the cluster that carries GAMMA RequestMirror copies from the local pods
// of identity id (a SPIFFE ID) to the backend cluster target: "mirror|<id>|<target>", target's
// cluster with that identity's certificate fixed. Envoy gives a mirrored copy none of the
// caller's filter state, so the on-demand certificate selector of target itself cannot know whose
// certificate to present (envoyproxy/envoy#38894); the route names this cluster in a header
// instead (MirrorHeader).
func mirrorClusterName(id, target string) string { return mirrorClusterPrefix + id + "|" + target }

// MaxMirrors is the most RequestMirror filters one rule can have (model.MaxMirrorsPerRule), and
// so the number of MirrorHeader names.
const MaxMirrors = model.MaxMirrorsPerRule

// MirrorHeader is the request header the i-th mirror of a GAMMA route reads its cluster from
// (RequestMirrorPolicy.cluster_header): "x-aether-mirror-<i>", set by the route from the caller's
// identity (mirrorClusterName) over any value the client sent, and removed by the destination's
// inbound listener.
func MirrorHeader(i int) string { return "x-aether-mirror-" + strconv.Itoa(i) }

// mirrorHeaders are MirrorHeader(0) to MirrorHeader(MaxMirrors-1).
var mirrorHeaders = func() []string {
	out := make([]string, MaxMirrors)
	for i := range out {
		out[i] = MirrorHeader(i)
	}
	return out
}()

// DirectClusterName returns the ORIGINAL_DST cluster that carries connections made straight to
// the pods of a headless service's port (model.Service.Headless) on target port target:
// "direct|<svc>.<ns>.<meshDomain>:<port>|<target>".
func DirectClusterName(m *model.Mesh, k model.ServiceKey, port, target uint32) string {
	return "direct|" + ClusterName(m, k, port) + "|" + strconv.FormatUint(uint64(target), 10)
}

// WaypointSNI returns the exact SNI of waypoint traffic to a target port of a service:
// "<port>.<svc>.<ns>.<meshDomain>" (DESIGN.md, data flow 8; tunnel.SNI).
func WaypointSNI(m *model.Mesh, k model.ServiceKey, targetPort uint32) string {
	return tunnel.SNI(m, k, targetPort)
}

func captureListenerName(p *model.LocalPod) string { return "capture|" + p.Namespace + "/" + p.Name }
func laneListenerName(p *model.LocalPod) string    { return "lane|" + p.Namespace + "/" + p.Name }
func inboundListenerName(p *model.LocalPod) string { return "inbound|" + p.Namespace + "/" + p.Name }

// PassthroughClusterName returns the ORIGINAL_DST cluster that carries pod p's connections to
// destinations outside the mesh from inside p's netns: "passthrough|<ns>/<name>".
func PassthroughClusterName(p *model.LocalPod) string {
	return "passthrough|" + p.Namespace + "/" + p.Name
}

// inboundClusterName names the cluster that carries inbound traffic for one target port of one
// local pod to the application, from inside the pod's netns.
func inboundClusterName(p *model.LocalPod, port uint32) string {
	return "inbound|" + p.Namespace + "/" + p.Name + ":" + strconv.FormatUint(uint64(port), 10)
}

// PodListenerNames returns the names of the listeners the Builder may make for pod p: capture,
// explicit lane and inbound.
func PodListenerNames(p *model.LocalPod) []string {
	return []string{captureListenerName(p), laneListenerName(p), inboundListenerName(p)}
}
