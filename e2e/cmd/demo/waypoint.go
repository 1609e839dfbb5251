//go:build linux

package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
)

// What the demo shows of the waypoint path: the caller's node's EDS entries for the service's
// outbound cluster ("<svc>.<ns>.<meshDomain>:<port>", package xds ClusterName; the agents run
// with the default mesh domain "mesh") and, on each destination node, the tunnel listener's
// per-service tcp_proxy counters ("tcp." + tunnel.ServiceStatPrefix, docs/waypoint.md).
const (
	helloCluster = "hello." + ns + ".mesh:80"
	// envoyAdmin is each node Envoy's admin socket in the node's files (the agent's
	// --envoy-admin default, agent.DefaultEnvoyAdmin).
	envoyAdmin = "/var/run/aether/envoy-admin.sock"
)

// helloWaypointStat returns the name of one of the tunnel listener's counters for demo/hello:
// "tcp.waypoint.demo.hello.<counter>".
func helloWaypointStat(counter string) string {
	return "tcp." + tunnel.ServiceStatPrefix(model.ServiceKey{Namespace: ns, Name: "hello"}) + "." + counter
}

// tunnelCounters are one node's tunnel counters for the service: connections accepted
// (downstream_cx_total) and bytes received from callers (downstream_cx_rx_bytes_total).
type tunnelCounters struct {
	conns, rxBytes int
}

// envoyGet GETs path from node n's Envoy admin API (its unix socket in the node's files) and
// returns the body.
func envoyGet(n *substrate.Node, path string) (string, error) {
	c, base := envoy.AdminClient("unix://" + n.HostPath(envoyAdmin))
	resp, err := c.Get(base + path)
	if err != nil {
		return "", fmt.Errorf("get %s's Envoy admin %s: %w", n.Name, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("get %s's Envoy admin %s: %w", n.Name, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("get %s's Envoy admin %s: %s", n.Name, path, resp.Status)
	}
	return string(b), nil
}

// readTunnelCounters returns node n's tunnel counters for demo/hello (zero while Envoy has no
// such stat: the tunnel chain has not been used or does not exist yet).
func readTunnelCounters(n *substrate.Node) (tunnelCounters, error) {
	page, err := envoyGet(n, "/stats?filter="+url.QueryEscape("^"+regexp.QuoteMeta(helloWaypointStat(""))))
	if err != nil {
		return tunnelCounters{}, err
	}
	return tunnelCounters{
		conns:   statValue(page, helloWaypointStat("downstream_cx_total")),
		rxBytes: statValue(page, helloWaypointStat("downstream_cx_rx_bytes_total")),
	}, nil
}

// statValue returns the value of the stat name in an Envoy admin /stats page (text lines
// "<name>: <value>"), 0 when the page has no such stat or its value is not an integer.
func statValue(page, name string) int {
	for _, line := range strings.Split(page, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if ok && k == name {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// edsAddresses returns the distinct, sorted "<ip>:<port>" hosts of cluster in an Envoy admin
// /clusters page (text lines "<cluster>::<ip>:<port>::<stat>::<value>"; the cluster name itself
// holds one ':', before its port).
func edsAddresses(page, cluster string) []string {
	seen := map[string]bool{}
	for _, line := range strings.Split(page, "\n") {
		rest, ok := strings.CutPrefix(line, cluster+"::")
		if !ok {
			continue
		}
		host, _, ok := strings.Cut(rest, "::")
		if ok && strings.Contains(host, ":") {
			seen[host] = true
		}
	}
	out := make([]string, 0, len(seen))
	for h := range seen {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// showWaypoint prints the caller's node's EDS entries for hello (each a destination node's
// tunnel listener, named) and each destination node's tunnel counters before and after the
// requests. A page it cannot read is printed as the error; the demo goes on.
func showWaypoint(caller *substrate.Node, dest []*substrate.Node, before map[string]tunnelCounters) {
	step("through beta's node waypoints")
	byAddr := map[string]string{}
	for _, n := range dest {
		byAddr[fmt.Sprintf("%s:%d", n.Plan.IP, tunnel.Port)] = n.Name
	}
	fmt.Printf("  %s's Envoy, EDS of cluster %s (where the client's node sends it):\n", caller.Name, helloCluster)
	page, err := envoyGet(caller, "/clusters")
	if err != nil {
		fmt.Printf("      %v\n", err)
	}
	for _, a := range edsAddresses(page, helloCluster) {
		what := "not a waypoint"
		if n, ok := byAddr[a]; ok {
			what = n + "'s tunnel listener"
		}
		fmt.Printf("      %-22s %s\n", a, what)
	}
	fmt.Printf("  beta's tunnel listeners, Envoy stats %s* (before -> after the requests):\n", helloWaypointStat(""))
	for _, n := range dest {
		after, err := readTunnelCounters(n)
		if err != nil {
			fmt.Printf("      %s: %v\n", n.Name, err)
			continue
		}
		b := before[n.Name]
		fmt.Printf("      %s: connections %d -> %d, bytes from callers %d -> %d\n", n.Name, b.conns, after.conns, b.rxBytes, after.rxBytes)
	}
}

// tunnelCountersOf reads every node's tunnel counters, keyed by node name; a node it cannot
// read counts as zero.
func tunnelCountersOf(nodes []*substrate.Node) map[string]tunnelCounters {
	out := map[string]tunnelCounters{}
	for _, n := range nodes {
		c, _ := readTunnelCounters(n)
		out[n.Name] = c
	}
	return out
}
