package xds

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	xdscore "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	sfsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/set_filter_state/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	origdstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	sfslistenerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/set_filter_state/v3"
	tlsinspv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	sfsnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/set_filter_state/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	celv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/formatter/cel/v3"
	earlymutv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	netinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	tsinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/transport_socket/v3"
	fsmapperv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/cert_mappers/filter_state_override/v3"
	ondemandv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/cert_selectors/on_demand_secret/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/identity"
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
}

// DefaultHandshakeTimeout is Options.HandshakeTimeout's default, 10 s (docs/node-proxy.md says
// why).
const DefaultHandshakeTimeout = tunnel.DefaultHandshakeTimeout

func (o Options) handshakeTimeout() *durationpb.Duration {
	if o.HandshakeTimeout <= 0 {
		return durationpb.New(DefaultHandshakeTimeout)
	}
	return durationpb.New(o.HandshakeTimeout)
}

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

func (o Options) connectTimeout() *durationpb.Duration {
	if o.ConnectTimeout <= 0 {
		return durationpb.New(5 * time.Second)
	}
	return durationpb.New(o.ConnectTimeout)
}

// Resources is one built configuration: every resource for the node's Envoy, by kind, each list
// sorted by name.
type Resources struct {
	Listeners []*listenerv3.Listener
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Routes    []*routev3.RouteConfiguration
	Secrets   []*tlsv3.Secret
	// Extensions are the ECDS resources: HeadlessFilterName, which every capture listener uses
	// (none without local pods).
	Extensions []*core.TypedExtensionConfig

	// known holds resources (and shared capture matchers) a Builder carried over unchanged from
	// an earlier build whose ValidateAll passed: ValidateAll skips them.
	known map[any]struct{}
	// validated, when set, is called once ValidateAll passes (the Builder then marks what it
	// built as known to be valid).
	validated func()
}

// chainsKey identifies a list of filter chains by its backing array (the capture listeners share
// one), or is nil for an empty list.
func chainsKey(fcs []*listenerv3.FilterChain) any {
	if len(fcs) == 0 {
		return nil
	}
	return sharedChains{first: &fcs[0], n: len(fcs)}
}

type sharedChains struct {
	first **listenerv3.FilterChain
	n     int
}

func (r *Resources) isKnown(x any) bool {
	_, ok := r.known[x]
	return ok
}

// Build turns one mesh model and the current SVIDs of the local pods' identities (keyed by
// SPIFFE ID) into Envoy resources. It is pure: same inputs, same output. It returns an error
// naming the option for options it does not implement (Options.check: EastWestWaypoint with
// CertMatcher), naming the pod when a local pod has no SVID or no usable address, and any error
// from marshalling a typed config. A caller that builds again and again (the agent, on every
// model change) should keep a Builder instead, which rebuilds only what changed.
func Build(m *model.Mesh, svids map[string]*identity.SVID, bundlePEM []byte, opts Options) (*Resources, error) {
	return NewBuilder(opts).Build(m, svids, bundlePEM)
}

type builder struct {
	m    *model.Mesh
	opts Options
	// Built once per routing and shared by every pod's capture listener (the protos are only
	// read afterwards): the filter-chain matcher and the filter chains (the HTTP chain, then one
	// floor chain per TCP service port).
	captureMatcher *xdsmatcher.Matcher
	captureChains  []*listenerv3.FilterChain
	// headlessRef is the capture listeners' reference to the ECDS filter HeadlessFilterName.
	headlessRef *listenerv3.ListenerFilter
	// selector is the on-demand certificate selector every outbound cluster shares.
	selector *core.TypedExtensionConfig
	// localEndpoints indexes this cluster's endpoints by pod UID, for the inbound listeners.
	localEndpoints map[string][]model.Endpoint
	// captureHCM and headlessHCM are the HTTP connection managers of the capture HTTP chains
	// captureHTTPChain (RDS CaptureRouteName) and captureHeadlessChain (CaptureHeadlessRouteName).
	captureHCM, headlessHCM *listenerv3.Filter
	passthrough             *listenerv3.Filter
}

// prepareShared builds the typed configs every build of one Builder shares (they depend on the
// options only): the certificate selector, the capture HTTP connection managers and the
// passthrough tcp_proxy.
func (b *builder) prepareShared() error {
	mapper, err := toAny(&fsmapperv3.Config{DefaultValue: "none"})
	if err != nil {
		return err
	}
	sel, err := toAny(&ondemandv3.Config{
		ConfigSource:      adsSource(),
		CertificateMapper: &core.TypedExtensionConfig{Name: "envoy.tls.upstream_certificate_mappers.filter_state_override", TypedConfig: mapper},
	})
	if err != nil {
		return err
	}
	b.selector = &core.TypedExtensionConfig{Name: "envoy.tls.certificate_selectors.on_demand_secret", TypedConfig: sel}
	early, err := toAny(&earlymutv3.HeaderMutation{Mutations: []*mutationv3.HeaderMutation{{
		Action: &mutationv3.HeaderMutation_Append{Append: &core.HeaderValueOption{
			Header:       &core.HeaderValue{Key: DstHeader, Value: "%DOWNSTREAM_LOCAL_ADDRESS%"},
			AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}},
	}}})
	if err != nil {
		return err
	}
	// The two capture HTTP chains' connection managers differ only in their route configuration.
	captureHCM := func(route string) (*listenerv3.Filter, error) {
		return hcmFilter(&hcmv3.HttpConnectionManager{
			StatPrefix: "outbound_http",
			RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
				ConfigSource: adsSource(), RouteConfigName: route,
			}},
			EarlyHeaderMutationExtensions: []*core.TypedExtensionConfig{{Name: "aether.original-destination", TypedConfig: early}},
		})
	}
	if b.captureHCM, err = captureHCM(CaptureRouteName); err != nil {
		return err
	}
	if b.headlessHCM, err = captureHCM(CaptureHeadlessRouteName); err != nil {
		return err
	}
	b.headlessRef = headlessRef()
	b.passthrough, err = tcpProxy("passthrough", PassthroughCluster)
	return err
}

// floorChain is the tcp_proxy filter of one TCP service port.
type floorChain struct {
	name string
	tcp  *listenerv3.Filter
}

func sortByName[T any](s []T, name func(T) string) {
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(name(a), name(b)) })
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// toAny marshals a typed config. The messages marshalled here are built by this package and
// always valid, so an error is a programming error; it still surfaces as a build error.
func toAny(m proto.Message) (*anypb.Any, error) {
	a, err := anypb.New(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %T: %w", m, err)
	}
	return a, nil
}

func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

func sdsRef(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: adsSource()}
}

func socketAddress(ip string, port uint32, netns string) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Address:                  ip,
		PortSpecifier:            &core.SocketAddress_PortValue{PortValue: port},
		NetworkNamespaceFilepath: netns,
	}}}
}

func (b *builder) bindConfig() *core.BindConfig {
	if b.opts.UpstreamNetns == "" {
		return nil
	}
	return &core.BindConfig{SourceAddress: &core.SocketAddress{
		Address:                  "0.0.0.0",
		PortSpecifier:            &core.SocketAddress_PortValue{PortValue: 0},
		NetworkNamespaceFilepath: b.opts.UpstreamNetns,
	}}
}

// ---- secrets (SDS) ----

// InboundSecretName names the copy of a pod's SVID that its inbound listener presents. The
// outbound on-demand certificate selector subscribes to the SVID under its SPIFFE ID; when the
// inbound listener's static SDS subscription already held that same name, Envoy 1.40 (delta ADS)
// never completed the selector's own subscription (the secret stayed warming, upstream TLS
// handshakes timed out). Two names, one certificate.
func InboundSecretName(spiffeID string) string { return "inbound|" + spiffeID }

func svidSecret(name string, s *identity.SVID) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: s.CertChainPEM}},
		PrivateKey:       &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: s.KeyPEM}},
	}}}
}

func bundleSecret(pem []byte) *tlsv3.Secret {
	return &tlsv3.Secret{Name: TrustBundleSecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: pem}},
	}}}
}

// ---- outbound clusters, endpoints and routes ----

// peerIDs returns the SPIFFE IDs of the service's endpoints, sorted and unique (nil when none).
func (b *builder) peerIDs(k model.ServiceKey) []string {
	var ids []string
	for _, ep := range b.m.Endpoints[k] {
		if ep.SPIFFEID != "" && (len(ids) == 0 || ids[len(ids)-1] != ep.SPIFFEID) {
			ids = append(ids, ep.SPIFFEID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// upstreamTLS is the UpstreamTlsContext of an outbound cluster: SNI "<targetPort>", the client
// certificate picked per connection by the on-demand certificate selector from the secret named
// in the downstream filter state CertMapperFilterStateKey (the source pod's SPIFFE ID), the peer
// validated against the trust bundle and pinned to the destination's SPIFFE IDs (URI SAN, exact;
// a namespace prefix when no endpoint is known yet).
func (b *builder) upstreamTLS(k model.ServiceKey, sni string, alpn []string) (*core.TransportSocket, error) {
	var sans []*tlsv3.SubjectAltNameMatcher
	ids := b.peerIDs(k)
	for _, id := range ids {
		sans = append(sans, &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: id}}})
	}
	if len(ids) == 0 {
		sans = append(sans, &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{
				Prefix: "spiffe://" + b.m.TrustDomain + "/ns/" + k.Namespace + "/sa/"}}})
	}
	utc, err := toAny(&tlsv3.UpstreamTlsContext{
		Sni: sni,
		CommonTlsContext: &tlsv3.CommonTlsContext{
			AlpnProtocols:                alpn,
			CustomTlsCertificateSelector: b.selector,
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: sans},
				ValidationContextSdsSecretConfig: sdsRef(TrustBundleSecret),
			}},
		},
	})
	if err != nil {
		return nil, err
	}
	return &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: utc}}, nil
}

func (b *builder) outboundCluster(s *model.Service, sp model.ServicePort) (*clusterv3.Cluster, error) {
	name := ClusterName(b.m, s.Key, sp.Port)
	sni := strconv.FormatUint(uint64(sp.TargetPort), 10)
	var ts *core.TransportSocket
	var err error
	if b.opts.CertSelection == CertMatcher {
		// The default socket (no matching identity) presents no client certificate; the peer
		// refuses it.
		ts, err = b.upstreamTLSFor(s.Key, sni, "")
	} else {
		ts, err = b.upstreamTLS(s.Key, sni, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("build cluster %s: %w", name, err)
	}
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource()},
		ConnectTimeout:       b.opts.connectTimeout(),
		TransportSocket:      ts,
		UpstreamBindConfig:   b.bindConfig(),
	}
	others := b.otherTargetPorts(s, sp)
	if b.opts.CertSelection == CertMatcher {
		if err := b.addSocketMatcher(c, s.Key, sni, others.direct); err != nil {
			return nil, fmt.Errorf("build cluster %s: %w", name, err)
		}
	} else if b.opts.EastWestWaypoint {
		// Envoy picks the first transport_socket_matches entry whose match is a subset of the
		// endpoint's envoy.transport_socket_match metadata: a waypoint endpoint of another
		// target port carries {waypoint: true, port: "<port>"}, so its entry comes before the
		// plain waypoint one and the direct "port-<port>" ones.
		for _, p := range others.waypoint {
			ps := strconv.FormatUint(uint64(p), 10)
			wts, err := b.upstreamTLS(s.Key, WaypointSNI(b.m, s.Key, p), nil)
			if err != nil {
				return nil, fmt.Errorf("build cluster %s: %w", name, err)
			}
			c.TransportSocketMatches = append(c.TransportSocketMatches, &clusterv3.Cluster_TransportSocketMatch{
				Name: "waypoint-" + ps,
				Match: &structpb.Struct{Fields: map[string]*structpb.Value{
					"waypoint": structpb.NewBoolValue(true), portMatchKey: structpb.NewStringValue(ps)}},
				TransportSocket: wts,
			})
		}
		wts, err := b.upstreamTLS(s.Key, WaypointSNI(b.m, s.Key, sp.TargetPort), nil)
		if err != nil {
			return nil, fmt.Errorf("build cluster %s: %w", name, err)
		}
		c.TransportSocketMatches = append(c.TransportSocketMatches, &clusterv3.Cluster_TransportSocketMatch{
			Name:            "waypoint",
			Match:           &structpb.Struct{Fields: map[string]*structpb.Value{"waypoint": structpb.NewBoolValue(true)}},
			TransportSocket: wts,
		})
	}
	if b.opts.CertSelection != CertMatcher {
		for _, p := range others.direct {
			ps := strconv.FormatUint(uint64(p), 10)
			pts, err := b.upstreamTLS(s.Key, ps, nil)
			if err != nil {
				return nil, fmt.Errorf("build cluster %s: %w", name, err)
			}
			c.TransportSocketMatches = append(c.TransportSocketMatches, &clusterv3.Cluster_TransportSocketMatch{
				Name:            "port-" + ps,
				Match:           &structpb.Struct{Fields: map[string]*structpb.Value{portMatchKey: structpb.NewStringValue(ps)}},
				TransportSocket: pts,
			})
		}
	}
	if err := setUpstreamProtocol(c, sp.Protocol); err != nil {
		return nil, err
	}
	return c, nil
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

// otherTargetPorts returns sp's otherPorts; both lists are nil when every endpoint serves
// TargetPort. Waypoint ones are only those of endpoints the waypoint carries (a known node IP).
// Only a named targetPort or an imported service's port can have any: a local Service's numeric
// targetPort is every local endpoint's, and only an imported service has other clusters'
// endpoints, which serve the port on the numbers their home clusters registered.
func (b *builder) otherTargetPorts(s *model.Service, sp model.ServicePort) otherPorts {
	var out otherPorts
	if !sp.PerEndpoint() && !s.Imported {
		return out
	}
	viaWaypoint := b.opts.EastWestWaypoint && b.opts.CertSelection == CertSelector
	eps := b.m.Endpoints[s.Key]
	for i := range eps {
		p, ok := sp.EndpointPort(&eps[i], b.m.Cluster)
		if !ok || p.Port == sp.TargetPort {
			continue
		}
		switch {
		case !viaWaypoint || eps[i].Cluster == b.m.Cluster:
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

// setUpstreamProtocol makes c speak HTTP/2 to its upstreams when p is HTTP2 or GRPC
// (Cluster.typed_extension_protocol_options, envoy.extensions.upstreams.http.v3.HttpProtocolOptions
// with explicit_http_config.http2_protocol_options); other protocols leave c unchanged. It fails
// only if the options cannot be marshalled.
func setUpstreamProtocol(c *clusterv3.Cluster, p model.Protocol) error {
	if p != model.ProtocolHTTP2 && p != model.ProtocolGRPC {
		return nil
	}
	po, err := toAny(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
			Http2ProtocolOptions: &core.Http2ProtocolOptions{}}}}})
	if err != nil {
		return err
	}
	c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": po}
	return nil
}

// upstreamTLSFor is an UpstreamTlsContext presenting the SDS secret id ("" for none), with the
// same validation as upstreamTLS.
func (b *builder) upstreamTLSFor(k model.ServiceKey, sni, id string) (*core.TransportSocket, error) {
	var sans []*tlsv3.SubjectAltNameMatcher
	for _, pid := range b.peerIDs(k) {
		sans = append(sans, &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: pid}}})
	}
	ctx := &tlsv3.CommonTlsContext{
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: sans},
			ValidationContextSdsSecretConfig: sdsRef(TrustBundleSecret),
		}},
	}
	if id != "" {
		ctx.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsRef(id)}
	}
	utc, err := toAny(&tlsv3.UpstreamTlsContext{Sni: sni, CommonTlsContext: ctx})
	if err != nil {
		return nil, err
	}
	return &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: utc}}, nil
}

// addSocketMatcher gives c one named TLS socket per local identity and a transport_socket_matcher
// on the shared filter state CertMapperFilterStateKey that picks the caller's (CertMatcher). With
// other target ports (otherTargetPorts), each identity also gets one socket per such port, and
// its match is a nested matcher on the endpoint's metadata envoy.transport_socket_match.port
// (EndpointMetadataInput) that picks it, the SNI-sni socket when the endpoint has none.
func (b *builder) addSocketMatcher(c *clusterv3.Cluster, k model.ServiceKey, sni string, others []uint32) error {
	ids := map[string]bool{}
	for _, p := range b.m.Pods {
		ids[p.SPIFFEID(b.m.TrustDomain)] = true
	}
	m := map[string]*xdsmatcher.Matcher_OnMatch{}
	for i, id := range slices.Sorted(mapKeys(ids)) {
		name := "id" + strconv.Itoa(i)
		ts, err := b.upstreamTLSFor(k, sni, id)
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
			pts, err := b.upstreamTLSFor(k, ps, id)
			if err != nil {
				return err
			}
			c.TransportSocketMatches = append(c.TransportSocketMatches, &clusterv3.Cluster_TransportSocketMatch{Name: pname, TransportSocket: pts})
			if byPort[ps], err = socketAction(pname); err != nil {
				return err
			}
		}
		input, err := toAny(&tsinputsv3.EndpointMetadataInput{Filter: "envoy.transport_socket_match",
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
	input, err := toAny(&tsinputsv3.FilterStateInput{Key: CertMapperFilterStateKey})
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
	a, err := toAny(&tsinputsv3.TransportSocketNameAction{Name: name})
	if err != nil {
		return nil, err
	}
	return &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{Action: &xdscore.TypedExtensionConfig{Name: name, TypedConfig: a}}}, nil
}

func (b *builder) passthroughCluster() *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 PassthroughCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		ConnectTimeout:       b.opts.connectTimeout(),
		UpstreamBindConfig:   b.bindConfig(),
	}
}

// priority orders endpoints by cluster, then locality (DESIGN.md, data flow 5; Envoy
// LocalityLbEndpoints.priority, lower first): within this cluster 0 = this node's region and zone,
// 1 = its region, another zone, 2 = another region; other clusters' endpoints likewise at 3, 4
// and 5, so traffic leaves the cluster only when no local endpoint is healthy, and then goes to
// the nearest. loadAssignment numbers the tiers a service actually has 0, 1, ... in this order.
func (b *builder) priority(ep model.Endpoint) uint32 {
	var p uint32
	switch {
	case ep.Region == b.m.Node.Region && ep.Zone == b.m.Node.Zone:
		p = 0
	case ep.Region == b.m.Node.Region:
		p = 1
	default:
		p = 2
	}
	if ep.Cluster != b.m.Cluster {
		p += remoteTier
	}
	return p
}

// remoteTier is the priority offset of other clusters' endpoints: they come after every endpoint
// of this cluster, and locality orders them within their tier as it does this cluster's.
const remoteTier = 3

// localityKey groups a service port's endpoints into LocalityLbEndpoints.
type localityKey struct {
	prio                  uint32
	region, zone, cluster string
}

// loadAssignment is the EDS resource of one service port: every endpoint serving it (on its own
// target port, model.ServicePort.EndpointPort; one that differs from sp.TargetPort carries the
// metadata that selects its SNI socket) at pod_ip:15008, grouped by (priority, region, zone, cluster), unhealthy ones marked so. The
// groups are few (a linear search finds them) and the endpoints' messages are allocated in one
// block per kind: at 100k endpoints this is most of a cold build.
func (b *builder) loadAssignment(s *model.Service, sp model.ServicePort) *endpointv3.ClusterLoadAssignment {
	type group struct {
		key localityKey
		lbs []*endpointv3.LbEndpoint
	}
	var groups []group
	find := func(k localityKey) *group {
		for i := range groups {
			if groups[i].key == k {
				return &groups[i]
			}
		}
		groups = append(groups, group{key: k})
		return &groups[len(groups)-1]
	}
	type nodeKey struct {
		localityKey
		node netip.Addr
	}
	waypoints := map[nodeKey]map[uint32]waypointPods{} // per remote node, per target port
	viaWaypoint := b.opts.EastWestWaypoint && b.opts.CertSelection == CertSelector
	all := b.m.Endpoints[s.Key]
	// Each endpoint serves sp on its own port (a named targetPort may differ from pod to pod).
	serves := func(ep *model.Endpoint) bool {
		_, ok := sp.EndpointPort(ep, b.m.Cluster)
		return ok
	}
	n := 0
	for i := range all {
		if serves(&all[i]) {
			n++
		}
	}
	var (
		lbs   = make([]endpointv3.LbEndpoint, n)
		hids  = make([]endpointv3.LbEndpoint_Endpoint, n)
		eps   = make([]endpointv3.Endpoint, n)
		addrs = make([]core.Address, n)
		sas   = make([]core.Address_SocketAddress, n)
		socks = make([]core.SocketAddress, n)
		ports = make([]core.SocketAddress_PortValue, n)
	)
	j := 0
	for i := range all {
		ep := &all[i]
		if !serves(ep) {
			continue
		}
		if viaWaypoint && ep.Cluster != b.m.Cluster {
			if ep.NodeIP.IsValid() {
				p, _ := sp.EndpointPort(ep, b.m.Cluster)
				nk := nodeKey{localityKey{b.priority(*ep), ep.Region, ep.Zone, ep.Cluster}, ep.NodeIP}
				if waypoints[nk] == nil {
					waypoints[nk] = map[uint32]waypointPods{}
				}
				wp := waypoints[nk][p.Port]
				wp.all++
				if ep.Healthy {
					wp.healthy++
				}
				waypoints[nk][p.Port] = wp
			}
			continue
		}
		ip, ok := model.MeshAddr(ep.IPs)
		if !ok {
			continue
		}
		hs := core.HealthStatus_HEALTHY
		if !ep.Healthy {
			hs = core.HealthStatus_UNHEALTHY
		}
		ports[j].PortValue = InboundPort
		socks[j].Address, socks[j].PortSpecifier = ip.String(), &ports[j]
		sas[j].SocketAddress = &socks[j]
		addrs[j].Address = &sas[j]
		eps[j].Address = &addrs[j]
		hids[j].Endpoint = &eps[j]
		lbs[j].HostIdentifier, lbs[j].HealthStatus = &hids[j], hs
		if p, _ := sp.EndpointPort(ep, b.m.Cluster); p.Port != sp.TargetPort {
			// Selects the cluster's socket with SNI "<port>" (outboundCluster, otherTargetPorts).
			lbs[j].Metadata = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
				"envoy.transport_socket_match": {Fields: map[string]*structpb.Value{portMatchKey: structpb.NewStringValue(strconv.FormatUint(uint64(p.Port), 10))}},
			}}
		}
		g := find(localityKey{b.priority(*ep), ep.Region, ep.Zone, ep.Cluster})
		g.lbs = append(g.lbs, &lbs[j])
		j++
	}
	nodes := slices.SortedFunc(mapKeys(waypoints), func(a, c nodeKey) int { return a.node.Compare(c.node) })
	for _, nk := range nodes {
		port := waypointPort(waypoints[nk], sp.TargetPort)
		healthy := waypoints[nk][port].healthy
		hs, weight := core.HealthStatus_HEALTHY, healthy
		if healthy == 0 {
			hs, weight = core.HealthStatus_UNHEALTHY, 1
		}
		match := map[string]*structpb.Value{"waypoint": structpb.NewBoolValue(true)}
		if port != sp.TargetPort {
			// Selects the cluster's "waypoint-<port>" socket (SNI of that port).
			match[portMatchKey] = structpb.NewStringValue(strconv.FormatUint(uint64(port), 10))
		}
		g := find(nk.localityKey)
		g.lbs = append(g.lbs, &endpointv3.LbEndpoint{
			HostIdentifier:      &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socketAddress(nk.node.String(), WaypointPort, "")}},
			HealthStatus:        hs,
			LoadBalancingWeight: wrapperspb.UInt32(weight),
			Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
				"envoy.transport_socket_match": {Fields: match},
			}},
		})
	}
	slices.SortFunc(groups, func(a, c group) int {
		return cmp.Or(cmp.Compare(a.key.prio, c.key.prio), cmp.Compare(a.key.cluster, c.key.cluster), cmp.Compare(a.key.region, c.key.region), cmp.Compare(a.key.zone, c.key.zone))
	})
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: ClusterName(b.m, s.Key, sp.Port)}
	if len(groups) > 0 {
		cla.Endpoints = make([]*endpointv3.LocalityLbEndpoints, 0, len(groups))
	}
	// Envoy's priorities run from 0 without gaps (LocalityLbEndpoints.priority): the tiers
	// present are numbered in order.
	var prio uint32
	for i, g := range groups {
		if i > 0 && g.key.prio != groups[i-1].key.prio {
			prio++
		}
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:    &core.Locality{Region: g.key.region, Zone: g.key.zone, SubZone: g.key.cluster},
			Priority:    prio,
			LbEndpoints: g.lbs,
		})
	}
	return cla
}

// waypointPods counts one remote node's endpoints of a service port on one target port.
type waypointPods struct{ healthy, all uint32 }

// waypointPort picks the one target port, of those a remote node's pods serve a service port on
// (a named targetPort may differ from pod to pod), that the node's waypoint entry carries: the
// one with the most healthy pods, then the most pods, then target (the service port's
// TargetPort), then the lowest. One entry per node and port is not possible: Envoy keeps only
// the first of several EDS hosts with one address (all node_ip:15443), so the other ports' pods
// on that node get no traffic through the waypoint; no connection is sent with an SNI its pod
// does not serve.
func waypointPort(ports map[uint32]waypointPods, target uint32) uint32 {
	var best uint32
	var bp waypointPods
	for _, p := range slices.Sorted(mapKeys(ports)) {
		c := ports[p]
		if best == 0 || c.healthy > bp.healthy || c.healthy == bp.healthy && (c.all > bp.all || c.all == bp.all && p == target) {
			best, bp = p, c
		}
	}
	return best
}

func routeTo(cluster string) *routev3.Route {
	return &routev3.Route{
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			// No per-request timeout: streams and long polls are the application's business.
			Timeout: durationpb.New(0),
		}},
	}
}

// serviceEntry builds everything one service contributes to a snapshot: its outbound clusters
// and EDS resources (one per non-UDP port, when the service has a VIP), its floor chains, its
// entries in the capture filter-chain matcher and in the capture route table, and its virtual
// hosts in the lane route table. It reads only the service, its endpoints and mesh-wide values
// (svcEntry lists them), so it may run for many services at once. When old (the service's entry
// in the previous build, or nil) was built from the same service and short name, only the EDS
// resources are built again, and the clusters too unless the endpoints' SPIFFE IDs or their
// other target ports (otherTargetPorts) changed.
func (b *builder) serviceEntry(s *model.Service, old *svcEntry) (*svcEntry, error) {
	e := &svcEntry{svc: s, eps: b.m.Endpoints[s.Key], short: b.m.ShortName(s.Key), peers: b.peerIDs(s.Key)}
	for _, sp := range s.Ports {
		e.otherPorts = append(e.otherPorts, b.otherTargetPorts(s, sp))
	}
	// A headless service's capture entries and direct clusters follow its endpoints: rebuilt whole.
	if old != nil && !s.Headless && old.short == e.short && serviceEqual(old.svc, s) {
		e.floors, e.chains, e.routes, e.lane = old.floors, old.chains, old.routes, old.lane
		if slices.Equal(old.peers, e.peers) && slices.EqualFunc(old.otherPorts, e.otherPorts, otherPorts.equal) {
			e.clusters, e.clustersValid = old.clusters, old.valid || old.clustersValid
		} else if err := b.outboundClusters(e); err != nil {
			return nil, err
		}
		for _, sp := range s.Ports {
			if sp.Protocol != model.ProtocolUDP && hasClusters(s) {
				e.clas = append(e.clas, b.loadAssignment(s, sp))
			}
		}
		return e, nil
	}
	if err := b.outboundClusters(e); err != nil {
		return nil, err
	}
	vips := s.AllVIPs()
	for _, sp := range s.Ports {
		if sp.Protocol == model.ProtocolUDP {
			continue
		}
		cn := ClusterName(b.m, s.Key, sp.Port)
		if hasClusters(s) {
			e.clas = append(e.clas, b.loadAssignment(s, sp))
		}
		if s.Headless {
			if err := b.directEntries(e, sp); err != nil {
				return nil, err
			}
		}
		// Capture: the chain this port's VIPs select (floor chains exist even without a VIP).
		chain := captureHTTPChain
		if !sp.Protocol.IsHTTP() {
			chain = "tcp|" + cn
			tp, err := tcpProxy("outbound_tcp", cn)
			if err != nil {
				return nil, err
			}
			e.floors = append(e.floors, floorChain{name: chain, tcp: tp})
		}
		port := strconv.FormatUint(uint64(sp.Port), 10)
		for _, vip := range vips {
			a, _ := anypb.New(wrapperspb.String(chain))
			e.chains = append(e.chains, vipChain{vip: vip.String(), port: port, action: &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{
				Action: &xdscore.TypedExtensionConfig{Name: chain, TypedConfig: a}}}})
		}
		if sp.Protocol.IsHTTP() {
			route, _ := anypb.New(routeTo(cn))
			for _, vip := range vips {
				e.routes = append(e.routes, vipRoute{dst: netip.AddrPortFrom(vip, uint16(sp.Port)).String(), action: &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{
					Action: &xdscore.TypedExtensionConfig{Name: "route", TypedConfig: route}}}})
			}
		}
	}
	e.lane = b.laneVirtualHosts(s, e.short)
	return e, nil
}

// hasClusters reports whether a service gets outbound EDS clusters (and lane virtual hosts): when
// it has a local or clusterset VIP, or is headless (its lane virtual hosts balance over its
// pods). Any other service without a VIP (a Service of type ExternalName, an import whose VIP is
// not known yet) has no cluster and no virtual host: a lane request for its name gets 404, not a
// route to a missing cluster.
func hasClusters(s *model.Service) bool { return len(s.VIPs)+len(s.ClustersetVIPs) > 0 || s.Headless }

// directEntries adds what one port of a headless service contributes for connections made
// straight to its pods (clients resolve a headless Service to pod IPs and dial one): for each
// target port its endpoints in this cluster serve, an ORIGINAL_DST cluster (directCluster), and
// for each of those endpoints' address (model.MeshAddr: the one its inbound listener binds) a
// directEntry "<pod_ip>:<port>" -> chain (an entry of the ECDS filter HeadlessFilterName, not of
// the capture filter-chain matcher: see assembleRouting; for HTTP the chain captureHeadlessChain)
// and for HTTP the route "<pod_ip>:<port>" of CaptureHeadlessRouteName, which send the connection
// to it. So a connection to a
// meshed pod's IP and target port goes over mTLS to that same pod's :15008 with SNI "<port>";
// a pod that is not an endpoint (not meshed) is still passed through. Other clusters' endpoints
// are left out: their pod IPs are not this cluster's (and may be equal to local ones).
func (b *builder) directEntries(e *svcEntry, sp model.ServicePort) error {
	s := e.svc
	ips := map[uint32][]netip.Addr{}
	for i := range e.eps {
		ep := &e.eps[i]
		if ep.Cluster != b.m.Cluster {
			continue
		}
		// The address the pod's inbound listener binds (and EDS dials); a dual-stack pod's other
		// address is passed through as before.
		ip, hasIP := model.MeshAddr(ep.IPs)
		if p, ok := sp.EndpointPort(ep, b.m.Cluster); ok && hasIP {
			ips[p.Port] = append(ips[p.Port], ip)
		}
	}
	for _, target := range slices.Sorted(mapKeys(ips)) {
		cn := DirectClusterName(b.m, s.Key, sp.Port, target)
		c, err := b.directCluster(s, sp, target)
		if err != nil {
			return err
		}
		e.clusters = append(e.clusters, c)
		chain := captureHeadlessChain
		if !sp.Protocol.IsHTTP() {
			chain = "tcp|" + cn
			tp, err := tcpProxy("outbound_tcp", cn)
			if err != nil {
				return err
			}
			e.floors = append(e.floors, floorChain{name: chain, tcp: tp})
		}
		route, err := toAny(routeTo(cn))
		if err != nil {
			return err
		}
		for _, ip := range ips[target] {
			e.direct = append(e.direct, directEntry{dst: netip.AddrPortFrom(ip, uint16(target)), chain: chain})
			if sp.Protocol.IsHTTP() {
				e.directRoutes = append(e.directRoutes, vipRoute{dst: netip.AddrPortFrom(ip, uint16(target)).String(), action: &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{
					Action: &xdscore.TypedExtensionConfig{Name: "route", TypedConfig: route}}}})
			}
		}
	}
	return nil
}

// directCluster is the ORIGINAL_DST cluster of directEntries: the upstream host is the address
// the client dialled (restored by original_dst), its port replaced by InboundPort
// (Cluster.original_dst_lb_config.upstream_port_override), with the same upstream mTLS as the
// service's EDS clusters and SNI "<target>".
func (b *builder) directCluster(s *model.Service, sp model.ServicePort, target uint32) (*clusterv3.Cluster, error) {
	name := DirectClusterName(b.m, s.Key, sp.Port, target)
	sni := strconv.FormatUint(uint64(target), 10)
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		LbConfig: &clusterv3.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: &clusterv3.Cluster_OriginalDstLbConfig{
			UpstreamPortOverride: wrapperspb.UInt32(InboundPort),
		}},
		ConnectTimeout:     b.opts.connectTimeout(),
		UpstreamBindConfig: b.bindConfig(),
	}
	var err error
	if b.opts.CertSelection == CertMatcher {
		if c.TransportSocket, err = b.upstreamTLSFor(s.Key, sni, ""); err == nil {
			err = b.addSocketMatcher(c, s.Key, sni, nil)
		}
	} else {
		c.TransportSocket, err = b.upstreamTLS(s.Key, sni, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("build cluster %s: %w", name, err)
	}
	if err := setUpstreamProtocol(c, sp.Protocol); err != nil {
		return nil, err
	}
	return c, nil
}

// outboundClusters builds e's outbound EDS clusters: one per non-UDP port when hasClusters.
func (b *builder) outboundClusters(e *svcEntry) error {
	if !hasClusters(e.svc) {
		return nil
	}
	for _, sp := range e.svc.Ports {
		if sp.Protocol == model.ProtocolUDP {
			continue
		}
		c, err := b.outboundCluster(e.svc, sp)
		if err != nil {
			return err
		}
		e.clusters = append(e.clusters, c)
	}
	return nil
}

// vipChain is one entry of the capture filter-chain matcher: port and VIP to a chain.
type vipChain struct {
	vip, port string
	action    *xdsmatcher.Matcher_OnMatch
}

// directEntry is one headless endpoint's address and target port, "<pod_ip>:<port>", and the
// capture chain a connection to it takes (directEntries).
type directEntry struct {
	dst   netip.AddrPort
	chain string
}

// vipRoute is one entry of a capture route table: "VIP:port" (CaptureRouteName) or
// "<pod_ip>:<port>" (CaptureHeadlessRouteName) to a route.
type vipRoute struct {
	dst    string
	action *xdsmatcher.Matcher_OnMatch
}

// routing holds what every pod's listeners share and what the shared route tables hold, assembled
// from every service's entry in model order (a later service wins a VIP and port clash).
type routing struct {
	// captureMatcher is nil when no service has a VIP.
	captureMatcher *xdsmatcher.Matcher
	// captureChains are the capture listener's filter chains: the HTTP chain, the headless HTTP
	// chain when headlessRoute is set, then the floor chains; nil with captureMatcher.
	captureChains []*listenerv3.FilterChain
	// captureRoute (CaptureRouteName) holds the VIP routes.
	captureRoute *routev3.RouteConfiguration
	// headlessRoute (CaptureHeadlessRouteName) holds the headless Services' routes
	// "<pod_ip>:<port>"; nil when no headless HTTP port has an endpoint in this cluster.
	headlessRoute *routev3.RouteConfiguration
	laneRoute     *routev3.RouteConfiguration
	// headlessFilter is the ECDS resource HeadlessFilterName; it sets nothing when
	// directInMatcher (more than maxHeadlessMap entries: they are in the matcher instead).
	headlessFilter  *core.TypedExtensionConfig
	directInMatcher bool
	// valid is set once a build that used this routing passed ValidateAll. The other flags say
	// that a part is the value of an earlier routing that had: sharedValid the matcher, chains
	// and lane route (withDirect), vipRouteValid captureRoute, directValid headlessRoute and
	// headlessFilter.
	valid, sharedValid, vipRouteValid, directValid bool
}

// reuse says which parts of the previous routing assembleRouting may keep: the capture route
// when no service's VIP routes changed (sameVIPRoutes), the headless route table and the
// headless filter when no service's direct entries or headless routes changed (sameDirect).
type reuse struct {
	old                       *routing
	sameVIPRoutes, sameDirect bool
}

// assembleRouting builds the capture filter-chain matcher (a hash map on destination port, then
// destination IP, built once and shared by every pod's capture listener), the capture filter
// chains (shared too: the pod's identity is set by a listener filter) and the shared route
// tables from the services' entries, keeping the parts of keep.old that keep says are unchanged
// (the same values: not sent again, not validated again). Port first: services share few ports,
// so the matcher holds one nested IP map per distinct port rather than one nested port map per
// VIP (at 10k services on port 80, 0.9 MB instead of 2.1 MB in every pod's capture listener,
// which Envoy parses and builds per pod).
//
// Headless Services' endpoints are not in the matcher: on a target port a headless Service's
// endpoints serve, a destination IP that is no VIP falls to a nested matcher on the filter state
// DirectFilterStateKey, mapping the names of that port's headless chains to the chains, and
// anything else to the default chain (passthrough). The filter state is set by the ECDS listener
// filter HeadlessFilterName (headlessFilter), which every capture listener runs and which holds
// the "<pod_ip>:<port>" -> chain map (read only for the headless target ports). An HTTP port's
// endpoints take the chain captureHeadlessChain, whose route table CaptureHeadlessRouteName holds
// only their routes. So an endpoint change of a headless Service changes that one ECDS resource
// (and for HTTP ports the headless route table), not every pod's capture listener, nor the VIP
// route table: Envoy rebuilt each whole capture listener before (at 10k services and 50 pods,
// 4.7 s of its CPU per change), and then the VIP route table (900 KB at 10k services) per change
// on an HTTP port (docs/node-proxy.md, "Headless Services").
func (b *builder) assembleRouting(entries []*svcEntry, keep reuse) *routing {
	rt := &routing{}
	var floors []floorChain
	byPort := map[string]map[string]*xdsmatcher.Matcher_OnMatch{}
	lane := &routev3.RouteConfiguration{Name: LaneRouteName}
	for _, e := range entries {
		floors = append(floors, e.floors...)
		for _, c := range e.chains {
			if byPort[c.port] == nil {
				byPort[c.port] = map[string]*xdsmatcher.Matcher_OnMatch{}
			}
			byPort[c.port][c.vip] = c.action
		}
		lane.VirtualHosts = append(lane.VirtualHosts, e.lane...)
	}
	rt.laneRoute = lane
	if o := keep.old; o != nil && keep.sameVIPRoutes {
		rt.captureRoute, rt.vipRouteValid = o.captureRoute, o.valid || o.vipRouteValid
	} else {
		rt.captureRoute = captureRoute(CaptureRouteName, routeMap(entries, func(e *svcEntry) []vipRoute { return e.routes }))
	}
	var direct map[netip.AddrPort]string
	var directChains map[uint16]map[string]bool
	if o := keep.old; o != nil && keep.sameDirect {
		rt.headlessRoute, rt.headlessFilter, rt.directInMatcher = o.headlessRoute, o.headlessFilter, o.directInMatcher
		rt.directValid = o.valid || o.directValid
		direct, directChains = directMaps(entries)
	} else {
		direct, directChains = rt.assembleDirect(entries)
	}
	if rt.directInMatcher {
		// Too many for the ECDS filter's map: the endpoints' addresses are matcher entries, as
		// VIPs are. A VIP keeps its entry, as it does below the limit (the VIPs are matched
		// before the filter state).
		for dst, chain := range direct {
			port, ip := strconv.FormatUint(uint64(dst.Port()), 10), dst.Addr().String()
			if byPort[port] == nil {
				byPort[port] = map[string]*xdsmatcher.Matcher_OnMatch{}
			}
			if byPort[port][ip] == nil {
				byPort[port][ip] = chainAction(chain)
			}
		}
		directChains = nil
	}
	if len(byPort) == 0 && len(directChains) == 0 {
		return rt
	}
	portInput, _ := anypb.New(&netinputsv3.DestinationPortInput{})
	ipInput, _ := anypb.New(&netinputsv3.DestinationIPInput{})
	portMap := make(map[string]*xdsmatcher.Matcher_OnMatch, len(byPort)+len(directChains))
	for port, vips := range byPort {
		portMap[port] = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: &xdsmatcher.Matcher{
			MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
				Input:    &xdscore.TypedExtensionConfig{Name: "ip", TypedConfig: ipInput},
				TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: vips}},
			}},
		}}}
	}
	for port, chains := range directChains {
		key := strconv.FormatUint(uint64(port), 10)
		m := directMatcher(chains)
		if ip := portMap[key]; ip != nil {
			ip.GetMatcher().OnNoMatch = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: m}}
		} else {
			portMap[key] = &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Matcher{Matcher: m}}
		}
	}
	rt.captureMatcher = &xdsmatcher.Matcher{MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
		Input:    &xdscore.TypedExtensionConfig{Name: "port", TypedConfig: portInput},
		TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: portMap}},
	}}}
	rt.captureChains = make([]*listenerv3.FilterChain, 0, 2+len(floors))
	rt.captureChains = append(rt.captureChains, &listenerv3.FilterChain{Name: captureHTTPChain, Filters: []*listenerv3.Filter{b.captureHCM}})
	if rt.headlessRoute != nil {
		// Only while a headless HTTP port has endpoints: the chain comes and goes with that
		// port's entry in the matcher (directChainSet), so it adds no listener update of its own.
		rt.captureChains = append(rt.captureChains, &listenerv3.FilterChain{Name: captureHeadlessChain, Filters: []*listenerv3.Filter{b.headlessHCM}})
	}
	for _, fc := range floors {
		rt.captureChains = append(rt.captureChains, &listenerv3.FilterChain{Name: fc.name, Filters: []*listenerv3.Filter{fc.tcp}})
	}
	return rt
}

// directMaps returns the entries' direct entries as one map (a later service wins a clash) and,
// per headless target port, the chains its entries use (the matcher's part for them,
// directMatcher).
func directMaps(entries []*svcEntry) (map[netip.AddrPort]string, map[uint16]map[string]bool) {
	direct := map[netip.AddrPort]string{}
	directChains := map[uint16]map[string]bool{}
	for _, e := range entries {
		for _, d := range e.direct {
			direct[d.dst] = d.chain
			port := d.dst.Port()
			if directChains[port] == nil {
				directChains[port] = map[string]bool{}
			}
			directChains[port][d.chain] = true
		}
	}
	return direct, directChains
}

// routeMap is the capture route table's matcher map of the routes pick gives for each entry
// (a later service wins a clash).
func routeMap(entries []*svcEntry, pick func(*svcEntry) []vipRoute) map[string]*xdsmatcher.Matcher_OnMatch {
	routes := map[string]*xdsmatcher.Matcher_OnMatch{}
	for _, e := range entries {
		for _, r := range pick(e) {
			routes[r.dst] = r.action
		}
	}
	return routes
}

// assembleDirect sets rt's headless route table and headless filter from the entries' headless
// routes and direct entries, and returns directMaps(entries). The route table is nil without
// headless routes, that is unless some direct entry takes the chain captureHeadlessChain
// (directEntries gives each such entry its route). When the direct entries are too many for the
// filter (directInMatcher), the filter is empty and the caller puts the returned map into the
// matcher.
func (rt *routing) assembleDirect(entries []*svcEntry) (map[netip.AddrPort]string, map[uint16]map[string]bool) {
	direct, directChains := directMaps(entries)
	rt.headlessRoute = nil
	if routes := routeMap(entries, func(e *svcEntry) []vipRoute { return e.directRoutes }); len(routes) > 0 {
		rt.headlessRoute = captureRoute(CaptureHeadlessRouteName, routes)
	}
	rt.directInMatcher = len(direct) > maxHeadlessMap || headlessExprLen(direct) > maxHeadlessExpr
	if rt.directInMatcher {
		rt.headlessFilter = headlessFilter(nil)
	} else {
		rt.headlessFilter = headlessFilter(direct)
	}
	return direct, directChains
}

// maxHeadlessMap is the most entries headlessFilter's CEL map holds. Envoy 1.40 parses the
// expression once per capture listener on every ECDS update and evaluates the map literal per
// connection on the headless target ports, both in time growing with its size (with 2008
// entries: 20 ms per listener and 60 us per connection; with 6000 Envoy did not become ready
// within a minute; docs/node-proxy.md, "Headless Services"). Above it, the endpoints' addresses
// are entries of the capture matcher, as before the ECDS filter (every endpoint change then
// updates every pod's capture listener, in place).
const maxHeadlessMap = 1000

// maxHeadlessExpr is the longest headlessFilter expression, in bytes, below the CEL parser's
// default limit of 100,000 code points (cel-cpp parser/options.h, expression_size_codepoint_limit;
// Envoy's CEL formatter parses with the default options): each entry repeats its chain's name,
// which holds the Service's mesh name, so 1000 entries of long Service and namespace names need
// about 180,000 bytes, and Envoy would reject the filter for the whole node. Above it, as above
// maxHeadlessMap, the addresses are matcher entries.
const maxHeadlessExpr = 90_000

// headlessExprLen is an upper bound of the length of headlessExpr(direct)'s maps, without the
// port conditions: each entry's quoted key and value and separators, escaped (celQuote).
func headlessExprLen(direct map[netip.AddrPort]string) int {
	n := 0
	for dst, chain := range direct {
		n += 2*len(dst.String()) + 2*len(chain) + 8
	}
	return n
}

// withDirect is rt with the headless route table and the headless filter assembled again from
// entries, for a build in which headless Services' endpoint addresses changed and nothing else of
// the routing (sharedRoutingEqual): the matcher, the chains, the capture route and the lane
// route are rt's values, known valid when rt's were, so the pods' capture listeners and the VIP
// route table stay the same values too (nothing of them is sent). The headless route table is
// present in both or in neither (sharedRoutingEqual compares the chains of the target ports). It
// returns nil when the addresses are or become matcher entries (directInMatcher): the matcher
// changes, and the caller assembles the routing whole.
func (rt *routing) withDirect(entries []*svcEntry) *routing {
	if rt.directInMatcher {
		return nil
	}
	n := &routing{captureMatcher: rt.captureMatcher, captureChains: rt.captureChains, captureRoute: rt.captureRoute, laneRoute: rt.laneRoute,
		sharedValid: rt.valid || rt.sharedValid, vipRouteValid: rt.valid || rt.vipRouteValid}
	if n.assembleDirect(entries); n.directInMatcher {
		return nil
	}
	return n
}

// chainAction is the filter-chain matcher action selecting the chain named name.
func chainAction(name string) *xdsmatcher.Matcher_OnMatch {
	a, _ := anypb.New(wrapperspb.String(name))
	return &xdsmatcher.Matcher_OnMatch{OnMatch: &xdsmatcher.Matcher_OnMatch_Action{
		Action: &xdscore.TypedExtensionConfig{Name: name, TypedConfig: a}}}
}

// directMatcher is the capture matcher's part for one target port of headless Services, below the
// VIPs: the filter state DirectFilterStateKey (set by HeadlessFilterName) names the chain, one of
// chains; no match (not a headless endpoint) leaves the default chain.
func directMatcher(chains map[string]bool) *xdsmatcher.Matcher {
	fs, _ := anypb.New(&netinputsv3.FilterStateInput{Key: DirectFilterStateKey})
	m := make(map[string]*xdsmatcher.Matcher_OnMatch, len(chains))
	for c := range chains {
		m[c] = chainAction(c)
	}
	return &xdsmatcher.Matcher{MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
		Input:    &xdscore.TypedExtensionConfig{Name: "direct", TypedConfig: fs},
		TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: m}},
	}}}
}

// headlessFilter is the ECDS resource HeadlessFilterName: a set_filter_state listener filter
// that sets DirectFilterStateKey (envoy.string) to the chain of the restored destination
// "<ip>:<port>" (CEL's destination.address: IPv6 in brackets, as netip.AddrPort writes it),
// looked up in a CEL map literal of the headless endpoints on the destination's port (one map
// per target port, each behind a test of destination.port; CEL evaluates only the chosen branch
// of a conditional, so a connection builds only its own port's map, and one to another port
// costs a comparison per headless target port; sorted, so equal maps give equal resources). A
// destination not in the map fails the lookup, which with omit_empty_values is empty, and
// skip_if_empty sets nothing: the capture matcher then picks no headless chain. Without entries
// the filter sets nothing (no on_accept value), so a node without headless endpoints evaluates
// no CEL per connection; the listeners' reference to the filter stays (headlessRef).
// TestPrivilegedEnvoyFactCELFilterStateMatch checks both forms with Envoy 1.40.
func headlessFilter(direct map[netip.AddrPort]string) *core.TypedExtensionConfig {
	if len(direct) == 0 {
		cfg, _ := anypb.New(&sfslistenerv3.Config{})
		return &core.TypedExtensionConfig{Name: HeadlessFilterName, TypedConfig: cfg}
	}
	cel, _ := anypb.New(&celv3.Cel{})
	cfg, _ := anypb.New(&sfslistenerv3.Config{OnAccept: []*sfsv3.FilterStateValue{{
		Key:         &sfsv3.FilterStateValue_ObjectKey{ObjectKey: DirectFilterStateKey},
		FactoryKey:  "envoy.string",
		SkipIfEmpty: true,
		Value: &sfsv3.FilterStateValue_FormatString{FormatString: &core.SubstitutionFormatString{
			Format:     &core.SubstitutionFormatString_TextFormatSource{TextFormatSource: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: headlessExpr(direct)}}},
			Formatters: []*core.TypedExtensionConfig{{Name: "envoy.formatter.cel", TypedConfig: cel}},
			// A failed lookup is an evaluation error, which the formatter writes as "-" unless
			// empty values are omitted; omitted, it is empty, and skip_if_empty sets nothing.
			OmitEmptyValues: true,
		}},
	}}})
	return &core.TypedExtensionConfig{Name: HeadlessFilterName, TypedConfig: cfg}
}

// headlessExpr is headlessFilter's format string for a non-empty direct (address and port to
// chain): "%CEL(destination.port == P1 ? {'<ip>:<P1>': '<chain>', ...}[destination.address] :
// destination.port == P2 ? ... : <the empty string>)%", one map per port, ports ascending,
// entries in address order, strings escaped (celQuote).
func headlessExpr(direct map[netip.AddrPort]string) string {
	byPort := map[uint16][]netip.AddrPort{}
	for dst := range direct {
		byPort[dst.Port()] = append(byPort[dst.Port()], dst)
	}
	var expr strings.Builder
	expr.WriteString("%CEL(")
	for _, port := range slices.Sorted(maps.Keys(byPort)) {
		dsts := byPort[port]
		slices.SortFunc(dsts, netip.AddrPort.Compare)
		fmt.Fprintf(&expr, "destination.port == %d ? {", port)
		for i, dst := range dsts {
			if i > 0 {
				expr.WriteString(", ")
			}
			fmt.Fprintf(&expr, "'%s': '%s'", celQuote.Replace(dst.String()), celQuote.Replace(direct[dst]))
		}
		expr.WriteString("}[destination.address] : ")
	}
	expr.WriteString("'')%")
	return expr.String()
}

// celQuote escapes a string for a single-quoted CEL string literal (CEL language definition,
// "String and Bytes Values"): a backslash and a quote are escaped. Addresses and chain names
// (DNS names, checked where they enter the model) hold neither; this keeps a name that slipped
// through from ending the literal, which would change the expression or make Envoy reject the
// filter on every capture listener.
var celQuote = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

// headlessRef is the capture listeners' ECDS reference (ListenerFilter.config_discovery over
// ADS) to HeadlessFilterName. It is the same in every build: a listener whose listener filters
// change is replaced and its connections drained, while one whose filter chains or matcher
// alone change is updated in place (ListenerMessageUtil::filterChainOnlyChange).
func headlessRef() *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{
		Name: HeadlessFilterName,
		ConfigType: &listenerv3.ListenerFilter_ConfigDiscovery{ConfigDiscovery: &core.ExtensionConfigSource{
			ConfigSource: adsSource(),
			TypeUrls:     []string{"type.googleapis.com/envoy.extensions.filters.listener.set_filter_state.v3.Config"},
		}},
	}
}

// captureRoute is a route configuration of every pod's capture HTTP chains, named name
// (CaptureRouteName for the VIPs, CaptureHeadlessRouteName for headless Services' pods): one
// virtual host whose matcher maps the original destination "ip:port" (the DstHeader the capture
// HTTP connection manager writes before routing, from %DOWNSTREAM_LOCAL_ADDRESS%) to the
// service port's cluster, whatever Host the client used; without routes, a 404 for every request.
// The lookup is a hash map, so the route table's cost per request does not grow with the number
// of services. The header is removed before the request leaves.
func captureRoute(name string, m map[string]*xdsmatcher.Matcher_OnMatch) *routev3.RouteConfiguration {
	vh := &routev3.VirtualHost{Name: name, Domains: []string{"*"}}
	if len(m) > 0 {
		input, _ := anypb.New(&matcherv3.HttpRequestHeaderMatchInput{HeaderName: DstHeader})
		vh.Matcher = &xdsmatcher.Matcher{MatcherType: &xdsmatcher.Matcher_MatcherTree_{MatcherTree: &xdsmatcher.Matcher_MatcherTree{
			Input:    &xdscore.TypedExtensionConfig{Name: "original-destination", TypedConfig: input},
			TreeType: &xdsmatcher.Matcher_MatcherTree_ExactMatchMap{ExactMatchMap: &xdsmatcher.Matcher_MatcherTree_MatchMap{Map: m}},
		}}}
	} else {
		vh.Routes = []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 404}},
		}}
	}
	return &routev3.RouteConfiguration{
		Name:                   name,
		VirtualHosts:           []*routev3.VirtualHost{vh},
		RequestHeadersToRemove: []string{DstHeader},
	}
}

// laneVirtualHosts are one service's virtual hosts in the explicit HTTP lane's route
// configuration (LaneRouteName): one per HTTP port, answering the service's mesh names
// (<svc>.<ns>.<meshDomain>, the short <svc>.<meshDomain> when the service owns it, given as
// short, <svc>.<ns>.svc.clusterset.local when imported), each also with ":<port>"; a name without
// a port goes to the service's first HTTP port.
func (b *builder) laneVirtualHosts(s *model.Service, short string) []*routev3.VirtualHost {
	if !hasClusters(s) {
		return nil // no cluster to route to (hasClusters)
	}
	var vhs []*routev3.VirtualHost
	names := []string{b.m.FQDN(s.Key)}
	if short != "" {
		names = append(names, short)
	}
	if s.Imported {
		names = append(names, model.ClustersetName(s.Key))
	}
	first := true
	for _, sp := range s.Ports {
		if !sp.Protocol.IsHTTP() {
			continue
		}
		var domains []string
		for _, n := range names {
			if first {
				domains = append(domains, n)
			}
			domains = append(domains, n+":"+strconv.FormatUint(uint64(sp.Port), 10))
		}
		first = false
		cn := ClusterName(b.m, s.Key, sp.Port)
		vhs = append(vhs, &routev3.VirtualHost{Name: cn, Domains: domains, Routes: []*routev3.Route{routeTo(cn)}})
	}
	return vhs
}

// ---- per-pod listeners ----

// identityValue is the filter-state value every pod listener sets first: it names the pod's SVID
// secret for the upstream certificate selector. The value is an envoy.hashable_string shared with
// upstream, so pooled upstream connections are partitioned per source identity (a plain
// envoy.string is not hashed into the pool key: pods would share connections, see
// TestPrivilegedEnvoyFactDynamicUpstreamCertSelector and docs/node-proxy.md).
func identityValue(spiffeID string) []*sfsv3.FilterStateValue {
	return []*sfsv3.FilterStateValue{{
		Key:                &sfsv3.FilterStateValue_ObjectKey{ObjectKey: CertMapperFilterStateKey},
		FactoryKey:         "envoy.hashable_string",
		Value:              &sfsv3.FilterStateValue_FormatString{FormatString: &core.SubstitutionFormatString{Format: &core.SubstitutionFormatString_TextFormatSource{TextFormatSource: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: spiffeID}}}}},
		SharedWithUpstream: sfsv3.FilterStateValue_ONCE,
	}}
}

// identityFilter is the set_filter_state network filter that starts the lane listener's chain
// (identityValue).
func identityFilter(spiffeID string) (*listenerv3.Filter, error) {
	cfg, err := toAny(&sfsnetv3.Config{OnNewConnection: identityValue(spiffeID)})
	if err != nil {
		return nil, err
	}
	return &listenerv3.Filter{Name: "envoy.filters.network.set_filter_state", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: cfg}}, nil
}

// identityListenerFilter is the set_filter_state listener filter (on accept, before the filter
// chain is chosen) of the capture listener (identityValue). As a network filter it would be
// repeated in every chain: with one floor chain per TCP service port that doubled the filters
// Envoy builds per pod (at 10k services, 2000 floor chains: adding a pod took twice as long).
func identityListenerFilter(spiffeID string) (*listenerv3.ListenerFilter, error) {
	return listenerFilter("envoy.filters.listener.set_filter_state", &sfslistenerv3.Config{OnAccept: identityValue(spiffeID)})
}

func routerFilter() (*hcmv3.HttpFilter, error) {
	r, err := toAny(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: r}}, nil
}

func hcmFilter(h *hcmv3.HttpConnectionManager) (*listenerv3.Filter, error) {
	rf, err := routerFilter()
	if err != nil {
		return nil, err
	}
	h.CodecType = hcmv3.HttpConnectionManager_AUTO
	h.HttpFilters = []*hcmv3.HttpFilter{rf}
	a, err := toAny(h)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Filter{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}, nil
}

func rdsHCM(stat, route string) (*listenerv3.Filter, error) {
	return hcmFilter(&hcmv3.HttpConnectionManager{
		StatPrefix: stat,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: adsSource(), RouteConfigName: route,
		}},
	})
}

func tcpProxy(stat, cluster string) (*listenerv3.Filter, error) {
	a, err := toAny(&tcpv3.TcpProxy{StatPrefix: stat, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})
	if err != nil {
		return nil, err
	}
	return &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}, nil
}

func listenerFilter(name string, m proto.Message) (*listenerv3.ListenerFilter, error) {
	a, err := toAny(m)
	if err != nil {
		return nil, err
	}
	return &listenerv3.ListenerFilter{Name: name, ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: a}}, nil
}

// podFreebind is Listener.freebind of every per-pod listener: Envoy binds them with IP_FREEBIND
// (IPV6_FREEBIND for IPv6), so an address that is not (or no longer) on an interface of the pod's
// netns does not fail the bind. Without it one such pod made Envoy reject the LDS update with
// "cannot bind ... Cannot assign requested address", and every later update too, since each
// snapshot holds that pod's listeners: no pod listener on the node changed again and every CNI
// ADD on the node failed waiting for the ACK. A pod with NET_ADMIN can remove its own address
// (then any Envoy restart rebinds), an IPv6 address is unbindable while DAD is tentative, and a
// chained plugin's prevResult may name an address it never configured. A listener bound with
// freebind serves as soon as the address appears (TestPrivilegedPodAddressAbsent); until then
// it receives nothing, as the pod would not either.
func podFreebind() *wrapperspb.BoolValue { return wrapperspb.Bool(true) }

// podListeners builds the three listeners of one local pod (capture, explicit lane, inbound) and
// the inbound clusters that reach its application ports.
func (b *builder) podListeners(p *model.LocalPod) ([]*listenerv3.Listener, []*clusterv3.Cluster, error) {
	id := p.SPIFFEID(b.m.TrustDomain)
	capture, err := b.captureListener(p, id)
	if err != nil {
		return nil, nil, err
	}
	lane, err := b.laneListener(p, id)
	if err != nil {
		return nil, nil, err
	}
	ls := []*listenerv3.Listener{capture, lane}
	inbound, cs, err := b.inboundListener(p, id)
	if err != nil {
		return nil, nil, err
	}
	if inbound != nil {
		ls = append(ls, inbound)
	}
	return ls, cs, nil
}

// captureListener is the pod's capture listener on 127.0.0.1:15001 inside its netns (the capture
// redirect's target). original_dst restores the VIP and port the application dialled, and the
// listener's filter_chain_matcher (a hash map on destination port, then IP) picks the chain:
// an HTTP service port goes to the one HTTP chain (an HTTP connection manager whose codec AUTO
// tells HTTP/1.1 from HTTP/2, routing on the original destination, see captureRoute), a TCP
// service port to its floor chain (tcp_proxy over mTLS to the port's cluster), anything else to
// the default chain that passes it through to the original destination. No listener filter waits
// for client bytes, so a server-first protocol never stalls (docs/node-proxy.md explains the
// layout).
func (b *builder) captureListener(p *model.LocalPod, id string) (*listenerv3.Listener, error) {
	od, err := listenerFilter("envoy.filters.listener.original_dst", &origdstv3.OriginalDst{})
	if err != nil {
		return nil, err
	}
	idf, err := identityListenerFilter(id)
	if err != nil {
		return nil, err
	}
	l := &listenerv3.Listener{
		Name:               captureListenerName(p),
		Address:            socketAddress("127.0.0.1", CapturePort, p.NetnsPath),
		Freebind:           podFreebind(),
		ListenerFilters:    []*listenerv3.ListenerFilter{od, idf, b.headlessRef},
		DefaultFilterChain: &listenerv3.FilterChain{Name: "passthrough", Filters: []*listenerv3.Filter{b.passthrough}},
	}
	if b.captureMatcher == nil {
		return l, nil
	}
	l.FilterChainMatcher, l.FilterChains = b.captureMatcher, b.captureChains
	return l, nil
}

// laneListener is the explicit HTTP lane on 127.0.0.1:18081 inside the pod's netns: the Host
// header picks the service (LaneRouteName).
func (b *builder) laneListener(p *model.LocalPod, id string) (*listenerv3.Listener, error) {
	idf, err := identityFilter(id)
	if err != nil {
		return nil, err
	}
	h, err := rdsHCM("lane_http", LaneRouteName)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{
		Name:         laneListenerName(p),
		Address:      socketAddress("127.0.0.1", LanePort, p.NetnsPath),
		Freebind:     podFreebind(),
		FilterChains: []*listenerv3.FilterChain{{Name: "lane", Filters: []*listenerv3.Filter{idf, h}}},
	}, nil
}

// inboundPort is one application port a local pod serves through 15008.
type inboundPort struct {
	port     uint32
	protocol model.Protocol
	// waypoint SNIs "<port>.<svc>.<ns>.<meshDomain>" of the services the pod backs on this port.
	waypointSNIs []string
}

// inboundPorts lists the target ports the pod serves: its registered endpoint ports in this
// cluster and its declared container ports, sorted by port.
func (b *builder) inboundPorts(p *model.LocalPod) []inboundPort {
	byPort := map[uint32]*inboundPort{}
	add := func(port uint32, proto model.Protocol) *inboundPort {
		ip := byPort[port]
		if ip == nil {
			if proto == "" {
				proto = model.ProtocolHTTP
			}
			ip = &inboundPort{port: port, protocol: proto}
			byPort[port] = ip
		}
		return ip
	}
	// The registered endpoints first: their port protocols already apply the service model's
	// precedence (the Service's appProtocol, then the pod annotation, then HTTP), which the pod's
	// own ports (annotation or HTTP) do not know.
	for _, ep := range b.localEndpoints[p.UID] {
		for _, epp := range ep.Ports {
			if epp.Protocol == model.ProtocolUDP {
				continue
			}
			ip := add(epp.Port, epp.Protocol)
			ip.waypointSNIs = append(ip.waypointSNIs, WaypointSNI(b.m, ep.Service, epp.Port))
		}
	}
	for _, pp := range p.Ports {
		if pp.Protocol != model.ProtocolUDP {
			add(pp.Port, pp.Protocol)
		}
	}
	out := make([]inboundPort, 0, len(byPort))
	for _, port := range slices.Sorted(mapKeys(byPort)) {
		ip := byPort[port]
		slices.Sort(ip.waypointSNIs)
		ip.waypointSNIs = slices.Compact(ip.waypointSNIs)
		out = append(out, *ip)
	}
	return out
}

// inboundListener is the pod's mTLS listener on pod_ip:15008 inside its netns: TLS with the pod's
// SVID, a client certificate from the trust domain required, one filter chain per served port
// selected by SNI "<port>" (and the exact waypoint SNIs), then HTTP (the caller's identity
// forwarded as XFCC, SANITIZE_SET with the URI) or raw TCP to the application. A connection gets
// Options.HandshakeTimeout to send its ClientHello and as long again to finish the handshake. It
// returns nil when the pod serves no port.
func (b *builder) inboundListener(p *model.LocalPod, id string) (*listenerv3.Listener, []*clusterv3.Cluster, error) {
	ports := b.inboundPorts(p)
	if len(ports) == 0 {
		return nil, nil, nil
	}
	ip, ok := model.MeshAddr(p.IPs)
	if !ok {
		return nil, nil, fmt.Errorf("inbound listener: pod has no IP")
	}
	ti, err := listenerFilter("envoy.filters.listener.tls_inspector", &tlsinspv3.TlsInspector{})
	if err != nil {
		return nil, nil, err
	}
	dtc, err := toAny(&tlsv3.DownstreamTlsContext{
		RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsRef(InboundSecretName(id))},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext: &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
					SanType: tlsv3.SubjectAltNameMatcher_URI,
					Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + b.m.TrustDomain + "/"}},
				}}},
				ValidationContextSdsSecretConfig: sdsRef(TrustBundleSecret),
			}},
		},
	})
	if err != nil {
		return nil, nil, err
	}
	ts := &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: dtc}}
	// Bounds tls_inspector's wait for the ClientHello, then each chain's handshake.
	handshake := b.opts.handshakeTimeout()
	l := &listenerv3.Listener{
		Name:                   inboundListenerName(p),
		Address:                socketAddress(ip.String(), InboundPort, p.NetnsPath),
		Freebind:               podFreebind(),
		ListenerFilters:        []*listenerv3.ListenerFilter{ti},
		ListenerFiltersTimeout: handshake,
	}
	var clusters []*clusterv3.Cluster
	for _, ipt := range ports {
		cn := inboundClusterName(p, ipt.port)
		var f *listenerv3.Filter
		if ipt.protocol.IsHTTP() {
			f, err = hcmFilter(&hcmv3.HttpConnectionManager{
				StatPrefix:                  "inbound_http",
				ForwardClientCertDetails:    hcmv3.HttpConnectionManager_SANITIZE_SET,
				SetCurrentClientCertDetails: &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Uri: true},
				RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
					Name:         cn,
					VirtualHosts: []*routev3.VirtualHost{{Name: cn, Domains: []string{"*"}, Routes: []*routev3.Route{routeTo(cn)}}},
					// An inline route table is checked against the known clusters by default
					// (RouteConfiguration.validate_clusters). The inbound cluster arrives in the same
					// snapshot but over CDS, which the non-ADS-ordered cache may deliver after LDS:
					// Envoy would NACK the listener. Unknown clusters answer 503 for those
					// milliseconds instead.
					ValidateClusters: wrapperspb.Bool(false),
				}},
			})
		} else {
			f, err = tcpProxy("inbound_tcp", cn)
		}
		if err != nil {
			return nil, nil, err
		}
		sni := append([]string{strconv.FormatUint(uint64(ipt.port), 10)}, ipt.waypointSNIs...)
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			Name:                          strconv.FormatUint(uint64(ipt.port), 10),
			FilterChainMatch:              &listenerv3.FilterChainMatch{ServerNames: sni, TransportProtocol: "tls"},
			TransportSocket:               ts,
			TransportSocketConnectTimeout: handshake,
			Filters:                       []*listenerv3.Filter{f},
		})
		c, err := b.inboundCluster(p, ipt)
		if err != nil {
			return nil, nil, err
		}
		clusters = append(clusters, c)
	}
	return l, clusters, nil
}

// inboundCluster reaches one application port of a local pod at 127.0.0.1:<port> from inside the
// pod's netns (Cluster.upstream_bind_config with network_namespace_filepath; an endpoint address
// may not carry a namespace in Envoy 1.40). Applications bound to the pod's loopback or to the
// wildcard address are both reached; strict-mode capture lets loopback traffic through.
func (b *builder) inboundCluster(p *model.LocalPod, ipt inboundPort) (*clusterv3.Cluster, error) {
	cn := inboundClusterName(p, ipt.port)
	c := &clusterv3.Cluster{
		Name:                 cn,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       b.opts.connectTimeout(),
		UpstreamBindConfig: &core.BindConfig{SourceAddress: &core.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: 0}, NetworkNamespaceFilepath: p.NetnsPath,
		}},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: cn, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress("127.0.0.1", ipt.port, ""),
			}}}},
		}}},
	}
	if err := setUpstreamProtocol(c, ipt.protocol); err != nil {
		return nil, err
	}
	return c, nil
}
