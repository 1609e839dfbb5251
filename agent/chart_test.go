package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/aethermesh/aether/deploy"
	"github.com/aethermesh/aether/internal/testenv"
)

// chartAgent renders the Helm chart with the real Helm and values in namespace mesh-system, and
// parses the agent DaemonSet's agent container (args, environment from the rendered
// aether-config, the downward API of a dual-stack node) with the agent's own flag parser. It
// returns the rendered objects, the pod spec, the container and the parsed configuration.
func chartAgent(t *testing.T, values string) ([]*unstructured.Unstructured, corev1.PodSpec, corev1.Container, Config) {
	t.Helper()
	tl := testenv.RequireTools(t, testenv.ToolHelm)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	objs, err := deploy.RenderChart(ctx, tl.Helm, "mesh-system", values)
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := deploy.DecodeObject(objs, "ConfigMap", "aether-config", &cm); err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := deploy.DecodeObject(objs, "DaemonSet", "aether-agent", &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	ag, err := deploy.Container(spec, "agent")
	if err != nil {
		t.Fatal(err)
	}
	env, err := deploy.Env(ag, map[string]map[string]string{"aether-config": cm.Data},
		map[string]string{"spec.nodeName": "node-1", "status.hostIP": "10.0.0.1", "status.hostIPs": "10.0.0.1,fd00::1", "metadata.namespace": "aether-system"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseFlags(deploy.Args(ag, env), func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("agent flags: %v", err)
	}
	return objs, spec, ag, cfg
}

// TestChartValuesAgent renders the Helm chart with the real Helm and deploy.OtherValues in
// namespace mesh-system and parses the agent DaemonSet's container (args, environment from the
// rendered aether-config, the downward API of a dual-stack node) with the agent's own flag
// parser: every value must reach the agent's configuration, and the files its configuration
// names that only the cluster supplies must come from the required Secrets of the values (the
// development CA, the registry's TLS client). deploy's TestChartValues checks the rest.
func TestChartValuesAgent(t *testing.T) {
	_, spec, ag, acfg := chartAgent(t, deploy.OtherValues)
	if missing, err := deploy.MissingFiles(acfg.Validate()); err != nil {
		t.Errorf("agent configuration: %v (missing files %v)", err, missing)
	} else {
		for _, p := range missing {
			v, _, _, err := deploy.MountedFrom(spec, ag, p)
			want := map[string]string{"/etc/aether/ca/": "mesh-ca", "/etc/aether/registry/": "etcd-client"}[filepath.Dir(p)+"/"]
			if err != nil || v.Secret == nil || v.Secret.SecretName != want || (v.Secret.Optional != nil && *v.Secret.Optional) {
				t.Errorf("agent reads %s from volume %s, Secret %+v (%v), want the required Secret %q", p, v.Name, v.Secret, err, want)
			}
		}
	}
	wantDNS := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::a")}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"cluster", acfg.Cluster, "east"}, {"region", acfg.Region, "eu-west"}, {"zone", acfg.Zone, "zone-a"},
		{"mesh domain", acfg.MeshDomain, "mesh.example"}, {"trust domain", acfg.TrustDomain, "example.org"},
		{"inbound mode", acfg.InboundMode, "permissive"}, {"east-west waypoint", acfg.EastWestWaypoint, false},
		{"log level", acfg.LogLevel, slog.LevelDebug},
		{"registry endpoints", acfg.Registry.Endpoints(), []string{"https://10.0.0.2:2379", "https://10.0.0.3:2379"}},
		{"registry insecure", acfg.Registry.Insecure, true},
		{"registry TLS", []string{acfg.Registry.CA, acfg.Registry.Cert, acfg.Registry.Key},
			[]string{"/etc/aether/registry/ca.crt", "/etc/aether/registry/tls.crt", "/etc/aether/registry/tls.key"}},
		{"capture backend", acfg.CaptureBackend, "iptables-legacy"}, {"cluster DNS", acfg.ClusterDNS, wantDNS},
		{"cluster domain", acfg.ClusterDomain, "corp.example"}, {"DNS cache size", acfg.DNSCacheSize, 0},
		{"DNS cache max TTL", acfg.DNSCacheMaxTTL, time.Minute}, {"DNS cache max negative TTL", acfg.DNSCacheMaxNegativeTTL, 2 * time.Second},
		{"DNS serve-stale", acfg.DNSCacheServeStale, 24 * time.Hour}, {"DNS prefetch", acfg.DNSCachePrefetch, 3},
		{"DNS rate limit (extraConfig)", acfg.DNSRateLimit, 200},
		{"config import", acfg.ImportConfig, true}, {"control cluster", acfg.ControlCluster, "hub"},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("agent %s: %v, want %v", c.what, c.got, c.want)
		}
	}
}

// TestChartValuesAgentSPIRE renders the chart with deploy.OtherSPIREValues (identity.mode spire)
// and parses the agent DaemonSet's container with the agent's own flag parser: the agent gets
// its pods' SVIDs from SPIRE (--identity-source=spire), holds no CA, and its
// --spire-admin-socket is the admin_socket_path of the SPIRE agents' configuration, on the same
// node directory as the SPIRE agent DaemonSet mounts it (read-only here: connecting needs no
// write).
func TestChartValuesAgentSPIRE(t *testing.T) {
	objs, spec, ag, cfg := chartAgent(t, deploy.OtherSPIREValues)
	var spireAgentConf corev1.ConfigMap
	var spireAgents appsv1.DaemonSet
	if err := deploy.DecodeObject(objs, "ConfigMap", "spire-agent", &spireAgentConf); err != nil {
		t.Fatal(err)
	}
	if err := deploy.DecodeObject(objs, "DaemonSet", "spire-agent", &spireAgents); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("agent configuration: %v", err)
	}
	var conf struct {
		Agent struct {
			AdminSocketPath string `json:"admin_socket_path"`
		} `json:"agent"`
	}
	if err := json.Unmarshal([]byte(spireAgentConf.Data["agent.conf"]), &conf); err != nil {
		t.Fatal(err)
	}
	if cfg.IdentitySource != IdentitySPIRE || cfg.CACert != "" || cfg.SPIREAdminSocket != conf.Agent.AdminSocketPath || cfg.TrustDomain != "example.org" {
		t.Errorf("agent identity: source %q, CA %q, admin socket %q, trust domain %q; want spire, none, the SPIRE agents' %q, example.org",
			cfg.IdentitySource, cfg.CACert, cfg.SPIREAdminSocket, cfg.TrustDomain, conf.Agent.AdminSocketPath)
	}
	sa, err := deploy.Container(spireAgents.Spec.Template.Spec, "spire-agent")
	if err != nil {
		t.Fatal(err)
	}
	va, ma, rela, err1 := deploy.MountedFrom(spec, ag, cfg.SPIREAdminSocket)
	vs, ms, rels, err2 := deploy.MountedFrom(spireAgents.Spec.Template.Spec, sa, conf.Agent.AdminSocketPath)
	if err1 != nil || err2 != nil || va.HostPath == nil || vs.HostPath == nil ||
		filepath.Join(va.HostPath.Path, rela) != filepath.Join(vs.HostPath.Path, rels) || !ma.ReadOnly || ms.ReadOnly {
		t.Errorf("admin socket %s: the aether agent's volume %+v (mount %+v, %v), the SPIRE agent's %+v (mount %+v, %v); want one node path, read-only for the aether agent",
			cfg.SPIREAdminSocket, va.VolumeSource, ma, err1, vs.VolumeSource, ms, err2)
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "aether-ca" {
			t.Errorf("agent pod mounts the development CA's Secret in spire mode (volume %s)", v.Name)
		}
	}
}
