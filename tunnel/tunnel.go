package tunnel

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	echov3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/echo/v3"
	rbacnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// Ports of the waypoint path (DESIGN.md, ports).
const (
	// Port is the tunnel listener's port on the node IP.
	Port = 15443
	// InboundPort is the pods' inbound mTLS port the tunnel forwards to.
	InboundPort = 15008
)

// Names and stat prefixes of the tunnel's Envoy resources (docs/waypoint.md lists the stats).
const (
	// ListenerName is the tunnel listener's name; its stat_prefix is StatPrefix, so Envoy's
	// listener stats are listener.waypoint.* (no_filter_chain_match among them).
	ListenerName = "waypoint"
	// StatPrefix is the listener's stat_prefix and the first label of every tunnel stat.
	StatPrefix = "waypoint"
	// RefusedStatPrefix starts the RBAC stat_prefix of each refusal reason: the counter
	// "<RefusedStatPrefix>.<reason>.rbac.denied" counts connections closed for that reason.
	RefusedStatPrefix = "waypoint_refused"
)

// Refusal reasons (the <reason> label of the refused-connection counters).
const (
	// RefusedNotTLS: the first bytes were not a TLS ClientHello (tls_inspector found no TLS).
	RefusedNotTLS = "not_tls"
	// RefusedNoSNI: a TLS ClientHello without server_name.
	RefusedNoSNI = "no_sni"
	// RefusedUnknownSNI: a TLS ClientHello whose server_name matches no exported local service
	// (an unexported service, another cluster's service, or anything else).
	RefusedUnknownSNI = "unknown_sni"
)

// Options tune Build. The zero value is usable.
type Options struct {
	// ConnectTimeout is the connect timeout of the per-service clusters (default 5 s).
	ConnectTimeout time.Duration
	// Netns, when set, is the network namespace path the listener is opened in and the
	// clusters' upstream sockets leave from (SocketAddress.network_namespace_filepath). Production
	// leaves it empty: Envoy runs in the node's host netns. Tests where a "node" is a netns of its
	// own set it to that netns.
	Netns string
	// HandshakeTimeout bounds how long a connection may take to send its whole ClientHello,
	// which tls_inspector waits for before a chain is chosen (Listener.listener_filters_timeout;
	// Envoy's default is 15 s); one still short of it is closed and counted
	// (listener.waypoint.downstream_pre_cx_timeout). The listener never terminates TLS: the rest
	// of the handshake is bounded by the destination pod's inbound listener. Zero or less means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// DefaultHandshakeTimeout is Options.HandshakeTimeout's default, 10 s (package xds uses the same
// for the pods' inbound listeners; docs/node-proxy.md says why).
const DefaultHandshakeTimeout = 10 * time.Second

func (o Options) handshakeTimeout() time.Duration {
	if o.HandshakeTimeout <= 0 {
		return DefaultHandshakeTimeout
	}
	return o.HandshakeTimeout
}

// Resources are the tunnel's Envoy resources: the listener, one EDS cluster per exported local
// service and that cluster's load assignment, clusters and assignments sorted by name.
type Resources struct {
	Listener  *listenerv3.Listener
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
}

// ClusterName names the cluster of one exported local service's pods on this node:
// "waypoint|<ns>/<svc>".
func ClusterName(k model.ServiceKey) string { return "waypoint|" + k.Namespace + "/" + k.Name }

// ServiceStatPrefix is the tcp_proxy stat_prefix of one service's chain, so that Envoy counts
// the connections and bytes through the waypoint per service as
// tcp.waypoint.<ns>.<svc>.{downstream_cx_total,downstream_cx_rx_bytes_total,downstream_cx_tx_bytes_total}.
func ServiceStatPrefix(k model.ServiceKey) string {
	return StatPrefix + "." + k.Namespace + "." + k.Name
}

// ServerName is the server_names entry of a service's chain: "*.<svc>.<ns>.<meshDomain>".
// Envoy's leftmost "*" is a suffix match across any number of labels, so it matches the waypoint
// SNI "<port>.<svc>.<ns>.<meshDomain>" of every port (FilterChainMatch.server_names).
func ServerName(m *model.Mesh, k model.ServiceKey) string { return "*." + m.FQDN(k) }

// SNI is the waypoint SNI of one target port of a service, "<port>.<svc>.<ns>.<meshDomain>"
// (DESIGN.md, data flow 8): what a caller's node sends through the tunnel, the exact server name
// of a port chain (PortClusterName), and a server name of the destination pod's inbound chain
// for that port.
func SNI(m *model.Mesh, k model.ServiceKey, targetPort uint32) string {
	return strconv.FormatUint(uint64(targetPort), 10) + "." + m.FQDN(k)
}

// PortClusterName names the cluster of the pods on this node that serve one target port of a
// service whose pods here disagree on it: "waypoint|<ns>/<svc>:<port>".
func PortClusterName(k model.ServiceKey, targetPort uint32) string {
	return ClusterName(k) + ":" + strconv.FormatUint(uint64(targetPort), 10)
}

// Build returns the tunnel resources of one node (DESIGN.md, data flow 8): the listener on
// node_ip:15443 with tls_inspector and one filter chain per exported local service (server_names
// ServerName), whose tcp_proxy passes the raw, still-encrypted bytes to the service's pods on
// this node at pod_ip:15008. Where those pods disagree on a target port (a named targetPort that
// pods resolve to different numbers: each pod's registered endpoint ports), each port that not
// every pod serves gets a chain of its own matching its exact SNI (Envoy prefers an exact
// server_names entry to a wildcard), to a cluster of only the pods serving it
// (PortClusterName), so a connection never reaches a pod whose inbound listener has no chain for
// its SNI. The listener has no TLS transport socket, so Envoy never terminates
// TLS on it. There is no default filter chain: a connection that is not TLS, has no SNI or an
// SNI of no exported local service lands on a refusal chain whose RBAC filter closes it and
// counts it by reason. A connection that has not sent its whole ClientHello within
// Options.HandshakeTimeout is closed. The listener binds with IP_FREEBIND (Listener.freebind), so
// a node IP that is not an address of the host does not make Envoy reject the LDS update. It
// returns nil (and no error) when the node IP is unknown; errors only from marshalling typed
// configs.
func Build(m *model.Mesh, opts Options) (*Resources, error) {
	if !m.Node.IP.IsValid() {
		return nil, nil
	}
	local := map[string]bool{}
	for _, p := range m.Pods {
		local[p.UID] = true
	}
	ti, err := xdsproto.TLSInspector()
	if err != nil {
		return nil, err
	}
	l := &listenerv3.Listener{
		Name:       ListenerName,
		StatPrefix: StatPrefix,
		Address:    xdsproto.SocketAddress(m.Node.IP.String(), Port, opts.Netns),
		// IP_FREEBIND: the node IP comes from the Node's InternalIP, which may not (yet) be an
		// address of the host (a wrong --node-ip, an address configured late). Without it Envoy
		// cannot bind and rejects the whole LDS update, and every later one, since each snapshot
		// holds this listener: no pod listener on the node would change again. With it the
		// listener is accepted and serves once the address is there.
		Freebind:               wrapperspb.Bool(true),
		ListenerFilters:        []*listenerv3.ListenerFilter{ti},
		ListenerFiltersTimeout: durationpb.New(opts.handshakeTimeout()),
	}
	r := &Resources{Listener: l}
	for _, s := range m.Services {
		if !s.Local || !s.Exported {
			continue
		}
		pods := localPods(m.Endpoints[s.Key], m.Cluster, local)
		cn := ClusterName(s.Key)
		fc, err := serviceChain(s.Key, s.Key.String(), ServerName(m, s.Key), cn)
		if err != nil {
			return nil, err
		}
		l.FilterChains = append(l.FilterChains, fc)
		r.Clusters = append(r.Clusters, xdsproto.EDSCluster(cn, opts.ConnectTimeout, opts.Netns))
		r.Endpoints = append(r.Endpoints, loadAssignment(cn, pods, 0))
		for _, port := range splitPorts(pods) {
			pcn := PortClusterName(s.Key, port)
			fc, err := serviceChain(s.Key, s.Key.String()+":"+strconv.FormatUint(uint64(port), 10), SNI(m, s.Key, port), pcn)
			if err != nil {
				return nil, err
			}
			l.FilterChains = append(l.FilterChains, fc)
			r.Clusters = append(r.Clusters, xdsproto.EDSCluster(pcn, opts.ConnectTimeout, opts.Netns))
			r.Endpoints = append(r.Endpoints, loadAssignment(pcn, pods, port))
		}
	}
	slices.SortFunc(r.Clusters, func(a, b *clusterv3.Cluster) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(r.Endpoints, func(a, b *endpointv3.ClusterLoadAssignment) int { return strings.Compare(a.ClusterName, b.ClusterName) })
	refusals, err := refusalChains()
	if err != nil {
		return nil, err
	}
	l.FilterChains = append(l.FilterChains, refusals...)
	return r, nil
}

// serviceChain is the filter chain named name that takes TLS connections whose SNI matches
// serverName and passes their raw bytes to cluster cn, counted under the service's stat prefix
// (ServiceStatPrefix: a service's port chains add to the same counters).
func serviceChain(k model.ServiceKey, name, serverName, cn string) (*listenerv3.FilterChain, error) {
	tp, err := xdsproto.TCPProxy(ServiceStatPrefix(k), cn)
	if err != nil {
		return nil, fmt.Errorf("build waypoint chain %s: %w", name, err)
	}
	return &listenerv3.FilterChain{
		Name:             name,
		FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{serverName}, TransportProtocol: "tls"},
		Filters:          []*listenerv3.Filter{tp},
	}, nil
}

// localPod is one pod on this node backing a service: its mesh address (the one its inbound
// listener binds), health, and the target ports it serves the service on (its registered
// endpoint ports, UDP left out: they do not go through :15008).
type localPod struct {
	ip      netip.Addr
	healthy bool
	ports   []uint32
}

// localPods lists a service's endpoints of this cluster whose pod runs on this node (a pod of
// local), one per mesh address, in endpoint order.
func localPods(eps []model.Endpoint, clusterName string, local map[string]bool) []localPod {
	var out []localPod
	seen := map[netip.Addr]bool{}
	for _, ep := range eps {
		if ep.Cluster != clusterName || !local[ep.PodUID] {
			continue
		}
		ip, ok := model.MeshAddr(ep.IPs)
		if !ok || seen[ip] {
			continue
		}
		seen[ip] = true
		p := localPod{ip: ip, healthy: ep.Healthy}
		for _, epp := range ep.Ports {
			if epp.Protocol != model.ProtocolUDP {
				p.ports = append(p.ports, epp.Port)
			}
		}
		out = append(out, p)
	}
	return out
}

// splitPorts returns, sorted, the target ports that some but not all of pods serve: the ports
// that need a chain and cluster of their own. It is empty in the common case, where every pod
// serves the service on the same numbers.
func splitPorts(pods []localPod) []uint32 {
	count := map[uint32]int{}
	for _, p := range pods {
		for _, port := range slices.Compact(slices.Sorted(slices.Values(p.ports))) {
			count[port]++
		}
	}
	var out []uint32
	for port, n := range count {
		if n < len(pods) {
			out = append(out, port)
		}
	}
	slices.Sort(out)
	return out
}

// refusalChains close what no service chain takes. Envoy picks a filter chain by server_names
// before transport_protocol (FilterChainMatch), so these only see connections whose SNI matched
// no service chain: "refuse-tls" takes TLS ones (an RBAC filter denying any SNI, counted as
// unknown_sni, then one denying the rest, counted as no_sni), "refuse-raw" the rest (not_tls).
func refusalChains() ([]*listenerv3.FilterChain, error) {
	hasSNI, err := denyFilter(RefusedUnknownSNI, &rbacv3.Policy{
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_RequestedServerName{RequestedServerName: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: ".+"}}}}}},
		Principals: []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}},
	})
	if err != nil {
		return nil, err
	}
	all := &rbacv3.Policy{
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}},
		Principals:  []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}},
	}
	noSNI, err := denyFilter(RefusedNoSNI, all)
	if err != nil {
		return nil, err
	}
	notTLS, err := denyFilter(RefusedNotTLS, all)
	if err != nil {
		return nil, err
	}
	// RBAC is not a terminal filter and decides on the first bytes (onData), so the chain ends
	// in one that does nothing when the connection opens: echo (a direct_response would close the
	// connection on accept, before RBAC saw the ClientHello and counted it). The last RBAC filter
	// denies everything, so echo never receives a byte.
	end, err := xdsproto.NetworkFilter("envoy.filters.network.echo", &echov3.Echo{})
	if err != nil {
		return nil, err
	}
	return []*listenerv3.FilterChain{
		{Name: "refuse-tls", FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "tls"}, Filters: []*listenerv3.Filter{hasSNI, noSNI, end}},
		{Name: "refuse-raw", FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer"}, Filters: []*listenerv3.Filter{notTLS, end}},
	}, nil
}

// denyFilter is an RBAC network filter (envoy.filters.network.rbac) that closes connections
// matching policy, counted in <RefusedStatPrefix>.<reason>.rbac.denied.
func denyFilter(reason string, policy *rbacv3.Policy) (*listenerv3.Filter, error) {
	f, err := xdsproto.NetworkFilter("envoy.filters.network.rbac", &rbacnetv3.RBAC{
		StatPrefix: RefusedStatPrefix + "." + reason + ".",
		Rules:      &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{reason: policy}},
	})
	if err != nil {
		return nil, fmt.Errorf("build waypoint refusal %s: %w", reason, err)
	}
	return f, nil
}

// loadAssignment lists pods at pod_ip:15008, those serving port only when port is not 0,
// unhealthy ones marked so.
func loadAssignment(name string, pods []localPod, port uint32) *endpointv3.ClusterLoadAssignment {
	var lbs []*endpointv3.LbEndpoint
	for _, p := range pods {
		if port != 0 && !slices.Contains(p.ports, port) {
			continue
		}
		lbs = append(lbs, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: xdsproto.SocketAddress(p.ip.String(), InboundPort, "")}},
			HealthStatus:   xdsproto.HealthStatus(p.healthy),
		})
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	if len(lbs) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}
	}
	return cla
}
