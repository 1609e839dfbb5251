package agent

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	env := map[string]string{"NODE_NAME": "n1", "AETHER_CLUSTER": "a", "HOST_IP": "172.30.0.11", "AETHER_REGISTRY_ENDPOINTS": "http://127.0.0.1:2379",
		"AETHER_CA_CERT": "/etc/hostname", "AETHER_CA_KEY": "/etc/hostname"}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "env defaults", args: nil},
		{name: "waypoint on", args: []string{"--east-west-waypoint"}},
		{name: "dual stack", args: []string{"--host-ip-v6", "fd00::11", "--cluster-dns", "10.96.0.10,fd00:96::a"}},
		{name: "host ip v6 not v6", args: []string{"--host-ip-v6", "172.30.0.11"}, wantErr: `--host-ip-v6 "172.30.0.11"`},
		{name: "host ips of a dual-stack node", args: []string{"--host-ips", "172.30.0.11, fd00::11"}},
		{name: "host ips of a single-stack node", args: []string{"--host-ips", "172.30.0.11"}},
		{name: "host ip v6 wins over host ips", args: []string{"--host-ips", "172.30.0.11,fd00::11", "--host-ip-v6", "fd00::12"}},
		{name: "bad host ips", args: []string{"--host-ips", "172.30.0.11,nope"}, wantErr: `--host-ips "172.30.0.11,nope": "nope" is not an IP address`},
		{name: "ipv6 cluster dns without host ip v6", args: []string{"--cluster-dns", "fd00:96::a"}, wantErr: "--cluster-dns fd00:96::a is IPv6: set --host-ip-v6"},
		{name: "flags override env", args: []string{"--node-name", "n2", "--registry-endpoints", "http://127.0.0.1:2379, http://127.0.0.1:2380"}},
		{name: "bad host ip", args: []string{"--host-ip", "nope"}, wantErr: `--host-ip "nope"`},
		{name: "bad dns port", args: []string{"--dns-port", "70000"}, wantErr: "--dns-port 70000"},
		{name: "dns cache off", args: []string{"--dns-cache-size", "0"}},
		{name: "dns cache tuned", args: []string{"--dns-cache-size", "500", "--dns-cache-max-ttl", "5m", "--dns-cache-max-negative-ttl", "1s"}},
		{name: "negative dns cache size", args: []string{"--dns-cache-size", "-1"}, wantErr: "--dns-cache-size -1"},
		{name: "dns cache max ttl not whole seconds", args: []string{"--dns-cache-max-ttl", "1500ms"}, wantErr: "--dns-cache-max-ttl 1.5s"},
		{name: "dns cache max ttl zero", args: []string{"--dns-cache-max-ttl", "0s"}, wantErr: "--dns-cache-max-ttl 0s"},
		{name: "dns cache max negative ttl under a second", args: []string{"--dns-cache-max-negative-ttl", "500ms"}, wantErr: "--dns-cache-max-negative-ttl 500ms"},
		{name: "dns cache serve-stale and prefetch", args: []string{"--dns-cache-serve-stale", "24h", "--dns-cache-prefetch", "5"}},
		{name: "dns cache serve-stale not whole seconds", args: []string{"--dns-cache-serve-stale", "1500ms"}, wantErr: "--dns-cache-serve-stale 1.5s"},
		{name: "dns cache serve-stale over a week", args: []string{"--dns-cache-serve-stale", "169h"}, wantErr: "--dns-cache-serve-stale 169h0m0s"},
		{name: "negative dns cache serve-stale", args: []string{"--dns-cache-serve-stale", "-1s"}, wantErr: "--dns-cache-serve-stale -1s"},
		{name: "dns rate limit and allowed sources", args: []string{"--dns-rate-limit", "0", "--dns-allow-sources", "10.96.0.10, 10.244.0.0/16,fd00::/64"}},
		{name: "negative dns rate limit", args: []string{"--dns-rate-limit", "-5"}, wantErr: "--dns-rate-limit -5"},
		{name: "ipv4-mapped dns allowed source", args: []string{"--dns-allow-sources", "::ffff:10.0.0.0/104"}, wantErr: `--dns-allow-sources "::ffff:10.0.0.0/104": IPv4-mapped`},
		{name: "bad dns allowed source", args: []string{"--dns-allow-sources", "10.0.0.0/8,kube-dns"}, wantErr: `--dns-allow-sources "kube-dns": not an IP address or CIDR`},
		{name: "envoy overload limits", args: []string{"--envoy-max-connections", "5000", "--envoy-max-heap", "536870912"}},
		{name: "bad envoy max connections", args: []string{"--envoy-max-connections", "-1"}, wantErr: "envoy-max-connections"},
		{name: "zero envoy max connections", args: []string{"--envoy-max-connections", "0"}, wantErr: "--envoy-max-connections 0"},
		{name: "waypoint limit", args: []string{"--east-west-waypoint", "--waypoint-max-connections", "100"}},
		{name: "zero waypoint limit", args: []string{"--waypoint-max-connections", "0"}, wantErr: "--waypoint-max-connections 0"},
		{name: "negative dns cache prefetch", args: []string{"--dns-cache-prefetch", "-1"}, wantErr: "--dns-cache-prefetch -1"},
		{name: "ca pair", args: []string{"--ca-key", ""}, wantErr: "--ca-cert and --ca-key go together"},
		{name: "short svid ttl", args: []string{"--svid-ttl", "30s"}, wantErr: "--svid-ttl 30s"},
		{name: "cni repair interval under a second", args: []string{"--cni-repair-interval", "0s"}, wantErr: "--cni-repair-interval 0s"},
		{name: "missing file", args: []string{"--registry-ca", "/nonexistent/ca.pem"}, wantErr: `--registry-ca "/nonexistent/ca.pem"`},
		{name: "plaintext registry off loopback", args: []string{"--registry-endpoints", "http://10.0.0.5:2379"},
			wantErr: `--registry-endpoints "http://10.0.0.5:2379": plaintext to a registry off loopback`},
		{name: "plaintext registry off loopback, insecure", args: []string{"--registry-endpoints", "http://10.0.0.5:2379", "--registry-insecure"}},
		{name: "bad log level", args: []string{"--log-level", "loud"}, wantErr: `--log-level "loud"`},
		{name: "bad mesh domain", args: []string{"--mesh-domain", "a..b"}, wantErr: `--mesh-domain "a..b"`},
		{name: "cluster domain", args: []string{"--cluster-domain", "corp.example."}},
		{name: "bad cluster domain", args: []string{"--cluster-domain", "corp_example"}, wantErr: `--cluster-domain "corp_example"`},
		{name: "cluster domain label starting with a hyphen", args: []string{"--cluster-domain", "-corp.example"}, wantErr: `--cluster-domain "-corp.example"`},
		{name: "short lease", args: []string{"--registry-lease-ttl", "1s"}, wantErr: "--registry-lease-ttl 1s"},
		{name: "bad cluster dns", args: []string{"--cluster-dns", "10.96.0.10,x"}, wantErr: `--cluster-dns "x"`},
		{name: "bad inbound mode", args: []string{"--inbound-mode", "open"}, wantErr: `--inbound-mode "open"`},
		{name: "bad capture backend", args: []string{"--capture-backend", "ebpf"}, wantErr: `--capture-backend "ebpf"`},
		{name: "bad capture mode", args: []string{"--capture-mode", "bpf"}, wantErr: `--capture-mode "bpf": want auto, ebpf or nft`},
		{name: "relative bpffs dir", args: []string{"--capture-mode", "auto", "--bpffs-dir", "bpf/aether"}, wantErr: `--bpffs-dir "bpf/aether": want an absolute path`},
		{name: "registry cert without key", args: []string{"--registry-cert", "/etc/hostname"}, wantErr: "--registry-cert and --registry-key go together"},
		{name: "missing registry CA", args: []string{"--registry-ca", "/nonexistent/ca.pem"}, wantErr: `--registry-ca "/nonexistent/ca.pem"`},
		// The node's port plan (DESIGN.md, ports): one number per role, flags and fixed ports.
		{name: "dns port is the capture port", args: []string{"--dns-port", "15001"}, wantErr: "--dns-port and the capture listener's port are both 15001"},
		{name: "dns port is the inbound port", args: []string{"--dns-port", "15008"}, wantErr: "--dns-port and the inbound mTLS port are both 15008"},
		{name: "dns port is the tunnel port", args: []string{"--dns-port", "15443"}, wantErr: "--dns-port and the east-west tunnel port are both 15443"},
		{name: "dns port is envoy admin's", args: []string{"--envoy-admin", "127.0.0.1:15000", "--dns-port", "15000"}, wantErr: "--dns-port and --envoy-admin are both 15000"},
		{name: "dns port is the health port", args: []string{"--dns-port", "15021"}, wantErr: "--dns-port and --health-addr are both 15021"},
		{name: "dns port is the metrics port", args: []string{"--dns-port", "15020"}, wantErr: "--dns-port and --metrics-addr are both 15020"},
		{name: "dns port is envoy's stats port", args: []string{"--dns-port", "15090"}, wantErr: "--dns-port and --envoy-stats-addr are both 15090"},
		{name: "metrics and stats off", args: []string{"--metrics-addr", "", "--envoy-stats-addr", "", "--dns-port", "15090"}},
		{name: "envoy admin on the metrics port", args: []string{"--envoy-admin", "127.0.0.1:9000", "--health-addr", "0.0.0.0:9000"}, wantErr: "--envoy-admin and --health-addr are both 9000"},
		{name: "envoy admin on the capture port", args: []string{"--envoy-admin", "127.0.0.1:15001"}, wantErr: "--envoy-admin and the capture listener's port are both 15001"},
		{name: "metrics on the tunnel port", args: []string{"--health-addr", ":15443"}, wantErr: "--health-addr and the east-west tunnel port are both 15443"},
		{name: "metrics on the lane port", args: []string{"--health-addr", "127.0.0.1:18081"}, wantErr: "--health-addr and the explicit HTTP lane's port are both 18081"},
		{name: "envoy admin without a port", args: []string{"--envoy-admin", "127.0.0.1"}, wantErr: `--envoy-admin "127.0.0.1": want host:port`},
		{name: "health addr with a bad port", args: []string{"--health-addr", "127.0.0.1:nope"}, wantErr: `--health-addr "127.0.0.1:nope": want host:port`},
		{name: "kernel-picked ports", args: []string{"--envoy-admin", "127.0.0.1:0", "--health-addr", "127.0.0.1:0"}},
		{name: "envoy admin on a unix socket", args: []string{"--envoy-admin", "unix:///run/aether/admin.sock", "--dns-port", "15000"}},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
		// Config projections (docs/projections.md).
		{name: "import config with a control cluster", args: []string{"--import-config", "--control-cluster", "hub-1", "--registry-sync-grace", "0s"}},
		{name: "control cluster not a label", args: []string{"--control-cluster", "Hub_1"}, wantErr: `--control-cluster "Hub_1": want a cluster name, an RFC 1123 label`},
		{name: "control cluster too long", args: []string{"--control-cluster", strings.Repeat("a", 64)}, wantErr: `--control-cluster "` + strings.Repeat("a", 64) + `"`},
		{name: "negative registry sync grace", args: []string{"--registry-sync-grace", "-1s"}, wantErr: "--registry-sync-grace -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig(tc.args, getenv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to name %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Cluster != "a" || c.HostIP.String() != "172.30.0.11" || c.MeshDomain != "mesh" || c.TrustDomain != "aether.internal" {
				t.Errorf("config = %+v", c)
			}
			if tc.name == "flags override env" && (c.NodeName != "n2" || len(c.Registry.Endpoints()) != 2 || c.Registry.Endpoints()[1] != "http://127.0.0.1:2380") {
				t.Errorf("flags did not override: %+v", c)
			}
			if tc.name == "env defaults" && c.EastWestWaypoint {
				t.Errorf("--east-west-waypoint is on by default, want off")
			}
			if tc.name == "env defaults" && (c.DNSCacheSize != 10000 || c.DNSCacheMaxTTL != 30*time.Second || c.DNSCacheMaxNegativeTTL != 5*time.Second) {
				t.Errorf("DNS cache defaults %d, %s, %s; want NodeLocal DNSCache's 10000, 30s, 5s", c.DNSCacheSize, c.DNSCacheMaxTTL, c.DNSCacheMaxNegativeTTL)
			}
			if tc.name == "env defaults" && (c.DNSCacheServeStale != 0 || c.DNSCachePrefetch != 0) {
				t.Errorf("DNS cache serve-stale %s, prefetch %d by default; want both off", c.DNSCacheServeStale, c.DNSCachePrefetch)
			}
			if tc.name == "dns cache serve-stale and prefetch" && (c.DNSCacheServeStale != 24*time.Hour || c.DNSCachePrefetch != 5) {
				t.Errorf("DNS cache serve-stale %s, prefetch %d; want 24h and 5", c.DNSCacheServeStale, c.DNSCachePrefetch)
			}
			if wantV6, ok := map[string]string{"host ips of a dual-stack node": "fd00::11", "host ips of a single-stack node": "invalid IP",
				"host ip v6 wins over host ips": "fd00::12", "env defaults": "invalid IP"}[tc.name]; ok && c.HostIPv6.String() != wantV6 {
				t.Errorf("host IPv6 %s, want %s", c.HostIPv6, wantV6)
			}
			if tc.name == "dual stack" && (c.HostIPv6 != netip.MustParseAddr("fd00::11") || len(c.ClusterDNS) != 2) {
				t.Errorf("dual stack config = host IPv6 %s, cluster DNS %v", c.HostIPv6, c.ClusterDNS)
			}
			if tc.name == "env defaults" && (c.ImportConfig || c.ControlCluster != "" || c.RegistrySyncGrace != 15*time.Second) {
				t.Errorf("--import-config %v, --control-cluster %q, --registry-sync-grace %s by default; want off, empty, 15s", c.ImportConfig, c.ControlCluster, c.RegistrySyncGrace)
			}
			if tc.name == "import config with a control cluster" && (!c.ImportConfig || c.ControlCluster != "hub-1" || c.RegistrySyncGrace != 0) {
				t.Errorf("--import-config %v, --control-cluster %q, --registry-sync-grace %s; want on, hub-1, 0s", c.ImportConfig, c.ControlCluster, c.RegistrySyncGrace)
			}
			if tc.name == "waypoint on" && !c.EastWestWaypoint {
				t.Errorf("--east-west-waypoint did not turn the waypoint on")
			}
		})
	}
	// The ConfigMap's form: the cache settings from the environment, a flag winning; a
	// variable that does not parse names itself.
	withEnv := func(kv ...string) func(string) string {
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			e[kv[i]] = kv[i+1]
		}
		return func(k string) string { return e[k] }
	}
	c, err := ParseConfig([]string{"--dns-cache-prefetch", "9"}, withEnv("AETHER_DNS_CACHE_SERVE_STALE", "72h", "AETHER_DNS_CACHE_PREFETCH", "2"))
	if err != nil || c.DNSCacheServeStale != 72*time.Hour || c.DNSCachePrefetch != 9 {
		t.Errorf("serve-stale and prefetch from env: %s, %d, %v; want 72h (env) and 9 (flag)", c.DNSCacheServeStale, c.DNSCachePrefetch, err)
	}
	c, err = ParseConfig([]string{"--dns-cache-max-ttl", "10s"}, withEnv("AETHER_DNS_CACHE_SIZE", "0", "AETHER_DNS_CACHE_MAX_TTL", "1m", "AETHER_DNS_CACHE_MAX_NEGATIVE_TTL", "2s"))
	if err != nil || c.DNSCacheSize != 0 || c.DNSCacheMaxTTL != 10*time.Second || c.DNSCacheMaxNegativeTTL != 2*time.Second {
		t.Errorf("cache size and TTL caps from env: %d, %s, %s, %v; want 0 (env), 10s (flag), 2s (env)", c.DNSCacheSize, c.DNSCacheMaxTTL, c.DNSCacheMaxNegativeTTL, err)
	}
	c, err = ParseConfig(nil, withEnv("AETHER_IMPORT_CONFIG", "true", "AETHER_CONTROL_CLUSTER", "alpha", "AETHER_REGISTRY_SYNC_GRACE", "1m"))
	if err != nil || !c.ImportConfig || c.ControlCluster != "alpha" || c.RegistrySyncGrace != time.Minute {
		t.Errorf("import settings from env: %v, %q, %s, %v; want true, alpha, 1m", c.ImportConfig, c.ControlCluster, c.RegistrySyncGrace, err)
	}
	if _, err := ParseConfig(nil, withEnv("AETHER_CONTROL_CLUSTER", "Alpha")); err == nil || !strings.Contains(err.Error(), `--control-cluster "Alpha"`) {
		t.Errorf("AETHER_CONTROL_CLUSTER=Alpha: err = %v, want the flag and value named", err)
	}
	for _, kv := range [][2]string{{"AETHER_DNS_CACHE_SERVE_STALE", "a day"}, {"AETHER_DNS_CACHE_PREFETCH", "many"}, {"AETHER_DNS_CACHE_SIZE", "big"}, {"AETHER_DNS_CACHE_MAX_TTL", "30"}} {
		if _, err := ParseConfig(nil, withEnv(kv[0], kv[1])); err == nil || !strings.Contains(err.Error(), "env "+kv[0]+` "`+kv[1]+`"`) {
			t.Errorf("%s=%q: err = %v, want it named", kv[0], kv[1], err)
		}
	}
	if _, err := ParseConfig(nil, func(string) string { return "" }); err == nil ||
		!strings.Contains(err.Error(), "--node-name is required") || !strings.Contains(err.Error(), "--cluster is required") {
		t.Errorf("empty config error = %v, want every required flag named", err)
	}
}

// TestDNSForFamilies: IPv6 cluster DNS addresses are DNAT'ed only when the resolver also listens
// on an IPv6 host address; otherwise they are left alone (and reported).
func TestDNSForFamilies(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::a")
	for _, c := range []struct {
		haveIPv6  bool
		use, left []netip.Addr
	}{
		{false, []netip.Addr{v4}, []netip.Addr{v6}},
		{true, []netip.Addr{v4, v6}, nil},
	} {
		use, left := dnsForFamilies([]netip.Addr{v4, v6}, c.haveIPv6)
		if !slices.Equal(use, c.use) || !slices.Equal(left, c.left) {
			t.Errorf("dnsForFamilies(%s %s, IPv6 host %v) = %v, %v; want %v, %v", v4, v6, c.haveIPv6, use, left, c.use, c.left)
		}
	}
}

// TestClusterDomain: the flag wins; else the kubelet's search list in --resolv-conf names the
// domain (what a ClusterFirstWithHostNet agent gets); else cluster.local. An unreadable
// --resolv-conf is an error naming the flag and the file.
func TestClusterDomain(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kubelet := write("kubelet", "nameserver 10.96.0.10\nsearch aether-system.svc.corp.example svc.corp.example corp.example ec2.internal\noptions ndots:5\n")
	node := write("node", "nameserver 10.0.0.2\nsearch ec2.internal\n")
	for _, tc := range []struct {
		name, flag, resolv string
		want, from         string
	}{
		{name: "flag", flag: "Corp.Example.", resolv: node, want: "corp.example", from: "--cluster-domain"},
		{name: "flag over the search list", flag: "other.example", resolv: kubelet, want: "other.example", from: "--cluster-domain"},
		{name: "search list", resolv: kubelet, want: "corp.example", from: "--resolv-conf search list"},
		{name: "node resolv.conf", resolv: node, want: "cluster.local", from: "default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, from, err := clusterDomain(Config{ClusterDomain: tc.flag, ResolvConf: tc.resolv})
			if err != nil || got != tc.want || from != tc.from {
				t.Errorf("clusterDomain = %q, %q, %v; want %q, %q", got, from, err, tc.want, tc.from)
			}
		})
	}
	missing := filepath.Join(dir, "missing")
	if _, _, err := clusterDomain(Config{ResolvConf: missing}); err == nil || !strings.Contains(err.Error(), "--resolv-conf") || !strings.Contains(err.Error(), missing) {
		t.Errorf("unreadable resolv.conf: err = %v, want it to name --resolv-conf and %s", err, missing)
	}
}
