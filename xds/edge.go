package xds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// Edge Gateways (docs/gateway.md). The edge Envoy of a Gateway runs in its own pod (opted out of
// capture) and is programmed by the node agent of the node it runs on, over an ADS listener the
// agent opens on 127.0.0.1:EdgeXDSPort inside that pod's network namespace. It is a mesh client
// like a pod: its listeners set the upstream certificate selector's filter state to the edge's
// own SPIFFE ID, so the outbound clusters are the very clusters the node builder makes for pods
// (mTLS to pod_ip:15008, remote clusters' endpoints through their nodes' waypoints, this
// cluster's endpoints first), and each backend's inbound listener puts the edge's identity in
// XFCC.

// EdgeXDSPort is the port of the ADS listener the agent opens on 127.0.0.1 in an edge pod's
// network namespace (the edge bootstrap's XDSAddress).
const EdgeXDSPort = 15010

// EdgeNodeID is the node id of gateway k's edge Envoys ("edge~<namespace>~<name>").
func EdgeNodeID(k model.GatewayKey) string { return "edge~" + k.Namespace + "~" + k.Name }

// EdgeCertSecretName is the SDS secret of a listener certificate (the Secret ref).
func EdgeCertSecretName(ref model.SecretKey) string { return "cert|" + ref.String() }

// edgeListenerName is the Envoy listener of a Gateway port ("gateway|<port>").
func edgeListenerName(port uint32) string { return "gateway|" + strconv.FormatUint(uint64(port), 10) }

// edgeRouteName is the route configuration of the plaintext HTTP listeners of a port
// ("gateway|<port>") or, listener set, of one HTTPS listener ("gateway|<port>|<listener>").
func edgeRouteName(port uint32, listener string) string {
	n := edgeListenerName(port)
	if listener != "" {
		n += "|" + listener
	}
	return n
}

// BuildEdge builds the configuration of gateway g's edge Envoy from the agent's mesh model m, with
// the edge's SVID and the trust bundles (CA certificates, PEM, by trust domain): per Gateway port one listener on 0.0.0.0:<port> (HTTP:
// one connection manager whose route table holds every HTTP listener's virtual hosts; HTTPS and
// TLS: tls_inspector, then one filter chain per listener selected by SNI, or per TLSRoute
// hostname for passthrough; TCP: tcp_proxy), the outbound clusters and EDS resources of every
// backend the routes name, and the secrets (the SVID, the bundle, the listeners' certificates).
// UDP: udp_proxy, datagrams unencrypted to the backends' pods, see edgeUDP). Errors name the
// listener.
func BuildEdge(m *model.Mesh, g *model.EdgeGateway, svid *identity.SVID, bundles map[string][]byte, opts Options) (*Resources, error) {
	if err := opts.check(); err != nil {
		return nil, fmt.Errorf("build edge %s: %w", g.Key, err)
	}
	if svid == nil {
		return nil, fmt.Errorf("build edge %s: no SVID", g.Key)
	}
	if err := checkBundles(m.TrustDomain, peerTrustDomains(m.TrustDomain, opts.PeerTrustDomains), bundles); err != nil {
		return nil, fmt.Errorf("build edge %s: %w", g.Key, err)
	}
	sh, err := newSharedConfigs()
	if err != nil {
		return nil, err
	}
	b := &builder{m: m, opts: opts, sharedConfigs: sh}
	r := &Resources{}
	certs := map[model.SecretKey]model.Certificate{}
	backends := map[model.ServiceKey]bool{}
	for _, p := range g.Ports {
		l, routes, err := b.edgeListener(g, p, svid.SPIFFEID, certs, backends)
		if err != nil {
			return nil, fmt.Errorf("build edge %s: port %d: %w", g.Key, p.Port, err)
		}
		if l != nil {
			r.Listeners = append(r.Listeners, l)
			r.Routes = append(r.Routes, routes...)
		}
		ul, uc, err := edgeUDP(m, g, p, opts)
		if err != nil {
			return nil, fmt.Errorf("build edge %s: port %d: %w", g.Key, p.Port, err)
		}
		if ul != nil {
			r.Listeners = append(r.Listeners, ul)
			r.Clusters = append(r.Clusters, uc)
		}
	}
	sets := map[string][]string{} // pinSets of the backends' clusters
	for _, k := range slices.SortedFunc(func(yield func(model.ServiceKey) bool) {
		for k := range backends {
			if !yield(k) {
				return
			}
		}
	}, model.ServiceKey.Compare) {
		s := m.Service(k)
		if s == nil {
			continue // an invalid backend: its routes answer 500 (invalidClusterPrefix)
		}
		e, err := b.serviceEntry(s, nil)
		if err != nil {
			return nil, fmt.Errorf("build edge %s: backend %s: %w", g.Key, k, err)
		}
		r.Clusters = append(r.Clusters, e.clusters...)
		r.Endpoints = append(r.Endpoints, e.clas...)
		pinSets(sets, e.peers)
	}
	ts, err := trustSecrets(peerTrustDomains(m.TrustDomain, opts.PeerTrustDomains), bundles, sortedSets(sets))
	if err != nil {
		return nil, fmt.Errorf("build edge %s: %w", g.Key, err)
	}
	r.Secrets = append(append(r.Secrets, svidSecret(svid.SPIFFEID, svid)), ts...)
	for _, ref := range slices.SortedFunc(func(yield func(model.SecretKey) bool) {
		for k := range certs {
			if !yield(k) {
				return
			}
		}
	}, func(a, b model.SecretKey) int { return strings.Compare(a.String(), b.String()) }) {
		c := certs[ref]
		r.Secrets = append(r.Secrets, &tlsv3.Secret{Name: EdgeCertSecretName(ref), Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: c.CertPEM}},
			PrivateKey:       &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: c.KeyPEM}},
		}}})
	}
	sortByName(r.Listeners, (*listenerv3.Listener).GetName)
	sortByName(r.Clusters, (*clusterv3.Cluster).GetName)
	sortByName(r.Endpoints, (*endpointv3.ClusterLoadAssignment).GetClusterName)
	sortByName(r.Routes, (*routev3.RouteConfiguration).GetName)
	sortByName(r.Secrets, (*tlsv3.Secret).GetName)
	return r, nil
}

// edgeListener builds the listener of port p of g and its route configurations, adding the
// certificates it presents to certs and the services its routes send to to backends. It returns
// a nil listener when the port has only UDP listeners (edgeUDP serves those).
func (b *builder) edgeListener(g *model.EdgeGateway, p model.EdgePort, id string, certs map[model.SecretKey]model.Certificate, backends map[model.ServiceKey]bool) (*listenerv3.Listener, []*routev3.RouteConfiguration, error) {
	if !slices.ContainsFunc(p.Listeners, func(el model.EdgeListener) bool { return el.Protocol != model.ListenerUDP }) {
		return nil, nil, nil // UDP only: edgeUDP
	}
	idf, err := identityListenerFilter(id)
	if err != nil {
		return nil, nil, err
	}
	l := &listenerv3.Listener{
		Name:            edgeListenerName(p.Port),
		Address:         xdsproto.SocketAddress("0.0.0.0", p.Port, ""),
		ListenerFilters: []*listenerv3.ListenerFilter{idf},
	}
	var routes []*routev3.RouteConfiguration
	// Plaintext HTTP listeners share one connection manager: the Host header picks the listener
	// (most specific hostname first, EdgePort.Listeners' order) and then the route.
	var httpLs []model.EdgeListener
	tlsPort := false
	for _, el := range p.Listeners {
		switch el.Protocol {
		case model.ListenerHTTP:
			httpLs = append(httpLs, el)
		case model.ListenerHTTPS, model.ListenerTLS:
			tlsPort = true
		}
	}
	if len(httpLs) > 0 {
		rc := edgeRouteConfig(b.m, edgeRouteName(p.Port, ""), p.Port, httpLs, backends)
		routes = append(routes, rc)
		f, err := edgeHCM(rc.Name)
		if err != nil {
			return nil, nil, err
		}
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{Name: "http", Filters: []*listenerv3.Filter{f}})
	}
	if tlsPort {
		ti, err := xdsproto.TLSInspector()
		if err != nil {
			return nil, nil, err
		}
		l.ListenerFilters = append(l.ListenerFilters, ti)
		l.ListenerFiltersTimeout = b.opts.handshakeTimeout()
	}
	taken := map[string]bool{} // server names already claimed on this port
	for _, el := range p.Listeners {
		switch {
		case el.Protocol == model.ListenerHTTPS:
			ts, err := edgeServerTLS(el, certs)
			if err != nil {
				return nil, nil, fmt.Errorf("listener %s: %w", el.Name, err)
			}
			rc := edgeRouteConfig(b.m, edgeRouteName(p.Port, el.Name), p.Port, []model.EdgeListener{el}, backends)
			routes = append(routes, rc)
			f, err := edgeHCM(rc.Name)
			if err != nil {
				return nil, nil, fmt.Errorf("listener %s: %w", el.Name, err)
			}
			if names := serverNames(el.Hostname); claim(taken, names) {
				l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
					Name:                          el.Name,
					FilterChainMatch:              &listenerv3.FilterChainMatch{ServerNames: names, TransportProtocol: "tls"},
					TransportSocket:               ts,
					TransportSocketConnectTimeout: b.opts.handshakeTimeout(),
					Filters:                       []*listenerv3.Filter{f},
				})
			}
		case el.Protocol == model.ListenerTLS:
			// One chain per TLSRoute, selected by its SNI names ("*": any), and with Terminate
			// the first TCPRoute for every name no TLSRoute has. Passthrough keeps the client's
			// TLS end to end, carried inside the mesh mTLS connection; Terminate ends it here.
			var ts *core.TransportSocket
			if el.TLSMode == model.TLSTerminate {
				var err error
				if ts, err = edgeServerTLS(el, certs); err != nil {
					return nil, nil, fmt.Errorf("listener %s: %w", el.Name, err)
				}
			}
			tcpSeen := false
			for _, rt := range el.L4 {
				names := rt.Hostnames
				switch {
				case rt.Route.Kind == model.KindTCPRoute && (tcpSeen || el.TLSMode != model.TLSTerminate):
					continue
				case rt.Route.Kind == model.KindTCPRoute:
					tcpSeen, names = true, serverNames(el.Hostname)
				case slices.Contains(names, "*"):
					names = serverNames(el.Hostname)
				}
				f, err := edgeTCPProxy(b.m, el, []model.EdgeL4Route{rt}, backends)
				if err != nil {
					return nil, nil, fmt.Errorf("listener %s: %w", el.Name, err)
				}
				if f == nil || !claim(taken, names) {
					continue
				}
				fc := &listenerv3.FilterChain{
					Name:             el.Name + "|" + string(rt.Route.Kind) + "/" + rt.Route.Namespace + "/" + rt.Route.Name,
					FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: names, TransportProtocol: "tls"},
					Filters:          []*listenerv3.Filter{f},
				}
				if ts != nil {
					fc.TransportSocket, fc.TransportSocketConnectTimeout = ts, b.opts.handshakeTimeout()
				}
				l.FilterChains = append(l.FilterChains, fc)
			}
		case el.Protocol == model.ListenerTCP:
			f, err := edgeTCPProxy(b.m, el, el.L4, backends)
			if err != nil {
				return nil, nil, fmt.Errorf("listener %s: %w", el.Name, err)
			}
			if f != nil {
				l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{Name: el.Name, Filters: []*listenerv3.Filter{f}})
			}
		}
	}
	if len(l.FilterChains) == 0 {
		// Nothing bound yet: the port still listens (the Service has it) and closes
		// connections, as a listener without a matching chain does.
		f, err := xdsproto.TCPProxy("gateway_unbound", invalidClusterPrefix+"unbound")
		if err != nil {
			return nil, nil, err
		}
		l.DefaultFilterChain = &listenerv3.FilterChain{Name: "unbound", Filters: []*listenerv3.Filter{f}}
	}
	return l, routes, nil
}

// claim reports whether every name of names is free on the port and marks them taken; an empty
// list (every SNI) is claimed once. Envoy refuses two chains with the same match.
func claim(taken map[string]bool, names []string) bool {
	if len(names) == 0 {
		names = []string{""}
	}
	for _, n := range names {
		if taken[n] {
			return false
		}
	}
	for _, n := range names {
		taken[n] = true
	}
	return true
}

// serverNames is a listener hostname as FilterChainMatch.server_names (none: every SNI).
func serverNames(hostname string) []string {
	if hostname == "" {
		return nil
	}
	return []string{hostname}
}

// edgeHCM is the connection manager of an edge HTTP chain: routes from RDS route, the port
// stripped from Host before matching (Gateway API hostnames carry none), the client's address
// appended to X-Forwarded-For (the edge is the first proxy), and any XFCC header the client sent
// removed (SANITIZE): the backend sees only the edge's identity, which its inbound listener adds.
func edgeHCM(route string) (*listenerv3.Filter, error) {
	cors, err := corsFilter()
	if err != nil {
		return nil, err
	}
	return hcmFilter(&hcmv3.HttpConnectionManager{
		StatPrefix:               "gateway_http",
		UseRemoteAddress:         wrapperspb.Bool(true),
		ForwardClientCertDetails: hcmv3.HttpConnectionManager_SANITIZE,
		StripPortMode:            &hcmv3.HttpConnectionManager_StripAnyHostPort{StripAnyHostPort: true},
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: xdsproto.ADS(), RouteConfigName: route,
		}},
	}, cors)
}

// edgeRouteConfig is the route table of the HTTP listeners ls of a port (most specific hostname
// first): one virtual host per EdgeHost (domains: its hostname, "*" for any), the first listener
// to claim a hostname keeping it, and for each listener hostname no host claimed an empty virtual
// host, so that a request for it is answered 404 rather than by a less specific listener's
// routes. A request that matches no host or route gets 404 (HTTPRouteRule.matches).
func edgeRouteConfig(m *model.Mesh, name string, port uint32, ls []model.EdgeListener, backends map[model.ServiceKey]bool) *routev3.RouteConfiguration {
	rc := &routev3.RouteConfiguration{Name: name, ValidateClusters: wrapperspb.Bool(false)}
	taken := map[string]bool{}
	for _, el := range ls {
		for _, h := range el.Hosts {
			if taken[h.Hostname] {
				continue
			}
			taken[h.Hostname] = true
			vh := &routev3.VirtualHost{Name: el.Name + "|" + h.Hostname, Domains: []string{h.Hostname}}
			for _, e := range h.Entries {
				vh.Routes = append(vh.Routes, gammaRoute(m, port, e))
				for _, bk := range e.Rule.Backends {
					backends[bk.Service] = true
				}
				for _, f := range e.Rule.Filters {
					if f.Mirror != nil {
						backends[f.Mirror.Backend.Service] = true
					}
				}
			}
			rc.VirtualHosts = append(rc.VirtualHosts, vh)
		}
		lh := el.Hostname
		if lh == "" {
			lh = "*"
		}
		if !taken[lh] {
			taken[lh] = true
			rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{Name: el.Name + "|" + lh, Domains: []string{lh}})
		}
	}
	return rc
}

// edgeServerTLS is the transport socket of a Terminate listener (edgeDownstreamTLS).
func edgeServerTLS(el model.EdgeListener, certs map[model.SecretKey]model.Certificate) (*core.TransportSocket, error) {
	tc, err := edgeDownstreamTLS(el, certs)
	if err != nil {
		return nil, err
	}
	return tlsSocket(tc)
}

// edgeDownstreamTLS is the server TLS context of a Terminate listener: its certificates over SDS
// (Envoy picks the one whose names match the client's SNI, the first otherwise), adding them to
// certs. A listener whose certificates have not arrived is an error: the caller leaves the
// Gateway's previous configuration in place.
func edgeDownstreamTLS(el model.EdgeListener, certs map[model.SecretKey]model.Certificate) (*tlsv3.DownstreamTlsContext, error) {
	ctx := &tlsv3.CommonTlsContext{}
	for _, c := range el.Certificates {
		if len(c.CertPEM) == 0 || len(c.KeyPEM) == 0 {
			return nil, fmt.Errorf("certificate %s: no data (not published yet)", c.Ref)
		}
		certs[c.Ref] = c
		ctx.TlsCertificateSdsSecretConfigs = append(ctx.TlsCertificateSdsSecretConfigs, sdsRef(EdgeCertSecretName(c.Ref)))
	}
	if len(ctx.TlsCertificateSdsSecretConfigs) == 0 {
		return nil, fmt.Errorf("no certificate")
	}
	if el.Protocol == model.ListenerHTTPS {
		ctx.AlpnProtocols = []string{"h2", "http/1.1"}
	}
	return &tlsv3.DownstreamTlsContext{CommonTlsContext: ctx}, nil
}

// edgeTCPProxy is the tcp_proxy of an L4 listener: the first route of routes (the oldest wins,
// EdgeL4Route order) sent to its backends by weight (weighted_clusters; an invalid backend's
// share to a cluster that does not exist, whose connections are closed). It returns nil when no
// route is bound.
func edgeTCPProxy(m *model.Mesh, el model.EdgeListener, routes []model.EdgeL4Route, backends map[model.ServiceKey]bool) (*listenerv3.Filter, error) {
	if len(routes) == 0 {
		return nil, nil
	}
	tp := &tcpv3.TcpProxy{StatPrefix: "gateway_" + strings.ToLower(string(el.Protocol))}
	var wcs []*tcpv3.TcpProxy_WeightedCluster_ClusterWeight
	for _, bk := range routes[0].Backends {
		if bk.Weight <= 0 {
			continue
		}
		backends[bk.Service] = true
		wcs = append(wcs, &tcpv3.TcpProxy_WeightedCluster_ClusterWeight{Name: backendCluster(m, bk), Weight: uint32(bk.Weight)})
	}
	switch len(wcs) {
	case 0:
		tp.ClusterSpecifier = &tcpv3.TcpProxy_Cluster{Cluster: invalidClusterPrefix + "no-backend"}
	case 1:
		tp.ClusterSpecifier = &tcpv3.TcpProxy_Cluster{Cluster: wcs[0].Name}
	default:
		tp.ClusterSpecifier = &tcpv3.TcpProxy_WeightedClusters{WeightedClusters: &tcpv3.TcpProxy_WeightedCluster{Clusters: wcs}}
	}
	return xdsproto.NetworkFilter("envoy.filters.network.tcp_proxy", tp)
}

// edgeUDPListenerName is the Envoy listener of a UDP Gateway port ("gateway|udp|<port>"): UDP
// and TCP listeners may share a port number.
func edgeUDPListenerName(port uint32) string {
	return "gateway|udp|" + strconv.FormatUint(uint64(port), 10)
}

// edgeUDP is the UDP listener of port p (udp_proxy) and its cluster: the first UDPRoute bound to
// the port's listener, its backends' pods in one static cluster (udpCluster: datagrams in the
// clear to pod_ip:targetPort, this cluster's pods only with EastWestWaypoint). Sessions (one per
// client address and port) stick to one pod and end after udp_proxy's idle timeout (60 s). It
// returns a nil listener when no route is bound.
func edgeUDP(m *model.Mesh, g *model.EdgeGateway, p model.EdgePort, opts Options) (*listenerv3.Listener, *clusterv3.Cluster, error) {
	var rt *model.EdgeL4Route
	for _, el := range p.Listeners {
		if el.Protocol == model.ListenerUDP && len(el.L4) > 0 {
			rt = &el.L4[0]
			break
		}
	}
	if rt == nil {
		return nil, nil, nil
	}
	name := "udp|" + g.Key.String() + "|" + strconv.FormatUint(uint64(p.Port), 10)
	up, err := udpProxyFilter("gateway_udp", name)
	if err != nil {
		return nil, nil, err
	}
	return udpListener(edgeUDPListenerName(p.Port), xdsproto.SocketAddress("0.0.0.0", p.Port, ""), up), udpCluster(m, name, rt.Backends, opts), nil
}
