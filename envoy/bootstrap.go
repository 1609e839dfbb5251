package envoy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/aethermesh/aether/internal/xdsproto"
)

// Default addresses (DESIGN.md, ports).
const (
	DefaultAdminAddress = "127.0.0.1:15000"
	DefaultXDSAddress   = "127.0.0.1:15010"
	// adsClusterName is the bootstrap's static cluster pointing at the agent's xDS server.
	adsClusterName = "aether-xds"
)

// BootstrapConfig is what the Envoy bootstrap needs.
type BootstrapConfig struct {
	// NodeID is node.id; the xDS server serves its snapshot to this id.
	NodeID string
	// Cluster is node.cluster (default "aether").
	Cluster string
	// XDSAddress is the agent's ADS server: "host:port" or "unix:///path/to/socket"
	// (default DefaultXDSAddress).
	XDSAddress string
	// AdminAddress is Envoy's admin API: "host:port" or "unix:///path" (default
	// DefaultAdminAddress). The supervisor adopts a running Envoy through it.
	AdminAddress string
	// StateOfTheWorld selects the state-of-the-world ADS protocol (GRPC) instead of the default
	// incremental one (DELTA_GRPC). Delta sends only what changed, which at thousands of
	// clusters makes a pod's ADD many times faster (docs/node-proxy.md has the numbers).
	StateOfTheWorld bool
}

func (c BootstrapConfig) withDefaults() BootstrapConfig {
	if c.Cluster == "" {
		c.Cluster = "aether"
	}
	if c.XDSAddress == "" {
		c.XDSAddress = DefaultXDSAddress
	}
	if c.AdminAddress == "" {
		c.AdminAddress = DefaultAdminAddress
	}
	return c
}

// parseAddress turns "host:port" or "unix:///path" into an Envoy address. It returns an error
// naming the field and value when neither form parses.
func parseAddress(field, s string) (*core.Address, error) {
	if p, ok := strings.CutPrefix(s, "unix://"); ok {
		if p == "" {
			return nil, fmt.Errorf("%s %q: empty unix socket path", field, s)
		}
		return &core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: p}}}, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", field, s, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%s %q: port: %w", field, s, err)
	}
	return xdsproto.SocketAddress(host, uint32(n), ""), nil
}

// Bootstrap returns the Envoy bootstrap (JSON) for cfg: node id and cluster, the admin API, one
// static HTTP/2 cluster to the agent's ADS server, and LDS and CDS over ADS (delta by default). It returns an error
// naming the field when an address does not parse.
func Bootstrap(cfg BootstrapConfig) ([]byte, error) {
	cfg = cfg.withDefaults()
	if cfg.NodeID == "" {
		return nil, fmt.Errorf("bootstrap: empty NodeID")
	}
	admin, err := parseAddress("AdminAddress", cfg.AdminAddress)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	xdsAddr, err := parseAddress("XDSAddress", cfg.XDSAddress)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	po, err := anypb.New(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
			Http2ProtocolOptions: &core.Http2ProtocolOptions{}}}}})
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	apiType := core.ApiConfigSource_DELTA_GRPC
	if cfg.StateOfTheWorld {
		apiType = core.ApiConfigSource_GRPC
	}
	b := &bootstrapv3.Bootstrap{
		Node:  &core.Node{Id: cfg.NodeID, Cluster: cfg.Cluster},
		Admin: &bootstrapv3.Admin{Address: admin},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			AdsConfig: &core.ApiConfigSource{
				ApiType:             apiType,
				TransportApiVersion: core.ApiVersion_V3,
				GrpcServices: []*core.GrpcService{{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: adsClusterName}}}},
				SetNodeOnFirstMessageOnly: true,
			},
			LdsConfig: xdsproto.ADS(),
			CdsConfig: xdsproto.ADS(),
		},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{{
			Name:                          adsClusterName,
			ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
			ConnectTimeout:                xdsproto.ConnectTimeout(0),
			TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": po},
			LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: adsClusterName, Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: xdsAddr}}}},
			}}},
		}}},
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	out, err := protojson.MarshalOptions{Indent: "  "}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: marshal: %w", err)
	}
	return out, nil
}

// AdminClient returns an HTTP client and base URL for an Envoy admin address ("host:port" or
// "unix:///path").
func AdminClient(addr string) (*http.Client, string) {
	if p, ok := strings.CutPrefix(addr, "unix://"); ok {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", p)
			},
		}}, "http://envoy-admin"
	}
	return &http.Client{Timeout: 5 * time.Second}, "http://" + addr
}

// adminGet GETs url (AdminClient's base plus an admin path) with c and returns the status code
// and body, or the request's error.
func adminGet(ctx context.Context, c *http.Client, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
