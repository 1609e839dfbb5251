package xds

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// celCaptureListener is a capture-like listener on 127.0.0.1:port in netns: original_dst, then
// the set_filter_state listener filter writing aether.direct from the CEL expression expr (over
// the restored destination; with expr "", no value, as headlessFilter without entries), then a
// filter_chain_matcher on that filter state: "member" -> the chain answering "member", anything
// else (or unset) -> the default chain answering "other".
func celCaptureListener(name, netns string, port int, expr string) string {
	onAccept := fmt.Sprintf(`
        - object_key: aether.direct
          factory_key: envoy.string
          skip_if_empty: true
          format_string:
            text_format_source: { inline_string: %q }
            omit_empty_values: true
            formatters:
            - name: envoy.formatter.cel
              typed_config: { "@type": type.googleapis.com/envoy.extensions.formatter.cel.v3.Cel }`, expr)
	if expr == "" {
		onAccept = " []"
	}
	chain := func(name string) string {
		return fmt.Sprintf(`
      name: %[1]s
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: %[1]s
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                direct_response: { status: 200, body: { inline_string: "%[1]s" } }
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router`, name)
	}
	return fmt.Sprintf(`
  - name: %[5]s
    address:
      socket_address: { address: 127.0.0.1, port_value: %[6]d, network_namespace_filepath: %[1]q }
    listener_filters:
    - name: envoy.filters.listener.original_dst
      typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst }
    - name: envoy.filters.listener.set_filter_state
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.listener.set_filter_state.v3.Config
        on_accept:%[2]s
    filter_chain_matcher:
      matcher_tree:
        input:
          name: direct
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.FilterStateInput
            key: aether.direct
        exact_match_map:
          map:
            member:
              action:
                name: member
                typed_config: { "@type": type.googleapis.com/google.protobuf.StringValue, value: member }
    filter_chains:
    - %[3]s
    default_filter_chain:
      %[4]s
`, netns, onAccept, chain("member"), chain("other"), name, port)
}

// celPod is a pod netns with a default route (through a veth pair of its own: any destination is
// routable) whose outbound TCP, but to loopback, is redirected to 127.0.0.1:15001, as the capture
// rules do.
func celPod(tb testing.TB) *testenv.Netns {
	tb.Helper()
	pod := testenv.NewNetns(tb)
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"link", "set", "d1", "up"},
		{"addr", "add", "10.9.0.2/24", "dev", "d0"},
		{"link", "set", "d0", "up"},
		{"route", "add", "default", "dev", "d0"},
	} {
		if out, err := pod.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	cmd := pod.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader("table ip t { chain out { type nat hook output priority -100; policy accept; ip daddr 127.0.0.0/8 return; meta mark 0x4145 return; meta l4proto tcp redirect to :15001\n}\n}\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("nft: %v: %s", err, out)
	}
	return pod
}

// TestPrivilegedEnvoyFactCELFilterStateMatch checks, with Envoy 1.40, what the capture listener
// relies on to keep headless endpoints out of its matcher (headlessFilter, docs/node-proxy.md,
// "Headless Services"): a set_filter_state listener filter computing a value from the destination
// restored by original_dst with the CEL expression headlessExpr writes (envoy.formatter.cel: a
// map lookup of destination.address per destination.port), and a filter_chain_matcher on that
// filter state (FilterStateInput). Destinations in their port's map select the "member" chain;
// others (no map for the port, not in it, or the filter without entries) leave the key unset and
// fall to the default chain.
func TestPrivilegedEnvoyFactCELFilterStateMatch(t *testing.T) {
	testenv.RequireRoot(t)
	pod := celPod(t)
	// The expressions headlessFilter writes: one map per port (7000 and 7001; 10.1.2.3 serves
	// both), and the filter without entries (no value at all).
	member := headlessExpr(addrPorts(map[string]string{"10.1.2.3:7000": "member", "10.1.2.5:7000": "member", "10.1.2.3:7001": "member"}))
	var b strings.Builder
	b.WriteString(factsAdmin + "static_resources:\n  listeners:" + celCaptureListener("capture", pod.Path, 15001, member))
	b.WriteString(celCaptureListener("empty", pod.Path, 15002, ""))
	startFactsEnvoy(t, b.String())
	for _, c := range []struct{ dst, want string }{
		{"10.1.2.3:7000", "member"},
		{"10.1.2.5:7000", "member"},
		{"10.1.2.4:7000", "other"},
		{"10.1.2.3:7001", "member"},
		{"10.1.2.5:7001", "other"},   // a member on another port
		{"10.1.2.3:7002", "other"},   // a port without a map
		{"127.0.0.1:15002", "other"}, // the listener without entries, reached directly
	} {
		var body string
		testenv.Eventually(t, time.Minute, "GET "+c.dst, func() error {
			code, b, _, err := getBody(pod.HTTPClient(false), "http://"+c.dst+"/", nil)
			if err != nil || code != 200 {
				return fmt.Errorf("%d %q %v", code, b, err)
			}
			body = b
			return nil
		})
		if body != c.want {
			t.Errorf("GET %s: %q, want chain %s", c.dst, body, c.want)
		}
	}
}

// BenchmarkEnvoyCELHeadlessLookup measures what headlessFilter's CEL map costs a connection: a
// new connection and one HTTP request through a capture-like listener (celCaptureListener, real
// Envoy 1.40, --concurrency 1) whose expression maps K headless endpoints, to a listed endpoint
// (member), to another address on that port (nonmember: the map is built all the same), and to
// a port without a map (guarded: one port comparison), against a
// listener whose filter has no entries and so sets nothing (empty, headlessFilter's form for a
// node without headless endpoints). K is AETHER_BENCH_ENDPOINTS (default 1000, maxHeadlessMap;
// with 6000 Envoy did not become ready within a minute).
//
//	go test ./xds/ -run '^$' -bench BenchmarkEnvoyCELHeadlessLookup -benchtime 2000x
func BenchmarkEnvoyCELHeadlessLookup(b *testing.B) {
	testenv.RequireRoot(b)
	k := testenv.BenchEnv(b, "AETHER_BENCH_ENDPOINTS", maxHeadlessMap)
	pod := celPod(b)
	direct := map[string]string{}
	for i := 0; i < k; i++ {
		direct[fmt.Sprintf("10.%d.%d.%d:7000", 100+i>>16, (i>>8)&255, i&255)] = "member"
	}
	var boot strings.Builder
	boot.WriteString(factsAdmin + "static_resources:\n  listeners:" + celCaptureListener("capture", pod.Path, 15001, headlessExpr(addrPorts(direct))))
	boot.WriteString(celCaptureListener("empty", pod.Path, 15002, ""))
	testenv.StartEnvoy(b, boot.String(), testenv.EnvoyOptions{ExtraArgs: []string{"--disable-hot-restart"}})
	last := fmt.Sprintf("10.%d.%d.%d:7000", 100+(k-1)>>16, ((k-1)>>8)&255, (k-1)&255)
	for _, c := range []struct{ name, url, want string }{
		{"member", "http://" + last + "/", "member"},
		{"nonmember", "http://10.99.0.1:7000/", "other"},
		{"guarded", "http://10.100.0.0:7001/", "other"},
		{"empty", "http://127.0.0.1:15002/", "other"},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := pod.HTTPClient(false) // a new connection per request
			testenv.Eventually(b, time.Minute, "GET "+c.url, func() error {
				code, body, _, err := getBody(client, c.url, nil)
				if err != nil || code != 200 || body != c.want {
					return fmt.Errorf("%d %q %v, want %q", code, body, err, c.want)
				}
				return nil
			})
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, _, _, err := getBody(client, c.url, map[string]string{"Connection": "close"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
