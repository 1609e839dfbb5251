package envoy

import (
	"fmt"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/aethermesh/aether/internal/xdsproto"
)

// The stats listener (BootstrapConfig.StatsAddress) and the static cluster it forwards to.
const (
	// StatsListenerName is the metrics-only listener's name.
	StatsListenerName = "aether-stats"
	// adminClusterName is the static cluster pointing at Envoy's own admin API.
	adminClusterName = "aether-admin"
	// StatsMaxConnections caps the stats listener's connections (a scraper and a probe need a
	// few): it is exempt from the global limit, so that an overloaded Envoy can still be seen.
	StatsMaxConnections = 256
	// statsIdleTimeout closes a stats connection without a request for this long (a silent one
	// from its accept), and statsHeadersTimeout one whose request headers, once begun, take
	// longer, so connections opened and left silent cannot hold the listener's slots (Envoy's
	// defaults are an hour and none); a scraper reconnects.
	statsIdleTimeout    = 10 * time.Second
	statsHeadersTimeout = 5 * time.Second
)

// StatsPaths are the only admin paths the stats listener serves (GET, exact path after
// normalization, RFC 3986 section 6): the Prometheus exposition and readiness. Every other path,
// the admin API's mutating ones included, is answered 404 there.
var StatsPaths = []string{"/stats/prometheus", "/ready"}

// statsResources returns the stats listener on addr and the admin cluster it forwards to (the
// admin API at admin, a pipe or a socket address). Like Istio's 15090 listener, it lets
// Prometheus scrape Envoy while the admin API itself stays on a 0600 unix socket.
func statsResources(addr string, admin *core.Address) (*listenerv3.Listener, *clusterv3.Cluster, error) {
	la, err := parseAddress("StatsAddress", addr)
	if err != nil {
		return nil, nil, err
	}
	if la.GetPipe() != nil {
		return nil, nil, fmt.Errorf("StatsAddress %q: want host:port (Prometheus scrapes over TCP)", addr)
	}
	var routes []*routev3.Route
	for _, p := range StatsPaths {
		routes = append(routes, &routev3.Route{
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: p},
				Headers: []*routev3.HeaderMatcher{{Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
					StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "GET"}}}}}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: adminClusterName}}},
		})
	}
	routes = append(routes, &routev3.Route{
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 404}},
	})
	router, err := xdsproto.ToAny(&routerv3.Router{})
	if err != nil {
		return nil, nil, err
	}
	hcm, err := xdsproto.NetworkFilter("envoy.filters.network.http_connection_manager", &hcmv3.HttpConnectionManager{
		StatPrefix:                   "aether_stats",
		CommonHttpProtocolOptions:    &core.HttpProtocolOptions{IdleTimeout: durationpb.New(statsIdleTimeout)},
		RequestHeadersTimeout:        durationpb.New(statsHeadersTimeout),
		NormalizePath:                wrapperspb.Bool(true),
		MergeSlashes:                 true,
		PathWithEscapedSlashesAction: hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name:         StatsListenerName,
			VirtualHosts: []*routev3.VirtualHost{{Name: "stats", Domains: []string{"*"}, Routes: routes}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		return nil, nil, err
	}
	l := &listenerv3.Listener{
		Name:                  StatsListenerName,
		Address:               la,
		IgnoreGlobalConnLimit: true,
		FilterChains:          []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{hcm}}},
	}
	c := &clusterv3.Cluster{
		Name:                 adminClusterName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       xdsproto.ConnectTimeout(0),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: adminClusterName, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: admin}}}},
		}}},
	}
	return l, c, nil
}
