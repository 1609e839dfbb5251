package registrar

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	env := map[string]string{"AETHER_CLUSTER": "east", "POD_NAMESPACE": "mesh-system"}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
		check   func(RunConfig) bool
	}{
		{name: "env defaults: embedded registry", check: func(c RunConfig) bool {
			return c.Cluster == "east" && c.Region == "default" && len(c.Registry.Endpoints()) == 0 && c.RegistryDataDir != "" &&
				c.LeaderElect && c.LeaderElectNamespace == "mesh-system" && c.LeaseDuration == 15*time.Second
		}},
		{name: "external registry", args: []string{"--registry-endpoints", "https://10.0.0.1:2379, https://10.0.0.2:2379", "--registry-data-dir", ""}, check: func(c RunConfig) bool {
			return len(c.Registry.Endpoints()) == 2 && c.Registry.Endpoints()[1] == "https://10.0.0.2:2379"
		}},
		{name: "no data dir without endpoints", args: []string{"--registry-data-dir", ""}, wantErr: "--registry-endpoints (AETHER_REGISTRY_ENDPOINTS) is empty and there is no --registry-data-dir"},
		{name: "bad endpoint", args: []string{"--registry-endpoints", "10.0.0.1:2379"}, wantErr: `--registry-endpoints "10.0.0.1:2379"`},
		{name: "bad cluster", args: []string{"--cluster", "East_1"}, wantErr: `--cluster "East_1"`},
		{name: "bad region", args: []string{"--region", "a.b"}, wantErr: `--region "a.b"`},
		{name: "bad listen", args: []string{"--registry-listen", "unix:///run/etcd.sock"}, wantErr: `--registry-listen "unix:///run/etcd.sock": want an http:// or https:// URL`},
		{name: "https listen without a certificate", args: []string{"--registry-listen", "https://0.0.0.0:2379", "--registry-ca", "/etc/hostname"}, wantErr: "https needs --registry-serve-cert and --registry-serve-key"},
		{name: "https listen without the registrar's CA", args: []string{"--registry-listen", "https://0.0.0.0:2379", "--registry-serve-cert", "/etc/hostname", "--registry-serve-key", "/etc/hostname"}, wantErr: "needs --registry-ca"},
		{name: "client CA without the registrar's certificate", args: []string{"--registry-listen", "https://0.0.0.0:2379", "--registry-serve-cert", "/etc/hostname", "--registry-serve-key", "/etc/hostname",
			"--registry-ca", "/etc/hostname", "--registry-serve-client-ca", "/etc/hostname"}, wantErr: "--registry-serve-client-ca requires client certificates"},
		{name: "https listen", args: []string{"--registry-listen", "https://0.0.0.0:2379", "--registry-serve-cert", "/etc/hostname", "--registry-serve-key", "/etc/hostname",
			"--registry-ca", "/etc/hostname", "--registry-serve-client-ca", "/etc/hostname", "--registry-cert", "/etc/hostname", "--registry-key", "/etc/hostname"},
			check: func(c RunConfig) bool { return c.RegistryServeClientCA == "/etc/hostname" }},
		{name: "serving certificate on http", args: []string{"--registry-serve-cert", "/etc/hostname", "--registry-serve-key", "/etc/hostname"}, wantErr: "need an https:// --registry-listen"},
		{name: "plaintext listen off loopback", args: []string{"--registry-listen", "http://0.0.0.0:2379"}, wantErr: `--registry-listen "http://0.0.0.0:2379": plaintext off loopback`},
		{name: "peer listen off loopback", args: []string{"--registry-peer-listen", "http://0.0.0.0:2380"}, wantErr: `--registry-peer-listen "http://0.0.0.0:2380": the embedded etcd's peer port is plaintext`},
		{name: "plaintext listen off loopback, insecure", args: []string{"--registry-listen", "http://0.0.0.0:2379", "--registry-insecure"}, check: func(c RunConfig) bool { return c.Registry.Insecure }},
		{name: "missing serving certificate", args: []string{"--registry-listen", "https://0.0.0.0:2379", "--registry-serve-cert", "/nonexistent.crt", "--registry-serve-key", "/etc/hostname", "--registry-ca", "/etc/hostname"}, wantErr: `--registry-serve-cert "/nonexistent.crt"`},
		{name: "cert without key", args: []string{"--registry-cert", "/etc/hostname"}, wantErr: "--registry-cert and --registry-key go together"},
		{name: "missing file", args: []string{"--registry-ca", "/nonexistent/ca.pem"}, wantErr: `--registry-ca "/nonexistent/ca.pem"`},
		{name: "lease timings", args: []string{"--leader-elect-renew-deadline", "20s"}, wantErr: "--leader-elect-lease-duration 15s"},
		{name: "no leader election needs no namespace", args: []string{"--leader-elect=false", "--leader-elect-namespace", ""}, check: func(c RunConfig) bool { return !c.LeaderElect }},
		{name: "edge Envoy image, namespace from POD_NAMESPACE", args: []string{"--edge-envoy-image", "registry.example/aether-envoy:1.0"}, check: func(c RunConfig) bool {
			return c.EdgeEnvoyImage == "registry.example/aether-envoy:1.0" && c.Namespace == "mesh-system"
		}},
		{name: "edge Envoy image without a namespace", args: []string{"--edge-envoy-image", "aether-envoy:dev", "--namespace", ""}, wantErr: "--namespace (POD_NAMESPACE) is required with --edge-envoy-image"},
		{name: "edge Envoy image, bad namespace", args: []string{"--edge-envoy-image", "aether-envoy:dev", "--namespace", "Mesh_System"}, wantErr: `--namespace "Mesh_System"`},
		{name: "bad edge Envoy image", args: []string{"--edge-envoy-image", "aether envoy"}, wantErr: `--edge-envoy-image "aether envoy"`},
		{name: "no Gateway address ranges by default", check: func(c RunConfig) bool { return len(c.GatewayAddressCIDRs) == 0 && !c.EdgeCrossNamespaceCertificates }},
		{name: "cross-namespace certificates on", args: []string{"--edge-cross-namespace-certificates"}, check: func(c RunConfig) bool { return c.EdgeCrossNamespaceCertificates }},
		{name: "Gateway address ranges", args: []string{"--gateway-address-cidrs", "192.0.2.7/24, 2001:db8::/64"}, check: func(c RunConfig) bool {
			return len(c.GatewayAddressCIDRs) == 2 && c.GatewayAddressCIDRs[0].String() == "192.0.2.0/24" && c.GatewayAddressCIDRs[1].String() == "2001:db8::/64"
		}},
		{name: "bad Gateway address range", args: []string{"--gateway-address-cidrs", "192.0.2.0/24,10.0.0.1"}, wantErr: `--gateway-address-cidrs "192.0.2.0/24,10.0.0.1": "10.0.0.1": want a CIDR`},
		{name: "no infrastructure keys by default", check: func(c RunConfig) bool { return len(c.GatewayInfrastructureKeys) == 0 && c.EdgeReplicas == 1 }},
		{name: "edge replicas", args: []string{"--edge-replicas", "3"}, check: func(c RunConfig) bool { return c.EdgeReplicas == 3 }},
		{name: "no edge replica", args: []string{"--edge-replicas", "0"}, wantErr: "--edge-replicas 0: want 1 to 100"},
		{name: "infrastructure keys", args: []string{"--gateway-infrastructure-keys", "team, example.com/"}, check: func(c RunConfig) bool {
			return slices.Equal(c.GatewayInfrastructureKeys, []string{"team", "example.com/"})
		}},
		{name: "aether's own infrastructure key", args: []string{"--gateway-infrastructure-keys", "team,aether.io/capture"},
			wantErr: `--gateway-infrastructure-keys "team,aether.io/capture": "aether.io/capture": aether's own keys`},
		{name: "config export defaults: no control cluster, refresh 5m", check: func(c RunConfig) bool {
			return c.ControlCluster == "" && c.ConfigExportRefresh == 5*time.Minute
		}},
		{name: "control cluster", args: []string{"--control-cluster", "hub", "--config-export-refresh", "10s"}, check: func(c RunConfig) bool {
			return c.ControlCluster == "hub" && c.ConfigExportRefresh == 10*time.Second
		}},
		{name: "bad control cluster", args: []string{"--control-cluster", "Hub.One"}, wantErr: `--control-cluster "Hub.One": want a cluster name (an RFC 1123 label) or empty`},
		{name: "config export refresh too short", args: []string{"--config-export-refresh", "9s"}, wantErr: "--config-export-refresh 9s: want at least 10s"},
		{name: "workers", args: []string{"--workers", "0"}, wantErr: "--workers 0"},
		{name: "cluster id timeout", args: []string{"--cluster-id-timeout", "0s"}, wantErr: "--cluster-id-timeout 0s"},
		{name: "bad log level", args: []string{"--log-level", "loud"}, wantErr: `--log-level "loud"`},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseRunConfig(tc.args, getenv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to name %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Errorf("config = %+v", c)
			}
		})
	}
	// The environment sets both config export settings; a bad value names the flag.
	env2 := map[string]string{"AETHER_CLUSTER": "east", "AETHER_CONTROL_CLUSTER": "hub", "AETHER_CONFIG_EXPORT_REFRESH": "1m"}
	if c, err := ParseRunConfig(nil, func(k string) string { return env2[k] }); err != nil || c.ControlCluster != "hub" || c.ConfigExportRefresh != time.Minute {
		t.Errorf("config export from the environment: %+v, %v", c, err)
	}
	env2["AETHER_CONTROL_CLUSTER"] = "-hub"
	if _, err := ParseRunConfig(nil, func(k string) string { return env2[k] }); err == nil || !strings.Contains(err.Error(), `--control-cluster "-hub"`) {
		t.Errorf("bad AETHER_CONTROL_CLUSTER: err = %v", err)
	}
	if _, err := ParseRunConfig(nil, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "--cluster is required") {
		t.Errorf("empty config error = %v, want --cluster named", err)
	}
}
