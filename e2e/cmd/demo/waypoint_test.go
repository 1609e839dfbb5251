//go:build linux

package main

import (
	"slices"
	"testing"
)

// An excerpt of Envoy 1.40's admin /clusters text page on a caller's node with the waypoint on
// (one entry per beta node at :15443), with a neighbouring cluster whose name shares a prefix.
const clustersPage = `hello.demo.mesh:80::observability_name::hello.demo.mesh:80
hello.demo.mesh:80::default_priority::max_connections::1024
hello.demo.mesh:80::added_via_api::true
hello.demo.mesh:80::172.30.2.11:15443::cx_active::0
hello.demo.mesh:80::172.30.2.11:15443::rq_success::3
hello.demo.mesh:80::172.30.2.11:15443::hostname::
hello.demo.mesh:80::172.30.2.12:15443::cx_active::1
hello.demo.mesh:80::172.30.2.12:15443::health_flags::healthy
hello.demo.mesh:8080::10.244.1.5:15008::cx_active::0
other.demo.mesh:80::10.244.0.7:15008::cx_active::0
`

func TestEDSAddresses(t *testing.T) {
	for _, c := range []struct {
		name, page, cluster string
		want                []string
	}{
		{"waypoint entries, one per node", clustersPage, helloCluster, []string{"172.30.2.11:15443", "172.30.2.12:15443"}},
		{"a cluster whose name extends another's", clustersPage, "hello.demo.mesh:8080", []string{"10.244.1.5:15008"}},
		{"no such cluster", clustersPage, "absent.demo.mesh:80", []string{}},
		{"empty page", "", helloCluster, []string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := edsAddresses(c.page, c.cluster); !slices.Equal(got, c.want) {
				t.Errorf("edsAddresses(%s) = %v, want %v", c.cluster, got, c.want)
			}
		})
	}
}

func TestStatValue(t *testing.T) {
	page := "tcp.waypoint.demo.hello.downstream_cx_total: 7\n" +
		"tcp.waypoint.demo.hello.downstream_cx_rx_bytes_total: 1520\n" +
		"tcp.waypoint.demo.hello2.downstream_cx_total: 99\n" +
		"tcp.waypoint.demo.hello.downstream_cx_length_ms: No recorded values\n"
	for _, c := range []struct {
		name string
		stat string
		want int
	}{
		{"connections", helloWaypointStat("downstream_cx_total"), 7},
		{"bytes", helloWaypointStat("downstream_cx_rx_bytes_total"), 1520},
		{"histogram, not a number", helloWaypointStat("downstream_cx_length_ms"), 0},
		{"absent", helloWaypointStat("downstream_cx_tx_bytes_total"), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := statValue(page, c.stat); got != c.want {
				t.Errorf("statValue(%s) = %d, want %d", c.stat, got, c.want)
			}
		})
	}
	if got, want := helloWaypointStat("downstream_cx_total"), "tcp.waypoint.demo.hello.downstream_cx_total"; got != want {
		t.Errorf("helloWaypointStat = %q, want %q", got, want)
	}
}
