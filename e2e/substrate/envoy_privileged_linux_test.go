//go:build linux

package substrate

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// nodeEnvoyBootstrap is a static Envoy config for a node: admin on 127.0.0.1:15000 and an HTTP
// listener on the node IP's :15443 answering the node's name.
func nodeEnvoyBootstrap(n *Node) string {
	return fmt.Sprintf(`admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 15000}}
static_resources:
  listeners:
  - name: tunnel
    address: {socket_address: {address: %s, port_value: 15443}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: tunnel
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "%s"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
`, n.Plan.IP, n.Name)
}

// TestPrivilegedNodeHookRunsEnvoy runs the real Envoy on every node from a node hook, as the
// agent's Envoy will run: each node's Envoy uses the same fixed admin port and the default
// hot-restart base ID without colliding (own network namespace, own /dev/shm), reads its
// bootstrap at a node path, serves on the node IP to the other node, and is stopped at teardown.
func TestPrivilegedNodeHookRunsEnvoy(t *testing.T) {
	testenv.RequireRoot(t)
	tl := testenv.RequireTools(t, testenv.ToolEtcd, testenv.ToolKubeAPIServer, testenv.ToolCNIPlugins, testenv.ToolEnvoy)
	bins := workloadBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	envoys := map[string]*Process{}
	s, err := Start(ctx, Options{
		Clusters: []ClusterSpec{{Name: "gamma", PodCIDR: "10.244.0.0/16", Nodes: 2}},
		Hooks: Hooks{Node: func(ctx context.Context, n *Node) error {
			if err := os.WriteFile(n.hostPath("/var/lib/aether/envoy.yaml"), []byte(nodeEnvoyBootstrap(n)), 0o644); err != nil {
				return err
			}
			p, err := n.Start("envoy", []string{tl.Envoy, "-c", "/var/lib/aether/envoy.yaml", "--concurrency", "1", "--log-level", "warning"}, nil)
			envoys[n.Name] = p
			return err
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c := s.Clusters[0]
	for _, n := range c.Nodes {
		var out []byte
		var err error
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			out, err = n.Exec(ctx, bins["client"], "http", "http://127.0.0.1:15000/ready")
			if err == nil && strings.TrimSpace(string(out)) == "LIVE" {
				break
			}
		}
		if err != nil || strings.TrimSpace(string(out)) != "LIVE" {
			log, _ := os.ReadFile(envoys[n.Name].Log)
			t.Fatalf("%s: Envoy admin /ready: %q, %v; log:\n%s", n.Name, out, err, log)
		}
		if _, err := os.Stat(n.hostPath("/dev/shm/envoy_shared_memory_0")); err != nil {
			t.Errorf("%s: Envoy's shared memory is not in the node's /dev/shm: %v", n.Name, err)
		}
	}
	for i, n := range c.Nodes {
		peer := c.Nodes[1-i]
		out, err := n.Exec(ctx, bins["client"], "http", "http://"+peer.Plan.IP.String()+":15443/")
		if err != nil || string(out) != peer.Name {
			t.Errorf("%s -> %s:15443: %q, %v; want %q", n.Name, peer.Plan.IP, out, err, peer.Name)
		}
	}
	s.Stop()
	for name, p := range envoys {
		select {
		case <-p.Done():
		default:
			t.Errorf("Envoy of %s still runs after Stop", name)
		}
	}
}
