package xdsproto

import (
	"fmt"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsinspv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ToAny marshals m into an Any, for a typed_config field, deterministically (map entries, e.g. a
// google.protobuf.Struct's fields, in key order): the same message always gives the same bytes.
// Envoy and the xDS cache compare resources by their bytes, and an Any is opaque bytes to them:
// with Go's default random map order, rebuilding an unchanged listener could make it "modified",
// and Envoy would drain its connections. The builders marshal only messages they build
// themselves, so an error is a programming error; it is still returned, as "marshal <Go type of
// m>: <cause>", so that it surfaces as a build error.
func ToAny(m proto.Message) (*anypb.Any, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, fmt.Errorf("marshal %T: %w", m, err)
	}
	return a, nil
}

// ADS is the config source "over the aggregated discovery stream" (ConfigSource.ads, API version
// V3): what every RDS, EDS, SDS and ECDS reference of a node's resources names.
func ADS() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// SocketAddress is the address ip:port (SocketAddress.address and port_value), opened in the
// network namespace at path netns (SocketAddress.network_namespace_filepath; "" for Envoy's own).
func SocketAddress(ip string, port uint32, netns string) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Address:                  ip,
		PortSpecifier:            &core.SocketAddress_PortValue{PortValue: port},
		NetworkNamespaceFilepath: netns,
	}}}
}

// UpstreamBind is a cluster's upstream_bind_config that opens its upstream sockets in the network
// namespace at path netns, from 0.0.0.0 and any port; nil (Envoy's own netns) when netns is "".
func UpstreamBind(netns string) *core.BindConfig {
	if netns == "" {
		return nil
	}
	return &core.BindConfig{SourceAddress: &core.SocketAddress{
		Address:                  "0.0.0.0",
		PortSpecifier:            &core.SocketAddress_PortValue{PortValue: 0},
		NetworkNamespaceFilepath: netns,
	}}
}

// DefaultConnectTimeout is ConnectTimeout's value for zero or less: 5 s, as Envoy's default of
// Cluster.connect_timeout.
const DefaultConnectTimeout = 5 * time.Second

// ConnectTimeout is Cluster.connect_timeout for d: d, or DefaultConnectTimeout when d is zero or
// less.
func ConnectTimeout(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return durationpb.New(DefaultConnectTimeout)
	}
	return durationpb.New(d)
}

// EDSCluster is the cluster named name whose endpoints come over EDS on ADS (Cluster.type EDS,
// eds_cluster_config.eds_config ADS), with connect timeout ConnectTimeout(connectTimeout) and the
// upstream bind config UpstreamBind(netns). The caller adds what else it needs (a transport
// socket, protocol options).
func EDSCluster(name string, connectTimeout time.Duration, netns string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ADS()},
		ConnectTimeout:       ConnectTimeout(connectTimeout),
		UpstreamBindConfig:   UpstreamBind(netns),
	}
}

// HealthStatus is an LbEndpoint's health_status: HEALTHY or UNHEALTHY.
func HealthStatus(healthy bool) core.HealthStatus {
	if healthy {
		return core.HealthStatus_HEALTHY
	}
	return core.HealthStatus_UNHEALTHY
}

// NetworkFilter is the network filter name (Filter.name, e.g. "envoy.filters.network.tcp_proxy")
// with typed config m. Its only error is ToAny's.
func NetworkFilter(name string, m proto.Message) (*listenerv3.Filter, error) {
	a, err := ToAny(m)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Filter{Name: name, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}, nil
}

// ListenerFilter is the listener filter name (ListenerFilter.name, e.g.
// "envoy.filters.listener.original_dst") with typed config m. Its only error is ToAny's.
func ListenerFilter(name string, m proto.Message) (*listenerv3.ListenerFilter, error) {
	a, err := ToAny(m)
	if err != nil {
		return nil, err
	}
	return &listenerv3.ListenerFilter{Name: name, ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: a}}, nil
}

// TCPProxy is the network filter envoy.filters.network.tcp_proxy that passes a connection's bytes
// to the cluster named cluster, counted under stat_prefix stat (tcp.<stat>.*). Its only error is
// ToAny's.
func TCPProxy(stat, cluster string) (*listenerv3.Filter, error) {
	return NetworkFilter("envoy.filters.network.tcp_proxy", &tcpv3.TcpProxy{StatPrefix: stat, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})
}

// TLSInspector is the listener filter envoy.filters.listener.tls_inspector, which reads the TLS
// ClientHello (SNI, ALPN) so that FilterChainMatch.server_names and transport_protocol "tls" can
// pick a chain; a listener's listener_filters_timeout bounds its wait. Its only error is ToAny's.
func TLSInspector() (*listenerv3.ListenerFilter, error) {
	return ListenerFilter("envoy.filters.listener.tls_inspector", &tlsinspv3.TlsInspector{})
}
