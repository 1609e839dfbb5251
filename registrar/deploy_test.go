package registrar

import (
	"maps"
	"net"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/aethermesh/aether/deploy"
)

// TestDeployRegistrarArgs parses deploy/registrar/deployment.yaml's container (args, env, envFrom
// the shipped aether-config) with the registrar's own parser, so a renamed flag or environment
// variable fails: unconfigured it must refuse to start naming --cluster, and without registry
// endpoints naming them (no embedded etcd in the Deployment); configured it must
// accept everything but files that only the cluster supplies, and those must come from the
// registry-client Secret; the probes must hit its health address; the leader election Lease
// must be in the namespace the Role covers.
func TestDeployRegistrarArgs(t *testing.T) {
	var dep appsv1.Deployment
	if err := deploy.Decode("registrar/deployment.yaml", "Deployment", &dep); err != nil {
		t.Fatal(err)
	}
	spec := dep.Spec.Template.Spec
	c, err := deploy.Container(spec, "registrar")
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := deploy.ConfigData()
	if err != nil {
		t.Fatal(err)
	}
	parse := func(data map[string]string) (RunConfig, error) {
		t.Helper()
		env, err := deploy.Env(c, map[string]map[string]string{"aether-config": data}, map[string]string{"metadata.namespace": "aether-system"})
		if err != nil {
			t.Fatal(err)
		}
		return ParseRunConfig(deploy.Args(c, env), func(k string) string { return env[k] })
	}
	if _, err := parse(shipped); err == nil || !strings.Contains(err.Error(), "--cluster is required") {
		t.Errorf("unconfigured deploy/config.yaml: %v, want --cluster is required", err)
	}

	data := maps.Clone(shipped)
	data["AETHER_CLUSTER"] = "east"
	// The Deployment runs no embedded etcd: without endpoints it refuses to start naming them.
	if _, err := parse(data); err == nil || !strings.Contains(err.Error(), "--registry-endpoints (AETHER_REGISTRY_ENDPOINTS) is empty") {
		t.Errorf("registrar without AETHER_REGISTRY_ENDPOINTS: %v, want an error naming it", err)
	}
	data["AETHER_REGISTRY_ENDPOINTS"] = "https://10.0.0.2:2379"
	cfg, err := parse(data)
	if err != nil {
		t.Fatalf("configured registrar: %v", err)
	}
	if cfg.Cluster != "east" || len(cfg.Registry.Endpoints()) != 1 || cfg.LeaderElectNamespace != "aether-system" {
		t.Errorf("cluster %q, endpoints %v, lease namespace %q: want east, the ConfigMap's endpoint, aether-system", cfg.Cluster, cfg.Registry.Endpoints(), cfg.LeaderElectNamespace)
	}

	// TLS to the registry, as config.yaml's comment shows it.
	data["AETHER_REGISTRY_CA"] = "/etc/aether/registry/ca.crt"
	data["AETHER_REGISTRY_CERT"] = "/etc/aether/registry/tls.crt"
	data["AETHER_REGISTRY_KEY"] = "/etc/aether/registry/tls.key"
	_, err = parse(data)
	missing, err := deploy.MissingFiles(err)
	if err != nil || len(missing) != 3 {
		t.Fatalf("registrar with registry TLS: missing %v, other errors %v; want only the 3 TLS files missing", missing, err)
	}
	for _, p := range missing {
		v, _, _, err := deploy.MountedFrom(spec, c, p)
		if err != nil || v.Secret == nil || v.Secret.SecretName != "aether-registry-client" {
			t.Errorf("registrar reads %s, which the Secret aether-registry-client does not supply (%v)", p, err)
		}
	}

	_, healthPort, err := net.SplitHostPort(cfg.HealthAddr)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("registrar: probe %+v, want HTTP probes", p)
		}
		port := p.HTTPGet.Port
		if port.Type == intstr.String {
			for _, cp := range c.Ports {
				if cp.Name == port.StrVal {
					port = intstr.FromInt32(cp.ContainerPort)
				}
			}
		}
		if port.String() != healthPort {
			t.Errorf("probe %s on port %s, want --health-addr's %s", p.HTTPGet.Path, p.HTTPGet.Port.String(), healthPort)
		}
	}
	var roleNS string
	objs, err := deploy.Objects("registrar/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "Role" {
			roleNS = o.GetNamespace()
		}
	}
	if roleNS != cfg.LeaderElectNamespace {
		t.Errorf("leader election Lease in %q, the Role grants leases in %q", cfg.LeaderElectNamespace, roleNS)
	}
}
