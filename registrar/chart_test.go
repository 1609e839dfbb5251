package registrar

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/aethermesh/aether/deploy"
	"github.com/aethermesh/aether/internal/testenv"
)

// TestChartValuesRegistrar renders the Helm chart with the real Helm and deploy.OtherValues in
// namespace mesh-system and parses the registrar Deployment's container (args, environment from
// the rendered aether-config, the downward API) with the registrar's own parser: the password
// must come from the values' Secret (checked here, as deploy.Env computes no Secret
// references), every other value must reach the registrar's configuration (the edge Gateways'
// Envoy image is the agent DaemonSet's), and only the 3
// registry TLS files may be missing, mounted from the required Secret of the values. deploy's
// TestChartValues checks the rest.
func TestChartValuesRegistrar(t *testing.T) {
	const ns = "mesh-system"
	tl := testenv.RequireTools(t, testenv.ToolHelm)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	objs, err := deploy.RenderChart(ctx, tl.Helm, ns, deploy.OtherValues)
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := deploy.DecodeObject(objs, "ConfigMap", "aether-config", &cm); err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	if err := deploy.DecodeObject(objs, "Deployment", "aether-registrar", &dep); err != nil {
		t.Fatal(err)
	}
	rspec := dep.Spec.Template.Spec
	rc, err := deploy.Container(rspec, "registrar")
	if err != nil {
		t.Fatal(err)
	}
	var password *corev1.EnvVar
	rc.Env = slices.DeleteFunc(slices.Clone(rc.Env), func(e corev1.EnvVar) bool {
		if e.Name == "AETHER_REGISTRY_PASSWORD" {
			password = &e
			return true
		}
		return false
	})
	if password == nil || password.ValueFrom == nil || password.ValueFrom.SecretKeyRef == nil ||
		password.ValueFrom.SecretKeyRef.Name != "etcd-password" || password.ValueFrom.SecretKeyRef.Key != "pw" {
		t.Errorf("registrar AETHER_REGISTRY_PASSWORD %+v, want from Secret etcd-password key pw", password)
	}
	renv, err := deploy.Env(rc, map[string]map[string]string{"aether-config": cm.Data}, map[string]string{"metadata.namespace": ns})
	if err != nil {
		t.Fatal(err)
	}
	rcfg, err := ParseRunConfig(deploy.Args(rc, renv), func(k string) string { return renv[k] })
	missing, err := deploy.MissingFiles(err)
	if err != nil || len(missing) != 3 {
		t.Errorf("registrar configuration: %v, missing files %v; want only the 3 registry TLS files missing", err, missing)
	}
	for _, p := range missing {
		if v, _, _, err := deploy.MountedFrom(rspec, rc, p); err != nil || v.Secret == nil || v.Secret.SecretName != "etcd-client" || (v.Secret.Optional != nil && *v.Secret.Optional) {
			t.Errorf("registrar reads %s from volume %s, Secret %+v (%v), want the required Secret etcd-client", p, v.Name, v.Secret, err)
		}
	}
	// The edge Gateways' Envoy is the agent DaemonSet's Envoy image, and the certificate copies
	// live in the release namespace.
	var ds appsv1.DaemonSet
	if err := deploy.DecodeObject(objs, "DaemonSet", "aether-agent", &ds); err != nil {
		t.Fatal(err)
	}
	ec, err := deploy.Container(ds.Spec.Template.Spec, "envoy")
	if err != nil {
		t.Fatal(err)
	}
	if rcfg.EdgeEnvoyImage == "" || rcfg.EdgeEnvoyImage != ec.Image || rcfg.Namespace != ns {
		t.Errorf("registrar --edge-envoy-image %q, --namespace %q; want the agent's Envoy image %q and %q", rcfg.EdgeEnvoyImage, rcfg.Namespace, ec.Image, ns)
	}
	if rcfg.Cluster != "east" || rcfg.Region != "eu-west" || rcfg.RegistryUser != "aether.eu-west.east" || rcfg.LeaderElectNamespace != ns ||
		!slices.Equal(rcfg.Registry.Endpoints(), []string{"https://10.0.0.2:2379", "https://10.0.0.3:2379"}) || rcfg.LogLevel != slog.LevelDebug {
		t.Errorf("registrar: cluster %q, region %q, user %q, lease namespace %q, endpoints %v, log level %v; want the values'",
			rcfg.Cluster, rcfg.Region, rcfg.RegistryUser, rcfg.LeaderElectNamespace, rcfg.Registry.Endpoints(), rcfg.LogLevel)
	}
}
