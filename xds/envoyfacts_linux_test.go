package xds

// Envoy facts (DESIGN.md, "Envoy facts to check first"), each checked against the real Envoy
// 1.40 with real network namespaces. docs/node-proxy.md records the outcome and what the design
// does about it.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	fsmapper "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/cert_mappers/filter_state_override/v3"
	ondemand "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/cert_selectors/on_demand_secret/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/aethermesh/aether/internal/testenv"
)

const factsAdmin = `
admin:
  address:
    socket_address: { address: 127.0.0.1, port_value: 0 }
`

// directListener is a listener on addr (inside netns when set) answering every HTTP request with
// body and two headers holding the two candidate namespace filter-state keys.
func directListener(name, addr string, port int, netns, body string) string {
	return fmt.Sprintf(`
  - name: %[1]s
    address:
      socket_address: { address: %[2]s, port_value: %[3]d, network_namespace_filepath: %[4]q }
    enable_reuse_port: false
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: %[1]s
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              response_headers_to_add:
              - header: { key: x-fs-network-namespace, value: "%%FILTER_STATE(envoy.network.network_namespace:PLAIN)%%" }
              - header: { key: x-fs-namespace, value: "%%FILTER_STATE(envoy.network.namespace:PLAIN)%%" }
              routes:
              - match: { prefix: "/" }
                direct_response: { status: 200, body: { inline_string: %[5]q } }
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`, name, addr, port, netns, body)
}

// TestPrivilegedEnvoyFactNamespacedListeners checks three facts at once: a listener opens inside
// another netns (SocketAddress.network_namespace_filepath, #38945); many listeners on the same
// 127.0.0.1:15001 in different namespaces coexist and each answers in its own namespace (#41103);
// and which filter-state key Envoy 1.40 sets on accept (#41799 vs the spelling in #42788).
func TestPrivilegedEnvoyFactNamespacedListeners(t *testing.T) {
	testenv.RequireRoot(t)
	pods := []*testenv.Netns{testenv.NewNetns(t), testenv.NewNetns(t), testenv.NewNetns(t)}
	var b strings.Builder
	b.WriteString(factsAdmin + "static_resources:\n  listeners:")
	for i, p := range pods {
		b.WriteString(directListener(fmt.Sprintf("pod%d", i), "127.0.0.1", 15001, p.Path, fmt.Sprintf("pod%d", i)))
	}
	startFactsEnvoy(t, b.String())
	for i, p := range pods {
		var body string
		var hdr http.Header
		// Retry until one request is answered (Envoy may still be starting its worker), then
		// check the answer.
		testenv.Eventually(t, time.Minute, fmt.Sprintf("pod%d: GET 127.0.0.1:15001 in its netns", i), func() error {
			code, b, h, err := getBody(p.HTTPClient(false), "http://127.0.0.1:15001/", nil)
			if err != nil || code != 200 {
				return fmt.Errorf("%d %v", code, err)
			}
			body, hdr = b, h
			return nil
		})
		if want := fmt.Sprintf("pod%d", i); body != want {
			t.Errorf("pod%d: answered by %q, want %q (same-address listeners in different netns must stay apart, #41103)", i, body, want)
		}
		if got := hdr.Get("x-fs-network-namespace"); got != p.Path {
			t.Errorf("pod%d: filter state envoy.network.network_namespace = %q, want %q", i, got, p.Path)
		}
		if got := hdr.Get("x-fs-namespace"); got != "" && got != "-" {
			t.Errorf("pod%d: filter state envoy.network.namespace = %q, want unset in 1.40", i, got)
		}
	}
}

// TestPrivilegedEnvoyFactWildcardInNetns checks #42648: a listener on 0.0.0.0 with
// network_namespace_filepath. It records where the socket really lands.
func TestPrivilegedEnvoyFactWildcardInNetns(t *testing.T) {
	testenv.RequireRoot(t)
	pod := testenv.NewNetns(t)
	port := testenv.FreePort(t)
	startFactsEnvoy(t, factsAdmin+"static_resources:\n  listeners:"+
		directListener("wild", "0.0.0.0", port, pod.Path, "wild"))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var inPod string
	var errPod error
	for try := 0; try < 50; try++ { // retry while Envoy starts its worker
		if _, inPod, _, errPod = getBody(pod.HTTPClient(false), "http://"+addr+"/", nil); errPod == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	c, errRoot := net.DialTimeout("tcp", addr, 2*time.Second)
	if errRoot == nil {
		c.Close()
	}
	t.Logf("wildcard listener with netns: in pod netns: body=%q err=%v; in root netns: err=%v", inPod, errPod, errRoot)
	if errPod != nil || inPod != "wild" {
		t.Errorf("0.0.0.0 listener with network_namespace_filepath not reachable in its netns: %v", errPod)
	}
	if errRoot == nil {
		t.Errorf("0.0.0.0 listener with network_namespace_filepath also answers in the root netns (#42648)")
	}
}

// TestPrivilegedEnvoyFactUpstreamInNetns checks #40482 in 1.40: an endpoint address with
// network_namespace_filepath is rejected ("hosts cannot specify network namespaces with their
// address"), but Cluster.upstream_bind_config.source_address with network_namespace_filepath
// makes Envoy create the upstream socket inside that namespace, so the inbound leg can reach an
// application bound to the pod's loopback.
func TestPrivilegedEnvoyFactUpstreamInNetns(t *testing.T) {
	testenv.RequireRoot(t)
	pod := testenv.NewNetns(t)
	// The app port is free in the root netns, so only a connection made inside the pod's netns
	// can reach the echo server.
	appPort := testenv.FreePort(t)
	serveEcho(pod.Listen(t, fmt.Sprintf("127.0.0.1:%d", appPort)))
	port := testenv.FreePort(t)
	startFactsEnvoy(t, factsAdmin+fmt.Sprintf(`
static_resources:
  listeners:
  - name: in
    address: { socket_address: { address: 127.0.0.1, port_value: %d } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: in
          cluster: app
  clusters:
  - name: app
    type: STATIC
    connect_timeout: 2s
    upstream_bind_config:
      source_address: { address: 127.0.0.1, port_value: 0, network_namespace_filepath: %q }
    load_assignment:
      cluster_name: app
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: { address: 127.0.0.1, port_value: %d }
`, port, pod.Path, appPort))
	testenv.Eventually(t, time.Minute, "echo through an upstream connection into the pod netns's loopback", func() error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		return testenv.EchoOnce(c, "hello from the root netns\n")
	})
}

// adsServer serves the given resources over ADS (SotW) to node "facts" on a loopback port and
// returns the port and the cache (SetSnapshot on it changes what Envoy gets).
func adsServer(t testing.TB, res map[resource.Type][]types.Resource) (int, cache.SnapshotCache) {
	t.Helper()
	sc := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	snap, err := cache.NewSnapshot("1", res)
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.SetSnapshot(context.Background(), "facts", snap); err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, server.NewServer(context.Background(), sc, nil))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return l.Addr().(*net.TCPAddr).Port, sc
}

// adsBootstrap is the start of a bootstrap for node "facts" whose configSource (for example
// "cds_config" or "lds_config") is ADS from adsServer on port: the node, dynamic_resources and
// the static HTTP/2 cluster "ads", ending inside static_resources (callers may add "  listeners:").
func adsBootstrap(configSource string, port int) string {
	return fmt.Sprintf(`
node: { id: facts, cluster: facts }
dynamic_resources:
  %s: { ads: {}, resource_api_version: V3 }
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services: [{ envoy_grpc: { cluster_name: ads } }]
static_resources:
  clusters:
  - name: ads
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: ads
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: %d } } } }] }]
`, configSource, port)
}

// factsSelectorCluster is a STATIC cluster with one TLS context whose client certificate comes
// from the on-demand certificate selector keyed by downstream filter state.
func factsSelectorCluster(t testing.TB, name string, port int, peer string, prefetch []string) *clusterv3.Cluster {
	t.Helper()
	mapper, _ := anypb.New(&fsmapper.Config{DefaultValue: "none"})
	sel, _ := anypb.New(&ondemand.Config{
		ConfigSource:        &core.ConfigSource{ResourceApiVersion: core.ApiVersion_V3, ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}},
		CertificateMapper:   &core.TypedExtensionConfig{Name: "fs", TypedConfig: mapper},
		PrefetchSecretNames: prefetch,
	})
	utc, _ := anypb.New(&tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		CustomTlsCertificateSelector: &core.TypedExtensionConfig{Name: "on_demand", TypedConfig: sel},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
				SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: peer}},
			}}},
			ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: "bundle", SdsConfig: &core.ConfigSource{ResourceApiVersion: core.ApiVersion_V3, ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}}},
		}},
	}})
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(5 * time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
				Address: "127.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(port)},
			}}}}},
		}}}}},
		TransportSocket: &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: utc}},
	}
}

func tlsSecret(name string, chain, key []byte) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: chain}},
		PrivateKey:       &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: key}},
	}}}
}

// TestPrivilegedEnvoyFactDynamicUpstreamCertSelector checks that 1.40 ships the upstream
// certificate selector (#42477): one TLS context per cluster whose client certificate comes, per
// connection, from an SDS secret named by the downstream filter state
// envoy.tls.certificate_mappers.on_demand_secret (set per pod listener with set_filter_state and
// shared with upstream), and that pooled upstream HTTP connections are never shared between two
// source identities under concurrent keep-alive load.
func TestPrivilegedEnvoyFactDynamicUpstreamCertSelector(t *testing.T) {
	testenv.RequireRoot(t)
	td := "facts.test"
	dev, _ := testCA(t, td, time.Hour)
	ctx := context.Background()
	server, _ := dev.Issue(ctx, "spiffe://"+td+"/ns/srv/sa/server")
	ids := []string{"spiffe://" + td + "/ns/a/sa/one", "spiffe://" + td + "/ns/b/sa/two"}
	var secrets []types.Resource
	for _, id := range ids {
		s, err := dev.Issue(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, tlsSecret(id, s.CertChainPEM, s.KeyPEM))
	}
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mtlsHTTPServer(t, up, server, dev.BundlePEM())
	// The cluster comes over CDS (as in the agent): a static cluster whose secrets come over ADS
	// would wait for ADS during Envoy's primary-cluster initialisation, which never ends.
	secrets = append(secrets, &tlsv3.Secret{Name: "bundle", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: dev.BundlePEM()}},
	}}})
	svc := factsSelectorCluster(t, "svc", up.Addr().(*net.TCPAddr).Port, "spiffe://"+td+"/ns/srv/sa/server", nil)
	sdsPort, _ := adsServer(t, map[resource.Type][]types.Resource{resource.SecretType: secrets, resource.ClusterType: {svc}})
	pods := []*testenv.Netns{testenv.NewNetns(t), testenv.NewNetns(t)}
	var b strings.Builder
	b.WriteString(adsBootstrap("cds_config", sdsPort) + "  listeners:")
	for i, p := range pods {
		fmt.Fprintf(&b, `
  - name: pod%[1]d
    address: { socket_address: { address: 127.0.0.1, port_value: 15001, network_namespace_filepath: %[2]q } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.set_filter_state
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.set_filter_state.v3.Config
          on_new_connection:
          - object_key: envoy.tls.certificate_mappers.on_demand_secret
            factory_key: envoy.hashable_string
            format_string: { text_format_source: { inline_string: %[3]q } }
            shared_with_upstream: ONCE
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: pod%[1]d
          route_config:
            validate_clusters: false
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{ match: { prefix: "/" }, route: { cluster: svc } }]
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`, i, p.Path, ids[i])
	}
	startFactsEnvoy(t, factsAdmin+b.String())
	// The cluster comes over CDS after Envoy is live: wait until each pod gets through once.
	for i, p := range pods {
		testenv.Eventually(t, time.Minute, fmt.Sprintf("pod%d reaches the upstream", i), func() error {
			code, body, _, err := getBody(p.HTTPClient(false), "http://127.0.0.1:15001/", nil)
			if err != nil || code != 200 {
				return fmt.Errorf("%d %q %v", code, body, err)
			}
			return nil
		})
	}
	// Both pods call concurrently over keep-alive connections; every answer must carry the
	// caller's own identity.
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	upstreamConns := make([]map[string]bool, len(pods))
	for i, p := range pods {
		upstreamConns[i] = map[string]bool{}
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := p.HTTPClient(true)
				for n := 0; n < 20; n++ {
					code, body, _, err := getBody(c, "http://127.0.0.1:15001/", nil)
					if err != nil || code != 200 {
						errs <- fmt.Errorf("pod%d: %d %q %v", i, code, body, err)
						return
					}
					id, remote, _ := strings.Cut(body, "|")
					if id != ids[i] {
						errs <- fmt.Errorf("pod%d: upstream saw client identity %q, want %q", i, id, ids[i])
						return
					}
					_ = remote
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestPrivilegedEnvoyFactTransportSocketMatcher checks the alternative to the certificate
// selector: Cluster.transport_socket_matcher with the transport_socket_filter_state input (#41151,
// #42739): one named TLS socket per source identity. The key Envoy sets on accept
// (envoy.network.network_namespace) is not shared with upstream in 1.40, so the matcher never sees
// it (the cluster falls back to its default, plaintext, socket); the listener shares its own key
// with set_filter_state instead.
func TestPrivilegedEnvoyFactTransportSocketMatcher(t *testing.T) {
	testenv.RequireRoot(t)
	td := "facts.test"
	dev, _ := testCA(t, td, time.Hour)
	ctx := context.Background()
	server, _ := dev.Issue(ctx, "spiffe://"+td+"/ns/srv/sa/server")
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mtlsHTTPServer(t, up, server, dev.BundlePEM())
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", dev.BundlePEM())
	pods := []*testenv.Netns{testenv.NewNetns(t), testenv.NewNetns(t)}
	ids := []string{"spiffe://" + td + "/ns/a/sa/one", "spiffe://" + td + "/ns/b/sa/two"}
	var matches, mapEntries, listeners strings.Builder
	for i, p := range pods {
		s, err := dev.Issue(ctx, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		cf, kf := write(fmt.Sprintf("c%d.pem", i), s.CertChainPEM), write(fmt.Sprintf("k%d.pem", i), s.KeyPEM)
		fmt.Fprintf(&matches, `
    - name: id%d
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          common_tls_context:
            tls_certificates: [{ certificate_chain: { filename: %q }, private_key: { filename: %q } }]
            validation_context: { trusted_ca: { filename: %q } }`, i, cf, kf, caFile)
		fmt.Fprintf(&mapEntries, `
            %q:
              action:
                name: id%d
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.matching.common_inputs.transport_socket.v3.TransportSocketNameAction
                  name: id%d`, ids[i], i, i)
		fmt.Fprintf(&listeners, `
  - name: pod%[1]d
    address: { socket_address: { address: 127.0.0.1, port_value: 15001, network_namespace_filepath: %[2]q } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.set_filter_state
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.set_filter_state.v3.Config
          on_new_connection:
          - object_key: aether.source_identity
            factory_key: envoy.hashable_string
            format_string: { text_format_source: { inline_string: "%[3]s" } }
            shared_with_upstream: ONCE
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: pod%[1]d
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{ match: { prefix: "/" }, route: { cluster: svc } }]
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`, i, p.Path, ids[i])
	}
	boot := factsAdmin + fmt.Sprintf(`
static_resources:
  clusters:
  - name: svc
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: svc
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: %d } } } }] }]
    transport_socket_matches:%s
    transport_socket_matcher:
      matcher_tree:
        input:
          name: ns
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.matching.common_inputs.transport_socket.v3.FilterStateInput
            key: aether.source_identity
        exact_match_map:
          map:%s
  listeners:%s`, up.Addr().(*net.TCPAddr).Port, matches.String(), mapEntries.String(), listeners.String())
	startFactsEnvoy(t, boot)
	for i, p := range pods {
		var body string
		testenv.Eventually(t, time.Minute, fmt.Sprintf("pod%d reaches the upstream", i), func() error {
			code, b, _, err := getBody(p.HTTPClient(false), "http://127.0.0.1:15001/", nil)
			if err != nil || code != 200 {
				return fmt.Errorf("%d %q %v", code, b, err)
			}
			body = b
			return nil
		})
		if id, _, _ := strings.Cut(body, "|"); id != ids[i] {
			t.Errorf("pod%d: transport_socket_matcher picked %q, want the pod's certificate %q", i, id, ids[i])
		}
	}
}

// startFactsEnvoy starts the real Envoy from a static bootstrap with hot restart disabled (as
// the supervisor runs it), and on failure logs what Envoy reports about its listeners and
// whether its process still runs.
func startFactsEnvoy(t *testing.T, boot string) *testenv.Envoy {
	t.Helper()
	ev := testenv.StartEnvoy(t, boot, testenv.EnvoyOptions{ExtraArgs: []string{"--disable-hot-restart"}})
	t.Cleanup(func() {
		if t.Failed() {
			l, err := ev.Admin(context.Background(), "/listeners")
			t.Logf("envoy pid %d alive=%v, /listeners at failure: %q %v", ev.Cmd.Process.Pid, testenv.ProcessRunning(ev.Cmd.Process.Pid), l, err)
		}
	})
	return ev
}
