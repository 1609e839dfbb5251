package xds

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	xdscore "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tsinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/transport_socket/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// outboundCluster is the EDS cluster name (ClusterName or LocalClusterName) of one service port,
// over mTLS to its endpoints (upstreamSockets): SNI "<targetPort>", the peer pinned to peers (the
// service's endpoints' SPIFFE IDs), one more transport socket for each of others
// (otherTargetPorts) and, with EastWestWaypoint, the waypoint's.
func (b *builder) outboundCluster(name string, s *model.Service, sp model.ServicePort, peers []string, others otherPorts) (*clusterv3.Cluster, error) {
	c := xdsproto.EDSCluster(name, b.opts.ConnectTimeout, b.opts.UpstreamNetns)
	if err := b.upstreamSockets(c, s.Key, sp.TargetPort, peers, others, b.opts.EastWestWaypoint); err != nil {
		return nil, fmt.Errorf("build cluster %s: %w", name, err)
	}
	if err := setUpstreamProtocol(c, sp.Protocol); err != nil {
		return nil, err
	}
	return c, nil
}

// upstreamSockets gives c, a cluster to service k's endpoints on target port target, its
// transport sockets, each pinning the peer to the endpoints' SPIFFE IDs peers. With CertMatcher,
// those of addSocketMatcher (one per local identity, and per direct port of others). With
// CertSelector, the selector's socket (SNI "<target>") and, in transport_socket_matches, with
// waypoint one socket per waypoint port of others (SNI WaypointSNI of that port, match
// {waypoint: true, port: "<port>"}) and the waypoint socket (WaypointSNI of target, match
// {waypoint: true}), then one socket per direct port of others (SNI "<port>", match
// {port: "<port>"}).
func (b *builder) upstreamSockets(c *clusterv3.Cluster, k model.ServiceKey, target uint32, peers []string, others otherPorts, waypoint bool) error {
	sni := strconv.FormatUint(uint64(target), 10)
	if b.opts.CertSelection == CertMatcher {
		return addSocketMatcher(c, localIDs(b.m), sni, peers, others.direct)
	}
	pin := upstreamPin(peers, b.m.TrustDomain, k.Namespace)
	var err error
	if c.TransportSocket, err = upstreamTLS(sni, b.selector, pin); err != nil {
		return err
	}
	add := func(name, socketSNI string, match map[string]*structpb.Value) error {
		ts, err := upstreamTLS(socketSNI, b.selector, pin)
		if err != nil {
			return err
		}
		c.TransportSocketMatches = append(c.TransportSocketMatches, &clusterv3.Cluster_TransportSocketMatch{
			Name: name, Match: &structpb.Struct{Fields: match}, TransportSocket: ts,
		})
		return nil
	}
	if waypoint {
		// Envoy picks the first transport_socket_matches entry whose match is a subset of the
		// endpoint's envoy.transport_socket_match metadata: a waypoint endpoint of another
		// target port carries {waypoint: true, port: "<port>"}, so its entry comes before the
		// plain waypoint one and the direct "port-<port>" ones.
		for _, p := range others.waypoint {
			ps := strconv.FormatUint(uint64(p), 10)
			if err := add("waypoint-"+ps, WaypointSNI(b.m, k, p), map[string]*structpb.Value{
				"waypoint": structpb.NewBoolValue(true), portMatchKey: structpb.NewStringValue(ps)}); err != nil {
				return err
			}
		}
		if err := add("waypoint", WaypointSNI(b.m, k, target), map[string]*structpb.Value{"waypoint": structpb.NewBoolValue(true)}); err != nil {
			return err
		}
	}
	for _, p := range others.direct {
		ps := strconv.FormatUint(uint64(p), 10)
		if err := add("port-"+ps, ps, map[string]*structpb.Value{portMatchKey: structpb.NewStringValue(ps)}); err != nil {
			return err
		}
	}
	return nil
}

// addSocketMatcher gives c, a cluster with CertMatcher, its default transport socket (SNI sni, no
// client certificate: the peer refuses it), one named TLS socket per local identity of ids and a
// transport_socket_matcher on the shared filter state CertMapperFilterStateKey that picks the
// caller's; every socket pins the peer to peers (peerSANs). With other target ports others
// (otherTargetPorts), each identity also gets one socket per such port, and its match is a nested
// matcher on the endpoint's metadata envoy.transport_socket_match.port (EndpointMetadataInput)
// that picks it, the SNI-sni socket when the endpoint has none.
func addSocketMatcher(c *clusterv3.Cluster, ids []string, sni string, peers []string, others []uint32) error {
	pin := peerSANs(peers)
	var err error
	if c.TransportSocket, err = upstreamTLSFor(sni, "", pin); err != nil {
		return err
	}
	m := map[string]*xdsmatcher.Matcher_OnMatch{}
	for i, id := range ids {
		name := "id" + strconv.Itoa(i)
		ts, err := upstreamTLSFor(sni, id, pin)
		if err != nil {
			return err
		}
		c.TransportSocketMatches = append(c.TransportSocketMatches, &clusterv3.Cluster_TransportSocketMatch{Name: name, TransportSocket: ts})
		a, err := socketAction(name)
		if err != nil {
			return err
		}
		m[id] = a
		if len(others) == 0 {
			continue
		}
		byPort := map[string]*xdsmatcher.Matcher_OnMatch{}
		for _, p := range others {
			ps := strconv.FormatUint(uint64(p), 10)
			pname := name + "|" + ps
			pts, err := upstreamTLSFor(ps, id, pin)
			if err != nil {
				return err
			}
			c.TransportSocketMatches = append(c.TransportSocketMatches, &clusterv3.Cluster_TransportSocketMatch{Name: pname, TransportSocket: pts})
			if byPort[ps], err = socketAction(pname); err != nil {
				return err
			}
		}
		input, err := xdsproto.ToAny(&tsinputsv3.EndpointMetadataInput{Filter: "envoy.transport_socket_match",
			Path: []*tsinputsv3.EndpointMetadataInput_PathSegment{{Segment: &tsinputsv3.EndpointMetadataInput_PathSegment_Key{Key: portMatchKey}}}})
		if err != nil {
			return err
		}
		m[id] = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: &xdsmatcher.Matcher{
			MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
				Input:    &xdscore.TypedExtensionConfig{Name: "endpoint-port", TypedConfig: input},
				TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: byPort}},
			}},
			OnNoMatch: a,
		}}}
	}
	if len(m) == 0 {
		return nil
	}
	input, err := xdsproto.ToAny(&tsinputsv3.FilterStateInput{Key: CertMapperFilterStateKey})
	if err != nil {
		return err
	}
	c.TransportSocketMatcher = &xdsmatcher.Matcher{MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
		Input:    &xdscore.TypedExtensionConfig{Name: "source-identity", TypedConfig: input},
		TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: m}},
	}}}
	return nil
}

// socketAction is the matcher action that picks the transport socket named name.
func socketAction(name string) (*xdsmatcher.Matcher_OnMatch, error) {
	a, err := xdsproto.ToAny(&tsinputsv3.TransportSocketNameAction{Name: name})
	if err != nil {
		return nil, err
	}
	return &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{Action: &xdscore.TypedExtensionConfig{Name: name, TypedConfig: a}}}, nil
}

// directCluster is the ORIGINAL_DST cluster of directEntries: the upstream host is the address
// the client dialled (restored by original_dst), its port replaced by InboundPort
// (Cluster.original_dst_lb_config.upstream_port_override), with the same upstream mTLS as the
// service's EDS clusters (upstreamSockets: pinned to peers, no waypoint) and SNI "<target>".
func (b *builder) directCluster(s *model.Service, sp model.ServicePort, target uint32, peers []string) (*clusterv3.Cluster, error) {
	name := DirectClusterName(b.m, s.Key, sp.Port, target)
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		LbConfig: &clusterv3.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: &clusterv3.Cluster_OriginalDstLbConfig{
			UpstreamPortOverride: wrapperspb.UInt32(InboundPort),
		}},
		ConnectTimeout:     b.opts.connectTimeout(),
		UpstreamBindConfig: xdsproto.UpstreamBind(b.opts.UpstreamNetns),
	}
	if err := b.upstreamSockets(c, s.Key, target, peers, otherPorts{}, false); err != nil {
		return nil, fmt.Errorf("build cluster %s: %w", name, err)
	}
	if err := setUpstreamProtocol(c, sp.Protocol); err != nil {
		return nil, err
	}
	return c, nil
}

// sharedPassthroughName and sharedPassthroughCluster are the passthrough as it was before it
// moved into the pods' netns: one ORIGINAL_DST cluster for every pod, its sockets opened in
// UpstreamNetns (the node's netns). Only with Options.passthroughFromNode, which only
// BenchmarkPassthroughLatency and BenchmarkPassthroughClusterCost set, for their "before" side.
const sharedPassthroughName = "passthrough"

func sharedPassthroughCluster(opts Options) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 sharedPassthroughName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		ConnectTimeout:       xdsproto.ConnectTimeout(opts.ConnectTimeout),
		UpstreamBindConfig:   xdsproto.UpstreamBind(opts.UpstreamNetns),
	}
}

// Linux's SOL_SOCKET and SO_MARK (asm-generic/socket.h): the option is Envoy's, which runs on
// Linux, whatever the agent's build target.
const (
	linuxSOLSocket = 1
	linuxSOMark    = 36
)

// passthroughCluster is pod p's ORIGINAL_DST cluster PassthroughClusterName(p), where its capture
// listener's default chain sends connections to destinations outside the mesh: the upstream is
// the address the application dialled, and the socket is opened inside the pod's netns
// (Cluster.upstream_bind_config: source_address 0.0.0.0:0 or [::]:0 with
// network_namespace_filepath, the other family in extra_source_addresses when the pod has both)
// with SO_MARK Options.BypassMark (STATE_PREBIND), which the pod's capture lets through. So the
// peer sees the pod's own address, as without a mesh, and the node's addresses, which strict mode
// trusts for the kubelet's probes, never carry a pod's passthrough (docs/security.md). The netns
// is opened per connection, so a vanished netns fails that connection, not the configuration.
func passthroughCluster(p *model.LocalPod, opts Options) *clusterv3.Cluster {
	var v4, v6 bool
	for _, ip := range p.IPs {
		v4, v6 = v4 || ip.Is4(), v6 || ip.Is6()
	}
	wildcard := func(addr string) *core.SocketAddress {
		return &core.SocketAddress{Address: addr, PortSpecifier: &core.SocketAddress_PortValue{PortValue: 0}, NetworkNamespaceFilepath: p.NetnsPath}
	}
	bind := &core.BindConfig{SocketOptions: []*core.SocketOption{{
		Description: "aether bypass mark", Level: linuxSOLSocket, Name: linuxSOMark,
		Value: &core.SocketOption_IntValue{IntValue: int64(opts.bypassMark())}, State: core.SocketOption_STATE_PREBIND,
	}}}
	switch {
	case v6 && !v4:
		bind.SourceAddress = wildcard("::")
	default:
		bind.SourceAddress = wildcard("0.0.0.0")
		if v6 {
			bind.ExtraSourceAddresses = []*core.ExtraSourceAddress{{Address: wildcard("::")}}
		}
	}
	return &clusterv3.Cluster{
		Name:                 PassthroughClusterName(p),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		ConnectTimeout:       xdsproto.ConnectTimeout(opts.ConnectTimeout),
		UpstreamBindConfig:   bind,
	}
}

// inboundCluster reaches one application port of a local pod at 127.0.0.1:<port> from inside the
// pod's netns (Cluster.upstream_bind_config with network_namespace_filepath; an endpoint address
// may not carry a namespace in Envoy 1.40). Applications bound to the pod's loopback or to the
// wildcard address are both reached; strict-mode capture lets loopback traffic through.
func inboundCluster(p *model.LocalPod, ipt inboundPort, connectTimeout time.Duration) (*clusterv3.Cluster, error) {
	cn := inboundClusterName(p, ipt.port)
	c := &clusterv3.Cluster{
		Name:                 cn,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       xdsproto.ConnectTimeout(connectTimeout),
		UpstreamBindConfig: &core.BindConfig{SourceAddress: &core.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: 0}, NetworkNamespaceFilepath: p.NetnsPath,
		}},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: cn, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: xdsproto.SocketAddress("127.0.0.1", ipt.port, ""),
			}}}},
		}}},
	}
	if err := setUpstreamProtocol(c, ipt.protocol); err != nil {
		return nil, err
	}
	return c, nil
}

// setUpstreamProtocol makes c speak HTTP/2 to its upstreams when p is HTTP2 or GRPC
// (Cluster.typed_extension_protocol_options, envoy.extensions.upstreams.http.v3.HttpProtocolOptions
// with explicit_http_config.http2_protocol_options); other protocols leave c unchanged. It fails
// only if the options cannot be marshalled.
func setUpstreamProtocol(c *clusterv3.Cluster, p model.Protocol) error {
	if p != model.ProtocolHTTP2 && p != model.ProtocolGRPC {
		return nil
	}
	po, err := xdsproto.ToAny(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
			Http2ProtocolOptions: &core.Http2ProtocolOptions{}}}}})
	if err != nil {
		return err
	}
	c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": po}
	return nil
}

// portMatchKey is the key, in an endpoint's envoy.transport_socket_match metadata, of the target
// port the endpoint serves when it differs from its service port's TargetPort (a named targetPort
// that pods resolve to different numbers, or another cluster's pod whose Service gives the port
// another targetPort: model.ServicePort.EndpointPort). The cluster's socket for that port sends SNI
// "<port>", so each pod's inbound listener gets its own port's SNI; a waypoint endpoint's
// ({waypoint: true, port: "<port>"}) sends the waypoint SNI of that port.
const portMatchKey = "port"

// otherPorts are the target ports, sorted and unique, other than a service port's TargetPort, on
// which its endpoints serve it (a named targetPort resolved to different numbers by different
// pods, or an imported service's port, which other clusters' pods serve on the numbers their
// home clusters registered: model.ServicePort.EndpointPort). Each gets a transport socket of its
// own in the port's cluster.
type otherPorts struct {
	// direct are those of endpoints dialled at pod_ip:15008 (SNI "<port>").
	direct []uint32
	// waypoint are those of other clusters' endpoints reached through their node's waypoint
	// (SNI "<port>.<svc>.<ns>.<meshDomain>").
	waypoint []uint32
}

func (o otherPorts) equal(p otherPorts) bool {
	return slices.Equal(o.direct, p.direct) && slices.Equal(o.waypoint, p.waypoint)
}

// otherTargetPorts returns the otherPorts of s's port sp in m; both lists are nil when every
// endpoint serves TargetPort. Waypoint ones (only when viaWaypoint) are only those of endpoints
// the waypoint carries (a known node IP). Only a named targetPort or an imported service's port
// can have any: a local Service's numeric targetPort is every local endpoint's, and only an
// imported service has other clusters' endpoints, which serve the port on the numbers their home
// clusters registered.
func otherTargetPorts(m *model.Mesh, s *model.Service, sp model.ServicePort, viaWaypoint bool) otherPorts {
	var out otherPorts
	if !sp.PerEndpoint() && !s.Imported {
		return out
	}
	eps := m.Endpoints[s.Key]
	for i := range eps {
		p, ok := sp.EndpointPort(&eps[i], m.Cluster)
		if !ok || p.Port == sp.TargetPort {
			continue
		}
		switch {
		case !viaWaypoint || eps[i].Cluster == m.Cluster:
			out.direct = append(out.direct, p.Port)
		case eps[i].NodeIP.IsValid():
			out.waypoint = append(out.waypoint, p.Port)
		}
	}
	slices.Sort(out.direct)
	slices.Sort(out.waypoint)
	out.direct, out.waypoint = slices.Compact(out.direct), slices.Compact(out.waypoint)
	return out
}

// peerIDs returns the SPIFFE IDs of a service's endpoints eps, sorted and unique (nil when none).
func peerIDs(eps []model.Endpoint) []string {
	var ids []string
	for _, ep := range eps {
		if ep.SPIFFEID != "" && (len(ids) == 0 || ids[len(ids)-1] != ep.SPIFFEID) {
			ids = append(ids, ep.SPIFFEID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// localIDsByNamespace are the local pods' SPIFFE IDs by namespace, each list sorted.
func localIDsByNamespace(m *model.Mesh) map[string][]string {
	out := map[string][]string{}
	for _, p := range m.Pods {
		id := p.SPIFFEID(m.TrustDomain)
		if !slices.Contains(out[p.Namespace], id) {
			out[p.Namespace] = append(out[p.Namespace], id)
		}
	}
	for _, ids := range out {
		slices.Sort(ids)
	}
	return out
}

// localIDs returns the SPIFFE IDs of the local pods, sorted and unique.
func localIDs(m *model.Mesh) []string {
	seen := map[string]bool{}
	for _, p := range m.Pods {
		seen[p.SPIFFEID(m.TrustDomain)] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// peerSANs pins an upstream's certificate to the SPIFFE IDs peers (peerIDs): one exact URI SAN
// matcher each, nil when there are none.
func peerSANs(peers []string) []*tlsv3.SubjectAltNameMatcher {
	var sans []*tlsv3.SubjectAltNameMatcher
	for _, id := range peers {
		sans = append(sans, &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: id}}})
	}
	return sans
}

// upstreamPin is the SAN pin of a cluster's TLS contexts with the certificate selector: the
// destination's SPIFFE IDs peers (peerSANs), or while no endpoint is known a prefix for the
// service's namespace, "spiffe://<trustDomain>/ns/<namespace>/sa/".
func upstreamPin(peers []string, trustDomain, namespace string) []*tlsv3.SubjectAltNameMatcher {
	if len(peers) > 0 {
		return peerSANs(peers)
	}
	return []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI,
		Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{
			Prefix: "spiffe://" + trustDomain + "/ns/" + namespace + "/sa/"}}}}
}

// upstreamTLS is the transport socket of an outbound cluster with CertSelector: an
// UpstreamTlsContext with SNI sni, the client certificate picked per connection by the on-demand
// certificate selector sel from the secret named in the downstream filter state
// CertMapperFilterStateKey (the source pod's SPIFFE ID), the peer validated against the trust
// bundle and pinned to pin (upstreamPin).
func upstreamTLS(sni string, sel *core.TypedExtensionConfig, pin []*tlsv3.SubjectAltNameMatcher) (*core.TransportSocket, error) {
	return tlsSocket(&tlsv3.UpstreamTlsContext{
		Sni: sni,
		CommonTlsContext: &tlsv3.CommonTlsContext{
			CustomTlsCertificateSelector: sel,
			ValidationContextType:        peerValidation(pin, pinSecret(pin)),
		},
	})
}

// upstreamTLSFor is an UpstreamTlsContext with SNI sni presenting the SDS secret id ("" for none),
// the peer validated against the trust bundle and pinned to pin (CertMatcher: peerSANs).
func upstreamTLSFor(sni, id string, pin []*tlsv3.SubjectAltNameMatcher) (*core.TransportSocket, error) {
	ctx := &tlsv3.CommonTlsContext{ValidationContextType: peerValidation(pin, pinSecret(pin))}
	if id != "" {
		ctx.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsRef(id)}
	}
	return tlsSocket(&tlsv3.UpstreamTlsContext{Sni: sni, CommonTlsContext: ctx})
}
