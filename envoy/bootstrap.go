package envoy

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	overloadv3 "github.com/envoyproxy/go-control-plane/envoy/config/overload/v3"
	downstreamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	fixedheapv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/fixed_heap/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

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
	// DefaultAdminAddress). A unix socket is created with mode 0600 (admin.address.pipe.mode),
	// so only root on the node (and the agent) reaches it. The supervisor adopts a running
	// Envoy through it.
	AdminAddress string
	// RuntimeLayer, when set, adds an RTDS runtime layer of that name over ADS (layered_runtime
	// rtds_layer), after the static layer and before the admin one: the agent serves the pods'
	// per-listener connection caps there (xds.RuntimeLayerName, xds.Options.PodMaxConnections).
	// Envoy waits for it at start like for its other initial resources.
	RuntimeLayer string
	// StatsAddress is the metrics-only listener (StatsListenerName), "host:port"; "" means none.
	// It serves GET StatsPaths from the admin API and 404 for anything else, takes at most
	// StatsMaxConnections connections and is exempt from MaxConnections.
	StatsAddress string
	// StateOfTheWorld selects the state-of-the-world ADS protocol (GRPC) instead of the default
	// incremental one (DELTA_GRPC). Delta sends only what changed, which at thousands of
	// clusters makes a pod's ADD many times faster (docs/node-proxy.md has the numbers).
	StateOfTheWorld bool
	// MaxConnections caps the downstream connections of all of Envoy's listeners together
	// (overload manager resource monitor envoy.resource_monitors.global_downstream_max_connections,
	// max_active_downstream_connections): a connection beyond it is closed at accept and counted
	// (listener.<addr>.downstream_global_cx_overflow). 0 means DefaultMaxConnections; the admin
	// listener does not count.
	MaxConnections uint64
	// MaxHeapBytes is the heap size the overload manager watches (envoy.resource_monitors.fixed_heap):
	// at 90% Envoy returns free memory to the system (envoy.overload_actions.shrink_heap), at 95%
	// it answers new HTTP requests 503 (envoy.overload_actions.stop_accepting_requests), so a
	// flood degrades service instead of getting Envoy OOM-killed. 0 means DefaultMaxHeapBytes.
	MaxHeapBytes uint64
	// ListenerConnectionLimits caps the connections of single listeners by name (runtime key
	// envoy.resource_limits.listener.<name>.connection_limit in a static runtime layer): a
	// connection beyond a listener's limit is closed at accept and counted
	// (listener.<addr>.downstream_cx_overflow). The agent limits the east-west waypoint listener,
	// which other clusters reach, this way (--waypoint-max-connections).
	ListenerConnectionLimits map[string]uint64
}

// Overload defaults (docs/node-proxy.md, "Overload"): a node's pods, a thousand connections each,
// stay far below DefaultMaxConnections; DefaultMaxHeapBytes sits under the DaemonSet's memory
// limit for the Envoy container (deploy/agent/daemonset.yaml).
const (
	DefaultMaxConnections = 100_000
	DefaultMaxHeapBytes   = 1 << 30
)

func (c BootstrapConfig) withDefaults() BootstrapConfig {
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxHeapBytes == 0 {
		c.MaxHeapBytes = DefaultMaxHeapBytes
	}
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
		return &core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: p, Mode: 0o600}}}, nil
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
	if b.OverloadManager, err = overloadManager(cfg); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	limits := cfg.ListenerConnectionLimits
	if cfg.StatsAddress != "" {
		l, c, err := statsResources(cfg.StatsAddress, admin)
		if err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		b.StaticResources.Listeners = append(b.StaticResources.Listeners, l)
		b.StaticResources.Clusters = append(b.StaticResources.Clusters, c)
		if _, set := limits[StatsListenerName]; !set {
			limits = maps.Clone(limits)
			if limits == nil {
				limits = map[string]uint64{}
			}
			limits[StatsListenerName] = StatsMaxConnections
		}
	}
	var layers []*bootstrapv3.RuntimeLayer
	if len(limits) > 0 {
		fields := map[string]any{}
		for name, n := range limits {
			if name == "" || n == 0 {
				return nil, fmt.Errorf("bootstrap: ListenerConnectionLimits[%q] = %d: want a listener name and a limit above 0", name, n)
			}
			fields["envoy.resource_limits.listener."+name+".connection_limit"] = float64(n)
		}
		layer, err := structpb.NewStruct(fields)
		if err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		layers = append(layers, &bootstrapv3.RuntimeLayer{Name: "aether-limits", LayerSpecifier: &bootstrapv3.RuntimeLayer_StaticLayer{StaticLayer: layer}})
	}
	if cfg.RuntimeLayer != "" {
		layers = append(layers, &bootstrapv3.RuntimeLayer{Name: cfg.RuntimeLayer, LayerSpecifier: &bootstrapv3.RuntimeLayer_RtdsLayer_{
			RtdsLayer: &bootstrapv3.RuntimeLayer_RtdsLayer{Name: cfg.RuntimeLayer, RtdsConfig: xdsproto.ADS()}}})
	}
	if len(layers) > 0 {
		// The admin layer last, as Envoy's default runtime has it.
		b.LayeredRuntime = &bootstrapv3.LayeredRuntime{Layers: append(layers,
			&bootstrapv3.RuntimeLayer{Name: "admin", LayerSpecifier: &bootstrapv3.RuntimeLayer_AdminLayer_{AdminLayer: &bootstrapv3.RuntimeLayer_AdminLayer{}}})}
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

// overloadManager is the bootstrap's overload_manager (BootstrapConfig.MaxConnections and
// MaxHeapBytes): the two resource monitors, refreshed every 250 ms, and the heap's actions.
func overloadManager(cfg BootstrapConfig) (*overloadv3.OverloadManager, error) {
	conns, err := anypb.New(&downstreamv3.DownstreamConnectionsConfig{MaxActiveDownstreamConnections: int64(cfg.MaxConnections)})
	if err != nil {
		return nil, err
	}
	heap, err := anypb.New(&fixedheapv3.FixedHeapConfig{MaxHeapSizeBytes: cfg.MaxHeapBytes})
	if err != nil {
		return nil, err
	}
	const heapMonitor = "envoy.resource_monitors.fixed_heap"
	at := func(action string, v float64) *overloadv3.OverloadAction {
		return &overloadv3.OverloadAction{Name: action, Triggers: []*overloadv3.Trigger{{
			Name: heapMonitor, TriggerOneof: &overloadv3.Trigger_Threshold{Threshold: &overloadv3.ThresholdTrigger{Value: v}},
		}}}
	}
	return &overloadv3.OverloadManager{
		RefreshInterval: durationpb.New(250 * time.Millisecond),
		ResourceMonitors: []*overloadv3.ResourceMonitor{
			{Name: "envoy.resource_monitors.global_downstream_max_connections", ConfigType: &overloadv3.ResourceMonitor_TypedConfig{TypedConfig: conns}},
			{Name: heapMonitor, ConfigType: &overloadv3.ResourceMonitor_TypedConfig{TypedConfig: heap}},
		},
		Actions: []*overloadv3.OverloadAction{
			at("envoy.overload_actions.shrink_heap", 0.90),
			at("envoy.overload_actions.stop_accepting_requests", 0.95),
		},
	}, nil
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
