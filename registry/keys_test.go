package registry

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

func TestKeyLayout(t *testing.T) {
	o := Origin{Region: "eu-west", Cluster: "alpha"}
	tests := []struct {
		name string
		kind Kind
		key  string
		want string
	}{
		{"endpoint", KindEndpoint, o.EndpointKey("shop", "cart", "0f1e-uid"), "/aether/v1/regions/eu-west/clusters/alpha/endpoints/shop/cart/0f1e-uid"},
		{"export", KindExport, o.ExportKey("shop", "cart"), "/aether/v1/regions/eu-west/clusters/alpha/exports/shop/cart"},
		// base64url("shop/cart") without padding.
		{"config", KindConfig, o.ConfigKey("shop", "cart"), "/aether/v1/regions/eu-west/clusters/alpha/config/c2hvcC9jYXJ0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.key != tt.want {
				t.Fatalf("key = %q, want %q", tt.key, tt.want)
			}
			k, err := ParseKey(tt.key)
			if err != nil {
				t.Fatalf("ParseKey: %v", err)
			}
			if k.Origin != o || k.Namespace != "shop" || k.Service != "cart" || k.Kind != tt.kind {
				t.Fatalf("ParseKey = %+v", k)
			}
		})
	}
	t.Run("claim", func(t *testing.T) {
		if got, want := o.ClaimKey(), "/aether/v1/regions/eu-west/clusters/alpha/claim"; got != want {
			t.Fatalf("ClaimKey = %q, want %q", got, want)
		}
		k, err := ParseKey(o.ClaimKey())
		if err != nil || k != (Key{Origin: o, Kind: KindClaim}) {
			t.Fatalf("ParseKey(claim) = %+v, %v", k, err)
		}
	})
}

func TestParseKeyRejects(t *testing.T) {
	tests := []struct {
		name, key, wantErr string
	}{
		{"outside root", "/other/v1/regions/r/clusters/c/exports/ns/svc", "not under"},
		{"no clusters segment", "/aether/v1/regions/r/cluster/c/exports/ns/svc", "want /aether"},
		{"bad region", "/aether/v1/regions/R_1/clusters/c/exports/ns/svc", "region"},
		{"empty cluster", "/aether/v1/regions/r/clusters//exports/ns/svc", "cluster"},
		{"unknown kind", "/aether/v1/regions/r/clusters/c/widgets/ns/svc", "unknown kind"},
		{"claim with a tail", "/aether/v1/regions/r/clusters/c/claim/x", "unknown kind"},
		{"claim of a bad cluster", "/aether/v1/regions/r/clusters/C_1/claim", "cluster"},
		{"cluster without kind", "/aether/v1/regions/r/clusters/c/exports", "want /aether"},
		{"endpoint without uid", "/aether/v1/regions/r/clusters/c/endpoints/ns/svc", "endpoints/<ns>/<svc>/<pod uid>"},
		{"endpoint extra segment", "/aether/v1/regions/r/clusters/c/endpoints/ns/svc/uid/x", "endpoints/<ns>/<svc>/<pod uid>"},
		{"endpoint bad uid", "/aether/v1/regions/r/clusters/c/endpoints/ns/svc/u%20id", "pod_uid"},
		{"export bad namespace", "/aether/v1/regions/r/clusters/c/exports/NS/svc", "key.namespace"},
		{"config not base64", "/aether/v1/regions/r/clusters/c/config/***", "base64url"},
		{"config padded", "/aether/v1/regions/r/clusters/c/config/c2hvcC9jYXJ0cw==", "base64url"},
		{"config without slash", "/aether/v1/regions/r/clusters/c/config/c2hvcA", "want <ns>/<svc>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseKey(tt.key)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParseKey(%q) error = %v, want one containing %q", tt.key, err, tt.wantErr)
			}
		})
	}
}

func TestValidateNamesField(t *testing.T) {
	type mod func(*registryv1.ServiceEndpoint)
	tests := []struct {
		name      string
		mod       mod
		wantField string
	}{
		{"valid", func(*registryv1.ServiceEndpoint) {}, ""},
		{"no service", func(e *registryv1.ServiceEndpoint) { e.Service = nil }, "service"},
		{"bad service name", func(e *registryv1.ServiceEndpoint) { e.Service.Name = "Cart" }, "service.name"},
		{"no addresses", func(e *registryv1.ServiceEndpoint) { e.Addresses = nil }, "addresses"},
		{"bad address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"10.0.0.1", "10.0.0.300"} }, "addresses[1]"},
		{"duplicate address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"10.0.0.1", "10.0.0.1"} }, "addresses[1]"},
		{"port zero", func(e *registryv1.ServiceEndpoint) { e.Ports[1].Port = 0 }, "ports[1].port"},
		{"port too big", func(e *registryv1.ServiceEndpoint) { e.Ports[0].Port = 70000 }, "ports[0].port"},
		{"shared port under two names ok", func(e *registryv1.ServiceEndpoint) { e.Ports[1].Port = e.Ports[0].Port }, ""},
		{"duplicate unnamed port", func(e *registryv1.ServiceEndpoint) { e.Ports[1].Port, e.Ports[1].Name = e.Ports[0].Port, "" }, "ports[1].port"},
		{"duplicate port name", func(e *registryv1.ServiceEndpoint) { e.Ports[1].Name = e.Ports[0].Name }, "ports[1].name"},
		{"no protocol", func(e *registryv1.ServiceEndpoint) { e.Ports[0].Protocol = 0 }, "ports[0].protocol"},
		{"unknown protocol", func(e *registryv1.ServiceEndpoint) { e.Ports[0].Protocol = 42 }, "ports[0].protocol"},
		{"bad spiffe id", func(e *registryv1.ServiceEndpoint) { e.SpiffeId = "https://x" }, "spiffe_id"},
		{"no health", func(e *registryv1.ServiceEndpoint) { e.Health = 0 }, "health"},
		{"no kubernetes", func(e *registryv1.ServiceEndpoint) { e.Kubernetes = nil }, "kubernetes"},
		{"no pod uid", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.PodUid = "" }, "kubernetes.pod_uid"},
		{"slash in pod uid", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.PodUid = "a/b" }, "kubernetes.pod_uid"},
		{"no node name", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.NodeName = "" }, "kubernetes.node_name"},
		{"bad node ip", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.NodeIp = "node-1" }, "kubernetes.node_ip"},
		{"empty node ip ok", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.NodeIp = "" }, ""},
		{"unspecified address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"10.0.0.1", "0.0.0.0"} }, "addresses[1]"},
		{"multicast address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"ff02::1"} }, "addresses[0]"},
		{"ipv4-mapped address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"fd00::1", "::ffff:10.0.0.1"} }, "addresses[1]"},
		{"ipv4-mapped node ip", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.NodeIp = "::ffff:192.0.2.1" }, "kubernetes.node_ip"},
		{"unspecified node ip", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.NodeIp = "::" }, "kubernetes.node_ip"},
		{"node ip with zone", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.NodeIp = "fe80::1%eth0" }, "kubernetes.node_ip"},
		{"loopback node ip ok", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.NodeIp = "127.0.0.1" }, ""},
		{"loopback address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"10.0.0.1", "127.0.0.1"} }, "addresses[1]"},
		{"ipv6 loopback address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"::1"} }, "addresses[0]"},
		{"link-local address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"169.254.169.254"} }, "addresses[0]"},
		{"ipv6 link-local address", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"fe80::1"} }, "addresses[0]"},
		{"link-local node ip", func(e *registryv1.ServiceEndpoint) { e.Kubernetes.NodeIp = "169.254.1.1" }, "kubernetes.node_ip"},
		{"spiffe id of another namespace", func(e *registryv1.ServiceEndpoint) { e.SpiffeId = "spiffe://aether.internal/ns/kube-system/sa/cart" }, "spiffe_id"},
		{"spiffe id without a service account", func(e *registryv1.ServiceEndpoint) { e.SpiffeId = "spiffe://aether.internal/ns/shop/sa/" }, "spiffe_id"},
		{"spiffe id with a longer path", func(e *registryv1.ServiceEndpoint) { e.SpiffeId = "spiffe://aether.internal/ns/shop/sa/cart/x" }, "spiffe_id"},
		{"spiffe id not of the ns/sa form", func(e *registryv1.ServiceEndpoint) { e.SpiffeId = "spiffe://aether.internal/admin" }, "spiffe_id"},
		{"spiffe id with a bad trust domain", func(e *registryv1.ServiceEndpoint) { e.SpiffeId = "spiffe://Aether!/ns/shop/sa/cart" }, "spiffe_id"},
		{"ipv6 ok", func(e *registryv1.ServiceEndpoint) { e.Addresses = []string{"fd00::1", "10.0.0.1"} }, ""},
		{"100 addresses ok", func(e *registryv1.ServiceEndpoint) { e.Addresses = manyAddresses(MaxEndpointAddresses) }, ""},
		{"101 addresses", func(e *registryv1.ServiceEndpoint) { e.Addresses = manyAddresses(MaxEndpointAddresses + 1) }, "addresses"},
		{"100 ports ok", func(e *registryv1.ServiceEndpoint) { e.Ports = manyEndpointPorts(MaxEndpointPorts) }, ""},
		{"101 ports", func(e *registryv1.ServiceEndpoint) { e.Ports = manyEndpointPorts(MaxEndpointPorts + 1) }, "ports"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := testEndpoint("shop", "cart", "uid-1", "10.0.0.1")
			tt.mod(ep)
			assertField(t, ValidateEndpoint(ep), tt.wantField)
		})
	}
}

// manyAddresses returns n distinct IPv4 addresses.
func manyAddresses(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.1.%d.%d", i/250, 1+i%250)
	}
	return out
}

// manyEndpointPorts returns n distinct named HTTP ports from 8000 up.
func manyEndpointPorts(n int) []*registryv1.EndpointPort {
	out := make([]*registryv1.EndpointPort, n)
	for i := range out {
		out[i] = &registryv1.EndpointPort{Name: fmt.Sprintf("p%d", i), Port: uint32(8000 + i), Protocol: registryv1.Protocol_PROTOCOL_HTTP}
	}
	return out
}

// manyServicePorts returns n distinct named HTTP ports from 8000 up.
func manyServicePorts(n int) []*registryv1.ServicePort {
	out := make([]*registryv1.ServicePort, n)
	for i := range out {
		out[i] = &registryv1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: uint32(8000 + i), Protocol: registryv1.Protocol_PROTOCOL_HTTP}
	}
	return out
}

func assertField(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error = %v, want a *ValidationError for %s", err, want)
	}
	if ve.Field != want {
		t.Fatalf("error names field %q (%v), want %q", ve.Field, err, want)
	}
}

func testExport() *registryv1.ExportMark {
	return &registryv1.ExportMark{
		Service:    &registryv1.ServiceRef{Namespace: "shop", Name: "cart"},
		Ports:      []*registryv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		CreateTime: "2026-11-29T09:00:00.123456789Z",
	}
}

func TestValidateExport(t *testing.T) {
	tests := []struct {
		name      string
		mod       func(*registryv1.ExportMark)
		wantField string
	}{
		{"valid", func(*registryv1.ExportMark) {}, ""},
		{"no ports", func(m *registryv1.ExportMark) { m.Ports = nil }, "ports"},
		{"bad target port", func(m *registryv1.ExportMark) { m.Ports[0].TargetPort = 65536 }, "ports[0].target_port"},
		{"target port zero ok", func(m *registryv1.ExportMark) { m.Ports[0].TargetPort = 0 }, ""},
		{"duplicate port", func(m *registryv1.ExportMark) {
			m.Ports = append(m.Ports, &registryv1.ServicePort{Name: "b", Port: m.Ports[0].Port, Protocol: registryv1.Protocol_PROTOCOL_TCP})
		}, "ports[1].port"},
		{"duplicate UDP port", func(m *registryv1.ExportMark) {
			m.Ports = append(m.Ports, &registryv1.ServicePort{Name: "u", Port: 53, Protocol: registryv1.Protocol_PROTOCOL_UDP},
				&registryv1.ServicePort{Name: "u2", Port: 53, Protocol: registryv1.Protocol_PROTOCOL_UDP})
		}, "ports[2].port"},
		{"duplicate port name", func(m *registryv1.ExportMark) {
			m.Ports = append(m.Ports, &registryv1.ServicePort{Name: m.Ports[0].Name, Port: 81, Protocol: registryv1.Protocol_PROTOCOL_TCP})
		}, "ports[1].name"},
		{"unnamed port beside another", func(m *registryv1.ExportMark) {
			m.Ports = append(m.Ports, &registryv1.ServicePort{Port: 81, Protocol: registryv1.Protocol_PROTOCOL_TCP})
		}, "ports[1].name"},
		{"port name not a DNS label", func(m *registryv1.ExportMark) { m.Ports[0].Name = "Web_Port" }, "ports[0].name"},
		{"one unnamed port ok", func(m *registryv1.ExportMark) { m.Ports[0].Name = "" }, ""},
		{"exported labels and annotations ok", func(m *registryv1.ExportMark) {
			m.ExportedLabels = map[string]string{"team": "shop", "example.com/tier": "gold"}
			m.ExportedAnnotations = map[string]string{"example.com/owner": "any text: at all"}
		}, ""},
		{"label key not a qualified name", func(m *registryv1.ExportMark) {
			m.ExportedLabels = map[string]string{"bad key": "x"}
		}, "exported_labels"},
		{"label value too long", func(m *registryv1.ExportMark) {
			m.ExportedLabels = map[string]string{"team": strings.Repeat("x", 64)}
		}, "exported_labels[team]"},
		{"annotations over 256 KiB", func(m *registryv1.ExportMark) {
			m.ExportedAnnotations = map[string]string{"a": strings.Repeat("x", MaxExportedMetadataBytes)}
		}, "exported_annotations"},
		{"client IP affinity ok", func(m *registryv1.ExportMark) {
			m.SessionAffinity, m.SessionAffinityTimeoutSeconds = "ClientIP", 10800
		}, ""},
		{"unknown affinity", func(m *registryv1.ExportMark) { m.SessionAffinity = "Cookie" }, "session_affinity"},
		{"affinity timeout over a day", func(m *registryv1.ExportMark) {
			m.SessionAffinity, m.SessionAffinityTimeoutSeconds = "ClientIP", 86401
		}, "session_affinity_timeout_seconds"},
		{"timeout without affinity", func(m *registryv1.ExportMark) { m.SessionAffinityTimeoutSeconds = 5 }, "session_affinity_timeout_seconds"},
		{"UDP beside TCP on one port ok", func(m *registryv1.ExportMark) {
			m.Ports = append(m.Ports, &registryv1.ServicePort{Name: "u", Port: m.Ports[0].Port, Protocol: registryv1.Protocol_PROTOCOL_UDP})
		}, ""},
		{"bad create time", func(m *registryv1.ExportMark) { m.CreateTime = "yesterday" }, "create_time"},
		{"bad namespace", func(m *registryv1.ExportMark) { m.Service.Namespace = "a/b" }, "service.namespace"},
		{"100 ports ok", func(m *registryv1.ExportMark) { m.Ports = manyServicePorts(MaxExportPorts) }, ""},
		{"101 ports", func(m *registryv1.ExportMark) { m.Ports = manyServicePorts(MaxExportPorts + 1) }, "ports"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := testExport()
			tt.mod(m)
			assertField(t, ValidateExport(m), tt.wantField)
		})
	}
}

// testConfig is a projection using every part of the route record: an HTTPRoute with parentRefs,
// path, header, query and method matches, header filters, a rewrite, a mirror, CORS, weighted
// backends, timeouts and retries and a redirect rule, and a GRPCRoute with a method match.
func testConfig() *registryv1.ServiceConfigProjection {
	cart := &registryv1.ServiceRef{Namespace: "shop", Name: "cart"}
	cartV2 := &registryv1.ServiceRef{Namespace: "shop", Name: "cart-v2"}
	exact := registryv1.StringMatchType_STRING_MATCH_TYPE_EXACT
	return &registryv1.ServiceConfigProjection{
		Service: cart,
		Version: 3, ExportTime: "2026-11-29T09:00:00.000000001Z", ExportCreateTime: "2026-11-28T10:00:00Z",
		Routes: []*registryv1.Route{{
			Kind: registryv1.Route_KIND_HTTP, Namespace: "shop", Name: "cart-canary", Generation: 2, CreateTime: "2026-11-29T08:00:00Z",
			ParentRefs: []*registryv1.ParentRef{{Kind: registryv1.ParentRef_KIND_SERVICE, Service: cart, Port: 80}},
			Rules: []*registryv1.RouteRule{{
				Matches: []*registryv1.RouteMatch{{
					Path:        &registryv1.PathMatch{Type: registryv1.PathMatch_TYPE_PATH_PREFIX, Value: "/api"},
					Headers:     []*registryv1.HeaderMatch{{Name: "x-canary", Value: "^(yes|true)$", Type: registryv1.StringMatchType_STRING_MATCH_TYPE_REGULAR_EXPRESSION}},
					QueryParams: []*registryv1.QueryParamMatch{{Name: "debug", Value: "1", Type: exact}},
					Method:      "GET",
				}},
				Filters: []*registryv1.RouteFilter{
					{Filter: &registryv1.RouteFilter_RequestHeaderModifier{RequestHeaderModifier: &registryv1.HeaderModifier{
						Set: []*registryv1.Header{{Name: "x-route", Value: "canary"}}, Remove: []string{"x-debug"}}}},
					{Filter: &registryv1.RouteFilter_UrlRewrite{UrlRewrite: &registryv1.URLRewrite{
						Path: &registryv1.PathModifier{Type: registryv1.PathModifier_TYPE_REPLACE_PREFIX_MATCH, Value: "/v2"}}}},
					{Filter: &registryv1.RouteFilter_RequestMirror{RequestMirror: &registryv1.RequestMirror{
						Backend: &registryv1.BackendRef{Kind: registryv1.BackendRef_KIND_SERVICE, Service: cartV2, Port: 80, Weight: 1}, Numerator: 10, Denominator: 100}}},
					{Filter: &registryv1.RouteFilter_Cors{Cors: &registryv1.CORS{AllowOrigins: []string{"https://shop.example"}, AllowMethods: []string{"GET"}, MaxAgeSeconds: 5}}},
				},
				Backends: []*registryv1.BackendRef{
					{Kind: registryv1.BackendRef_KIND_SERVICE, Service: cart, Port: 80, Weight: 90},
					{Kind: registryv1.BackendRef_KIND_SERVICE_IMPORT, Service: cartV2, Port: 80, Weight: 10},
				},
				Timeouts: &registryv1.RouteTimeouts{RequestMs: proto.Int64(5000), BackendRequestMs: proto.Int64(2000)},
				Retry:    &registryv1.RetryPolicy{Attempts: proto.Int64(3), Codes: []uint32{502, 503}, BackoffMs: proto.Int64(100)},
			}, {
				Matches: []*registryv1.RouteMatch{{Path: &registryv1.PathMatch{Type: registryv1.PathMatch_TYPE_EXACT, Value: "/old"}}},
				Filters: []*registryv1.RouteFilter{{Filter: &registryv1.RouteFilter_RequestRedirect{RequestRedirect: &registryv1.RequestRedirect{
					Scheme: "https", StatusCode: 301, Path: &registryv1.PathModifier{Type: registryv1.PathModifier_TYPE_REPLACE_FULL_PATH, Value: "/new"}}}}},
			}},
		}, {
			Kind: registryv1.Route_KIND_GRPC, Namespace: "shop", Name: "cart-grpc",
			ParentRefs: []*registryv1.ParentRef{{Kind: registryv1.ParentRef_KIND_SERVICE, Service: cart}},
			Rules: []*registryv1.RouteRule{{
				Matches:  []*registryv1.RouteMatch{{GrpcMethod: &registryv1.GRPCMethodMatch{Type: exact, Service: "shop.Cart", Method: "Checkout"}}},
				Backends: []*registryv1.BackendRef{{Kind: registryv1.BackendRef_KIND_SERVICE, Service: cart, Port: 9090, Weight: 1}},
			}},
		}},
	}
}

func TestValidateConfig(t *testing.T) {
	tests := []struct {
		name      string
		mod       func(*registryv1.ServiceConfigProjection)
		wantField string
	}{
		{"valid", func(*registryv1.ServiceConfigProjection) {}, ""},
		{"no version", func(c *registryv1.ServiceConfigProjection) { c.Version = 0 }, "version"},
		{"no export time", func(c *registryv1.ServiceConfigProjection) { c.ExportTime = "" }, "export_time"},
		{"export time not RFC 3339", func(c *registryv1.ServiceConfigProjection) { c.ExportTime = "yesterday" }, "export_time"},
		{"no export create time", func(c *registryv1.ServiceConfigProjection) { c.ExportCreateTime = "" }, "export_create_time"},
		{"over a MiB", func(c *registryv1.ServiceConfigProjection) {
			for proto.Size(c) <= MaxConfigBytes {
				c.Routes = append(c.Routes, proto.Clone(c.Routes[0]).(*registryv1.Route))
			}
		}, "config"},
		{"too many routes", func(c *registryv1.ServiceConfigProjection) {
			for len(c.Routes) <= MaxConfigRoutes {
				c.Routes = append(c.Routes, &registryv1.Route{})
			}
		}, "routes"},
		{"no kind", func(c *registryv1.ServiceConfigProjection) { c.Routes[1].Kind = 0 }, "routes[1].kind"},
		{"no route name", func(c *registryv1.ServiceConfigProjection) { c.Routes[0].Name = "" }, "routes[0].name"},
		{"relative path", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Matches[0].Path.Value = "api"
		}, "routes[0].rules[0].matches[0].path.value"},
		{"bad header regex", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Matches[0].Headers[0].Value = "("
		}, "routes[0].rules[0].matches[0].headers[0].value"},
		{"lower-case method", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Matches[0].Method = "get"
		}, "routes[0].rules[0].matches[0].method"},
		{"grpc route with path", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[1].Rules[0].Matches[0].Path = &registryv1.PathMatch{Value: "/x"}
		}, "routes[1].rules[0].matches[0].path"},
		{"http route with grpc method", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Matches[0].GrpcMethod = &registryv1.GRPCMethodMatch{Method: "M"}
		}, "routes[0].rules[0].matches[0].grpc_method"},
		{"empty filter", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Filters[1] = &registryv1.RouteFilter{}
		}, "routes[0].rules[0].filters[1]"},
		{"bad header name", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Filters[0].GetRequestHeaderModifier().Set[0].Name = "x route"
		}, "routes[0].rules[0].filters[0].request_header_modifier.set[0].name"},
		{"mirror fraction", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Filters[2].GetRequestMirror().Numerator = 101
		}, "routes[0].rules[0].filters[2].request_mirror.numerator"},
		{"redirect code", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[1].Filters[0].GetRequestRedirect().StatusCode = 305
		}, "routes[0].rules[1].filters[0].request_redirect.status_code"},
		{"backend port", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Backends[1].Port = 65536
		}, "routes[0].rules[0].backends[1].port"},
		{"nil route", func(c *registryv1.ServiceConfigProjection) { c.Routes[1] = nil }, "routes[1]"},
		{"parent kind", func(c *registryv1.ServiceConfigProjection) { c.Routes[0].ParentRefs[0].Kind = 0 }, "routes[0].parent_refs[0].kind"},
		{"backend service", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[1].Rules[0].Backends[0].Service = nil
		}, "routes[1].rules[0].backends[0].service"},
		{"retry code", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Retry.Codes = []uint32{200}
		}, "routes[0].rules[0].retry.codes[0]"},
		{"backend timeout above request timeout", func(c *registryv1.ServiceConfigProjection) {
			c.Routes[0].Rules[0].Timeouts.BackendRequestMs = proto.Int64(6000)
		}, "routes[0].rules[0].timeouts.backend_request_ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			tt.mod(c)
			assertField(t, ValidateConfig(c), tt.wantField)
		})
	}
}

func TestNewRejectsBadOrigin(t *testing.T) {
	tests := []struct {
		name            string
		region, cluster string
		wantField       string
	}{
		{"empty region", "", "alpha", "region"},
		{"slash in cluster", "eu", "a/b", "cluster"},
		{"upper case", "EU", "alpha", "region"},
		{"too long", "eu", strings.Repeat("a", 64), "cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewWithClient(nil, Config{Region: tt.region, Cluster: tt.cluster})
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.wantField {
				t.Fatalf("NewWithClient(%q, %q) error = %v, want one naming %s", tt.region, tt.cluster, err, tt.wantField)
			}
		})
	}
	if _, err := New(Config{Region: "eu", Cluster: "alpha"}); err == nil {
		t.Fatal("New without endpoints succeeded")
	}
}
