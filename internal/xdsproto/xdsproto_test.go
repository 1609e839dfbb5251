package xdsproto

import (
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestHelpers: each helper fills the Envoy fields its doc names, and what it builds passes
// Envoy's own validation (PGV ValidateAll).
func TestHelpers(t *testing.T) {
	ads := &core.ConfigSource{ResourceApiVersion: core.ApiVersion_V3, ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}}
	bind := &core.BindConfig{SourceAddress: &core.SocketAddress{Address: "0.0.0.0", PortSpecifier: &core.SocketAddress_PortValue{}, NetworkNamespaceFilepath: "/var/run/netns/n"}}
	cases := []struct {
		name      string
		got, want proto.Message
	}{
		{"ADS", ADS(), ads},
		{"SocketAddress", SocketAddress("10.0.0.1", 15008, "/n"), &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Address: "10.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: 15008}, NetworkNamespaceFilepath: "/n"}}}},
		{"UpstreamBind", UpstreamBind("/var/run/netns/n"), bind},
		{"ConnectTimeout default", ConnectTimeout(0), durationpb.New(5 * time.Second)},
		{"ConnectTimeout negative", ConnectTimeout(-time.Second), durationpb.New(5 * time.Second)},
		{"ConnectTimeout set", ConnectTimeout(2 * time.Second), durationpb.New(2 * time.Second)},
		{"EDSCluster", EDSCluster("c", 0, "/var/run/netns/n"), &clusterv3.Cluster{Name: "c", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads}, ConnectTimeout: durationpb.New(5 * time.Second), UpstreamBindConfig: bind}},
		{"EDSCluster without netns", EDSCluster("c", time.Second, ""), &clusterv3.Cluster{Name: "c", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads}, ConnectTimeout: durationpb.New(time.Second)}},
	}
	for _, c := range cases {
		if !proto.Equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
		if v, ok := c.got.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				t.Errorf("%s: ValidateAll: %v", c.name, err)
			}
		}
	}
	if b := UpstreamBind(""); b != nil {
		t.Errorf(`UpstreamBind("") = %v, want nil`, b)
	}
	if HealthStatus(true) != core.HealthStatus_HEALTHY || HealthStatus(false) != core.HealthStatus_UNHEALTHY {
		t.Error("HealthStatus: want HEALTHY for true, UNHEALTHY for false")
	}
}

// TestFilters: the filters carry their typed config under their Envoy name.
func TestFilters(t *testing.T) {
	tp, err := TCPProxy("stat", "cluster")
	if err != nil {
		t.Fatal(err)
	}
	var cfg tcpv3.TcpProxy
	if err := tp.GetTypedConfig().UnmarshalTo(&cfg); err != nil {
		t.Fatal(err)
	}
	if tp.GetName() != "envoy.filters.network.tcp_proxy" || cfg.GetStatPrefix() != "stat" || cfg.GetCluster() != "cluster" {
		t.Errorf("TCPProxy = %s %v", tp.GetName(), &cfg)
	}
	if err := tp.ValidateAll(); err != nil {
		t.Errorf("TCPProxy: ValidateAll: %v", err)
	}
	ti, err := TLSInspector()
	if err != nil {
		t.Fatal(err)
	}
	if ti.GetName() != "envoy.filters.listener.tls_inspector" || ti.GetTypedConfig().GetTypeUrl() != "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector" {
		t.Errorf("TLSInspector = %s %s", ti.GetName(), ti.GetTypedConfig().GetTypeUrl())
	}
	if err := ti.ValidateAll(); err != nil {
		t.Errorf("TLSInspector: ValidateAll: %v", err)
	}
}
