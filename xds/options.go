package xds

import (
	"fmt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"net/netip"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
)

// Options tune the builders. The zero value is usable.
type Options struct {
	// ConnectTimeout is the upstream connect timeout of every cluster (default 5 s).
	ConnectTimeout time.Duration
	// UpstreamNetns, when set, is a netns path in which Envoy opens its outbound upstream sockets
	// (Cluster.upstream_bind_config.source_address.network_namespace_filepath). Production leaves
	// it empty (Envoy runs in the host netns); the local substrate and tests, where a "node" is a
	// namespace of its own, set it to the node's netns.
	UpstreamNetns string
	// PeerTrustDomains are the trust domains of the clusterset's other clusters, besides the
	// mesh's own, when each cluster has its own (SPIFFE federation): their callers are admitted
	// by the pods' inbound listeners, their bundles go to the SPIFFE validator, and namespace and
	// service account sources of authorization rules match in them too. A trust domain the
	// identity provider has a bundle of but that is not listed here (a partner the SPIRE server
	// federates with) is not trusted by the node proxy.
	PeerTrustDomains []string
	// CertSelection picks how an outbound cluster presents the source pod's certificate
	// (default CertSelector).
	CertSelection CertSelection
	// EastWestWaypoint sends traffic to endpoints of other clusters through their node's
	// east-west waypoint (DESIGN.md, data flow 8): one EDS entry per remote node at
	// node_ip:15443, weighted by that node's healthy endpoints, with endpoint metadata
	// envoy.transport_socket_match {waypoint: true}, which selects a TLS socket whose SNI is
	// "<port>.<svc>.<ns>.<meshDomain>" (same client certificate, same SAN pin). Where a named
	// targetPort (or an imported port) is a different number in the node's pods, the entry
	// carries one of them (waypointPort) and the metadata {waypoint: true, port: "<port>"}
	// selects that port's SNI; the node's pods on other numbers get no traffic through it.
	// Remote endpoints without a node IP are left out. Only with CertSelector: Build and
	// NewServer refuse it with CertMatcher.
	EastWestWaypoint bool
	// HandshakeTimeout bounds how long a downstream connection to a listener that terminates or
	// inspects TLS may take first to send its whole ClientHello (Listener.listener_filters_timeout,
	// which tls_inspector waits under; Envoy's default is 15 s) and then to complete the TLS
	// handshake (FilterChain.transport_socket_connect_timeout; Envoy's default is none): the
	// pods' inbound listeners (pod_ip:15008) and, with EastWestWaypoint, the tunnel listener
	// (node_ip:15443, tunnel.Options.HandshakeTimeout; it forwards the handshake to a pod's
	// inbound listener, whose timeout then closes both legs). A connection still short of either
	// is closed and counted (listener.<addr>.downstream_pre_cx_timeout,
	// downstream_cx_transport_socket_connect_timeout). Zero or less means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// BypassMark is the SO_MARK (SocketOption SOL_SOCKET/SO_MARK, STATE_PREBIND) of the
	// upstream sockets each pod's passthrough cluster opens inside the pod's netns; the pod's
	// capture rules must let it through (capture.Config.BypassMark), or a passthrough connection
	// loops back into the capture listener. Zero means capture.DefaultBypassMark.
	BypassMark uint32
	// PodMaxConnections caps the downstream connections of each of a pod's listeners (its
	// capture, lane and inbound listeners), so one pod cannot take the node Envoy's share of
	// others: a connection beyond the cap is closed at accept and counted
	// (listener.<addr>.downstream_cx_overflow). Envoy reads per-listener caps from its runtime
	// (envoy.resource_limits.listener.<name>.connection_limit), and pods' listeners come and go,
	// so the builder serves them as the RTDS layer RuntimeLayerName, which the bootstrap must
	// name (envoy.BootstrapConfig.RuntimeLayer). Zero means no per-pod cap (and no layer).
	PodMaxConnections uint64
	// UDPHeld, when set, returns routed UDP frontends whose capture redirects may still be
	// installed in pods although the model no longer routes them (the agent removes a redirect
	// before the listener it points at, docs/capture.md): the node keeps its UDP listener of
	// such a frontend (on the frontend's local port, to the route's backends as they were) until
	// UDPHeld stops returning it. Called once per build; nil holds nothing.
	UDPHeld func() []model.UDPFrontend
	// HostIP and HostIPv6 are the node's addresses the pods' capture DNATs routed UDP
	// frontends to (capture.Config.HostIP, HOST_IP): the node Envoy's UDP listeners bind
	// there (in UpstreamNetns). A family without its address has no routed UDP frontends
	// (UDPFrontends).
	HostIP, HostIPv6 netip.Addr

	// passthroughFromNode builds the passthrough the way it was before it moved into the pods'
	// netns (sharedPassthroughCluster): only the passthrough benchmarks set it, for their
	// "before" side.
	passthroughFromNode bool
}

func (o Options) bypassMark() uint32 {
	if o.BypassMark == 0 {
		return capture.DefaultBypassMark
	}
	return o.BypassMark
}

// DefaultHandshakeTimeout is Options.HandshakeTimeout's default, 10 s (docs/node-proxy.md says
// why).
const DefaultHandshakeTimeout = tunnel.DefaultHandshakeTimeout

// CertSelection is the mechanism that picks the source pod's client certificate per upstream
// connection (docs/node-proxy.md compares them).
type CertSelection int

const (
	// CertSelector is one TLS context per cluster whose certificate the on-demand certificate
	// selector (envoy.tls.certificate_selectors.on_demand_secret) fetches over SDS, named by the
	// downstream filter state CertMapperFilterStateKey (Envoy 1.40, #42477).
	CertSelector CertSelection = iota
	// CertMatcher is Cluster.transport_socket_matcher on the same filter state, choosing among
	// one TLS transport socket per local identity in every cluster (#41151): identities x
	// clusters TLS contexts.
	CertMatcher
)

// String names the mechanism as its Go constant ("CertSelector", "CertMatcher"), or
// "CertSelection(<n>)" for a value that is neither.
func (c CertSelection) String() string {
	switch c {
	case CertSelector:
		return "CertSelector"
	case CertMatcher:
		return "CertMatcher"
	}
	return "CertSelection(" + strconv.Itoa(int(c)) + ")"
}

// check refuses option values and combinations the builders do not implement: a CertSelection
// that is neither CertSelector nor CertMatcher, and EastWestWaypoint with CertMatcher. The
// waypoint's transport socket (SNI "<port>.<svc>.<ns>.<meshDomain>", chosen by the endpoint
// metadata envoy.transport_socket_match {waypoint: true}) exists only beside the certificate
// selector's single TLS context; CertMatcher's Cluster.transport_socket_matcher picks among one
// socket per local identity and would need a second set per identity for the waypoint, so
// instead of silently sending remote endpoints to pod IPs the combination is an error.
func (o Options) check() error {
	switch o.CertSelection {
	case CertSelector, CertMatcher:
	default:
		return fmt.Errorf("check options: CertSelection %s: want CertSelector or CertMatcher", o.CertSelection)
	}
	if o.EastWestWaypoint && o.CertSelection != CertSelector {
		return fmt.Errorf("check options: EastWestWaypoint needs CertSelection CertSelector, not %s: the waypoint transport socket is built only for the certificate selector", o.CertSelection)
	}
	for _, td := range o.PeerTrustDomains {
		if _, err := spiffeid.TrustDomainFromString(td); err != nil {
			return fmt.Errorf("check options: PeerTrustDomains %q: %w", td, err)
		}
	}
	return nil
}

// handshakeTimeout is HandshakeTimeout as a proto duration, DefaultHandshakeTimeout when it is zero
// or less.
func (o Options) handshakeTimeout() *durationpb.Duration {
	if o.HandshakeTimeout <= 0 {
		return durationpb.New(DefaultHandshakeTimeout)
	}
	return durationpb.New(o.HandshakeTimeout)
}

// connectTimeout is Cluster.connect_timeout of every cluster: ConnectTimeout, or 5 s when it is
// zero or less (xdsproto.ConnectTimeout).
func (o Options) connectTimeout() *durationpb.Duration {
	return xdsproto.ConnectTimeout(o.ConnectTimeout)
}

// viaWaypoint reports whether other clusters' endpoints are reached through their node's east-west
// waypoint: EastWestWaypoint, which only CertSelector implements (check refuses it with
// CertMatcher).
func (o Options) viaWaypoint() bool { return o.EastWestWaypoint && o.CertSelection == CertSelector }
