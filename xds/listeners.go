package xds

import (
	"fmt"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	netrbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	"maps"
	"slices"
	"strconv"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	sfsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/set_filter_state/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	origdstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	sfslistenerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/set_filter_state/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	sfsnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/set_filter_state/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// podListeners builds the three listeners of one local pod (capture, explicit lane, inbound), the
// pod's clusters (its passthrough cluster and the inbound clusters that reach its application
// ports) and, for a pod that authorization policies select, the ECDS resources of its inbound
// chains' RBAC filters (authzExtensions).
func (b *builder) podListeners(p *model.LocalPod) ([]*listenerv3.Listener, []*clusterv3.Cluster, []*core.TypedExtensionConfig, error) {
	id := p.SPIFFEID(b.m.TrustDomain)
	capture, err := b.captureListener(p, id)
	if err != nil {
		return nil, nil, nil, err
	}
	var own []*clusterv3.Cluster
	if !b.opts.passthroughFromNode {
		own = []*clusterv3.Cluster{passthroughCluster(p, b.opts)}
	}
	lane, err := laneListener(p, id)
	if err != nil {
		return nil, nil, nil, err
	}
	ls := []*listenerv3.Listener{capture, lane}
	inbound, cs, xs, err := b.inboundListener(p, id)
	if err != nil {
		return nil, nil, nil, err
	}
	if inbound != nil {
		ls = append(ls, inbound)
	}
	return ls, append(own, cs...), xs, nil
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
	od, err := xdsproto.ListenerFilter("envoy.filters.listener.original_dst", &origdstv3.OriginalDst{})
	if err != nil {
		return nil, err
	}
	idf, err := identityListenerFilter(id)
	if err != nil {
		return nil, err
	}
	passName := PassthroughClusterName(p)
	if b.opts.passthroughFromNode {
		passName = sharedPassthroughName
	}
	pass, err := xdsproto.TCPProxy("passthrough", passName)
	if err != nil {
		return nil, err
	}
	l := &listenerv3.Listener{
		Name:               captureListenerName(p),
		Address:            xdsproto.SocketAddress("127.0.0.1", CapturePort, p.NetnsPath),
		Freebind:           podFreebind(),
		ListenerFilters:    []*listenerv3.ListenerFilter{od, idf, b.headlessRef},
		DefaultFilterChain: &listenerv3.FilterChain{Name: "passthrough", Filters: []*listenerv3.Filter{pass}},
	}
	if b.captureMatcher == nil {
		return l, nil
	}
	l.FilterChainMatcher, l.FilterChains = b.captureMatcher, b.captureChains
	if b.captureTLS != nil {
		// Only while a TLSRoute is bound, and only on its ports (tlsInspector): a connection to
		// such a port that sends nothing goes on without SNI after TLSInspectTimeout.
		l.ListenerFilters = append(l.ListenerFilters, b.captureTLS)
		l.ListenerFiltersTimeout = durationpb.New(TLSInspectTimeout)
		l.ContinueOnListenerFiltersTimeout = true
	}
	return l, nil
}

// laneListener is the explicit HTTP lane on 127.0.0.1:18081 inside the pod's netns: the Host
// header picks the service (LaneRouteName). id is the pod's SPIFFE ID (identityFilter).
func laneListener(p *model.LocalPod, id string) (*listenerv3.Listener, error) {
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
		Address:      xdsproto.SocketAddress("127.0.0.1", LanePort, p.NetnsPath),
		Freebind:     podFreebind(),
		FilterChains: []*listenerv3.FilterChain{{Name: "lane", Filters: []*listenerv3.Filter{idf, h}}},
	}, nil
}

// inboundListener is the pod's mTLS listener on pod_ip:15008 inside its netns: TLS with the pod's
// SVID, a client certificate from the trust domain required, one filter chain per served port
// selected by SNI "<port>" (and the exact waypoint SNIs), then HTTP (the caller's identity
// forwarded as XFCC, SANITIZE_SET with the URI) or raw TCP to the application. A connection gets
// Options.HandshakeTimeout to send its ClientHello and as long again to finish the handshake.
// Every chain has the RBAC filters of authz.go (configs without rules, enforcing nothing, for a
// pod no authorization policy selects: Mesh.Authz), an access log of denials, and, on HTTP
// chains, normalized paths (normalize_path, merge_slashes: a path rule must see the path the
// application will); it returns their ECDS resources too. It returns nil when the pod serves no
// port.
func (b *builder) inboundListener(p *model.LocalPod, id string) (*listenerv3.Listener, []*clusterv3.Cluster, []*core.TypedExtensionConfig, error) {
	ports := inboundPorts(b.m, p, b.localEndpoints[p.UID])
	if len(ports) == 0 {
		return nil, nil, nil, nil
	}
	ip, ok := model.MeshAddr(p.IPs)
	if !ok {
		return nil, nil, nil, fmt.Errorf("inbound listener: pod has no IP")
	}
	policies := b.m.Authz[p.UID]
	ti, err := xdsproto.TLSInspector()
	if err != nil {
		return nil, nil, nil, err
	}
	ts, err := tlsSocket(&tlsv3.DownstreamTlsContext{
		RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsRef(InboundSecretName(id))},
			ValidationContextType:          peerValidation(trustDomainSANs(b.peerTrustDomains), TrustBundleSecret),
		},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	// Bounds tls_inspector's wait for the ClientHello, then each chain's handshake.
	handshake := b.opts.handshakeTimeout()
	l := &listenerv3.Listener{
		Name:                   inboundListenerName(p),
		Address:                xdsproto.SocketAddress(ip.String(), InboundPort, p.NetnsPath),
		Freebind:               podFreebind(),
		ListenerFilters:        []*listenerv3.ListenerFilter{ti},
		ListenerFiltersTimeout: handshake,
	}
	var clusters []*clusterv3.Cluster
	var exts []*core.TypedExtensionConfig
	for _, ipt := range ports {
		cn := inboundClusterName(p, ipt.port)
		var filters []*listenerv3.Filter
		var f *listenerv3.Filter
		// Every chain has its RBAC filters, with or without policies (no policy: RBAC configs
		// without rules, which enforce nothing), so that a pod's first policy, or its last going,
		// changes ECDS resources only, never the listener: a listener change would leave the
		// connections opened before it on the old chains, without RBAC, until they drain.
		xs, err := authzExtensions(b.peerTrustDomains, p, policies, ipt)
		if err != nil {
			return nil, nil, nil, err
		}
		exts = append(exts, xs...)
		al, err := authzAccessLog(p, ipt.port, ipt.protocol.IsHTTP())
		if err != nil {
			return nil, nil, nil, err
		}
		if ipt.protocol.IsHTTP() {
			h := &hcmv3.HttpConnectionManager{
				StatPrefix:                  "inbound_http",
				ForwardClientCertDetails:    hcmv3.HttpConnectionManager_SANITIZE_SET,
				SetCurrentClientCertDetails: &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Uri: true},
				RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
					Name:         cn,
					VirtualHosts: []*routev3.VirtualHost{{Name: cn, Domains: []string{"*"}, Routes: []*routev3.Route{routeTo(cn)}}},
					// The caller's Envoy names its mirror cluster in these (MirrorHeader): the
					// application never sees them.
					RequestHeadersToRemove: mirrorHeaders,
					// An inline route table is checked against the known clusters by default
					// (RouteConfiguration.validate_clusters). The inbound cluster arrives in the same
					// snapshot but over CDS, which the non-ADS-ordered cache may deliver after LDS:
					// Envoy would NACK the listener. Unknown clusters answer 503 for those
					// milliseconds instead.
					ValidateClusters: wrapperspb.Bool(false),
				}},
			}
			h.AccessLog = []*accesslogv3.AccessLog{al}
			h.NormalizePath, h.MergeSlashes = wrapperspb.Bool(true), true
			f, err = hcmFilter(h, authzHTTPFilters(p, ipt.port)...)
		} else {
			filters = authzNetworkFilters(p, ipt.port)
			f, err = authzTCPProxy("inbound_tcp", cn, al)
		}
		if err != nil {
			return nil, nil, nil, err
		}
		sni := append([]string{strconv.FormatUint(uint64(ipt.port), 10)}, ipt.waypointSNIs...)
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			Name:                          strconv.FormatUint(uint64(ipt.port), 10),
			FilterChainMatch:              &listenerv3.FilterChainMatch{ServerNames: sni, TransportProtocol: "tls"},
			TransportSocket:               ts,
			TransportSocketConnectTimeout: handshake,
			Filters:                       append(append(b.trustDomainGuard(), filters...), f),
		})
		c, err := inboundCluster(p, ipt, b.opts.ConnectTimeout)
		if err != nil {
			return nil, nil, nil, err
		}
		clusters = append(clusters, c)
	}
	return l, clusters, exts, nil
}

// inboundPort is one application port a local pod serves through 15008.
type inboundPort struct {
	port     uint32
	protocol model.Protocol
	// waypoint SNIs "<port>.<svc>.<ns>.<meshDomain>" of the services the pod backs on this port.
	waypointSNIs []string
}

// inboundPorts lists the target ports the pod p of m serves: its registered endpoint ports in
// this cluster (local, its endpoints) and its declared container ports, sorted by port.
func inboundPorts(m *model.Mesh, p *model.LocalPod, local []model.Endpoint) []inboundPort {
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
	for _, ep := range local {
		for _, epp := range ep.Ports {
			if epp.Protocol == model.ProtocolUDP {
				continue
			}
			ip := add(epp.Port, epp.Protocol)
			ip.waypointSNIs = append(ip.waypointSNIs, WaypointSNI(m, ep.Service, epp.Port))
		}
	}
	for _, pp := range p.Ports {
		if pp.Protocol != model.ProtocolUDP {
			add(pp.Port, pp.Protocol)
		}
	}
	out := make([]inboundPort, 0, len(byPort))
	for _, port := range slices.Sorted(maps.Keys(byPort)) {
		ip := byPort[port]
		slices.Sort(ip.waypointSNIs)
		ip.waypointSNIs = slices.Compact(ip.waypointSNIs)
		out = append(out, *ip)
	}
	return out
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
	return xdsproto.NetworkFilter("envoy.filters.network.set_filter_state", &sfsnetv3.Config{OnNewConnection: identityValue(spiffeID)})
}

// identityListenerFilter is the set_filter_state listener filter (on accept, before the filter
// chain is chosen) of the capture listener (identityValue). As a network filter it would be
// repeated in every chain: with one floor chain per TCP service port that doubled the filters
// Envoy builds per pod (docs/node-proxy.md, "Measurements").
func identityListenerFilter(spiffeID string) (*listenerv3.ListenerFilter, error) {
	return xdsproto.ListenerFilter("envoy.filters.listener.set_filter_state", &sfslistenerv3.Config{OnAccept: identityValue(spiffeID)})
}

// hcmFilter is the network filter of the HTTP connection manager h, completed with codec AUTO
// (HTTP/1.1 or HTTP/2 by the first bytes) and the HTTP filters pre followed by the router.
func hcmFilter(h *hcmv3.HttpConnectionManager, pre ...*hcmv3.HttpFilter) (*listenerv3.Filter, error) {
	rf, err := routerFilter()
	if err != nil {
		return nil, err
	}
	h.CodecType = hcmv3.HttpConnectionManager_AUTO
	h.HttpFilters = append(slices.Clone(pre), rf)
	return xdsproto.NetworkFilter("envoy.filters.network.http_connection_manager", h)
}

// CORSFilterName is the HTTP filter of the capture connection managers that answers CORS
// preflights and sets the CORS response headers of a GAMMA rule's CORS filter (GEP-1767): the
// rule's route carries its policy as typed_per_filter_config under this name (corsPolicy); on
// a route without one the filter does nothing.
const CORSFilterName = "envoy.filters.http.cors"

// corsFilter is the HTTP filter CORSFilterName. It is in every capture connection manager
// whether or not a route uses CORS, so that the first CORS route changes a route table only,
// never the listeners (a listener change drains the pods' connections).
func corsFilter() (*hcmv3.HttpFilter, error) {
	c, err := xdsproto.ToAny(&corsv3.Cors{})
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: CORSFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: c}}, nil
}

// routerFilter is the HTTP filter envoy.filters.http.router, the last of every connection manager.
func routerFilter() (*hcmv3.HttpFilter, error) {
	r, err := xdsproto.ToAny(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: r}}, nil
}

// rdsHCM is the network filter of an HTTP connection manager with stat prefix stat whose routes are
// the route configuration route, over RDS (ADS).
func rdsHCM(stat, route string) (*listenerv3.Filter, error) {
	return hcmFilter(&hcmv3.HttpConnectionManager{
		StatPrefix: stat,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: xdsproto.ADS(), RouteConfigName: route,
		}},
	})
}

// trustDomainSANs admits a caller whose URI SAN is an ID of one of the trust domains tds (the
// mesh's own and the federated ones: those the SPIFFE validator holds a bundle of), one prefix
// matcher "spiffe://<td>/" each.
func trustDomainSANs(tds []string) []*tlsv3.SubjectAltNameMatcher {
	out := make([]*tlsv3.SubjectAltNameMatcher, len(tds))
	for i, td := range tds {
		out[i] = &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + td + "/"}}}
	}
	return out
}

// trustDomainGuard is the network filters every inbound chain starts with: with more than one
// trust domain admitted (Options.PeerTrustDomains), an RBAC filter refusing a client certificate
// with URI SANs of two of them. Envoy's SPIFFE validator checks the chain against the bundle of
// the trust domain of the first URI SAN only, and SAN matchers and RBAC principals match any
// URI SAN: without the guard one trust domain's CA could add another's ID to a certificate of its
// own and pass as it (an X.509-SVID has exactly one URI SAN: X.509-SVID, section 2). None with
// one trust domain: its own CA is the only one trusted.
func (b *builder) trustDomainGuard() []*listenerv3.Filter {
	return b.tdGuard
}

// newTrustDomainGuard builds trustDomainGuard's filter for tds (sorted); nil for fewer than two.
func newTrustDomainGuard(tds []string) ([]*listenerv3.Filter, error) {
	if len(tds) < 2 {
		return nil, nil
	}
	prefix := func(td string) *rbacv3.Principal {
		return &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{
			PrincipalName: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + td + "/"}}}}}
	}
	var pairs []*rbacv3.Principal
	for i := range tds {
		for j := i + 1; j < len(tds); j++ {
			pairs = append(pairs, &rbacv3.Principal{Identifier: &rbacv3.Principal_AndIds{AndIds: &rbacv3.Principal_Set{
				Ids: []*rbacv3.Principal{prefix(tds[i]), prefix(tds[j])}}}})
		}
	}
	a, err := xdsproto.ToAny(&netrbacv3.RBAC{StatPrefix: "inbound_trust_domain_guard.", Rules: &rbacv3.RBAC{
		Action: rbacv3.RBAC_DENY,
		Policies: map[string]*rbacv3.Policy{"two-trust-domains": {
			Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}},
			Principals:  pairs,
		}},
	}})
	if err != nil {
		return nil, fmt.Errorf("trust domain guard: %w", err)
	}
	return []*listenerv3.Filter{{Name: "envoy.filters.network.rbac", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}}, nil
}
