package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registry"
)

// TestAgentConfigImport runs the real agent binary with --import-config and --control-cluster
// gamma against a real kube-apiserver and etcd registry, with its real Envoy: clusters beta and
// gamma both project routes for the imported service shop/pay; gamma's apply, beta's (an older
// export) are ignored as not the control cluster's, counted and logged once; the metrics say
// what is applied. The projections and the registry view are persisted; an agent restarted
// while the registry is cut off serves them after --registry-sync-grace (readiness "registry"
// degraded, naming the file; its new model keeps the projection and pushes the persisted
// endpoint to Envoy), then follows the registry again once it is back: a deleted projection
// goes.
func TestAgentConfigImport(t *testing.T) {
	api, etcd, cs := startSources(t)
	regProxy := testenv.NewCutProxy(t, strings.TrimPrefix(etcd.Endpoints[0], "http://"))
	mcs := mcsclient.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs)
	if _, err := mcs.MulticlusterV1beta1().ServiceImports("shop").Create(ctx, &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Name: "pay"},
		Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.96.77.7"},
			Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now().Add(-time.Hour)
	peers := map[string]*registry.Registry{}
	for _, cluster := range []string{"beta", "gamma"} {
		r, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: cluster, LeaseTTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		peers[cluster] = r
		// beta's export is the older: without a control cluster its projection would apply.
		exportCreated := created
		if cluster == "gamma" {
			exportCreated = created.Add(time.Minute)
		}
		if err := r.Export(ctx, &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: "shop", Name: "pay"},
			Ports:      []*registryv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
			CreateTime: exportCreated.UTC().Format(time.RFC3339Nano)}); err != nil {
			t.Fatal(err)
		}
		if err := r.PutConfig(ctx, testProjection("shop", "pay", 2, cluster, exportCreated)); err != nil {
			t.Fatal(err)
		}
	}
	if err := peers["gamma"].RegisterEndpoint(ctx, &registryv1.ServiceEndpoint{
		Service: &registryv1.ServiceRef{Namespace: "shop", Name: "pay"}, Addresses: []string{"10.245.9.9"},
		Ports:    []*registryv1.EndpointPort{{Name: "http", Port: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		SpiffeId: "spiffe://aether.internal/ns/shop/sa/pay", Health: registryv1.Health_HEALTH_HEALTHY,
		Kubernetes: &registryv1.KubernetesMetadata{NodeName: "gamma-node-1", PodName: "pay-1", PodUid: "pay-uid-1", NodeIp: "172.30.3.11"},
	}); err != nil {
		t.Fatal(err)
	}

	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", regProxy.URL(),
		"--import-config", "--control-cluster", "gamma", "--registry-sync-grace", "2s")
	a.waitReady(t, 60*time.Second, "agent ready")
	// Envoy serves route tables only to the node's pods (TestPrivilegedConfigImportTraffic
	// sends traffic through them): here the model's import shows in the metrics, and the
	// registry view in Envoy's clusters.
	testenv.Eventually(t, 30*time.Second, "gamma's projection applied", func() error {
		if got := a.metric(`aether_config_import_version{namespace="shop",origin="gamma",service="pay"}`); got != 2 {
			return fmt.Errorf("gamma's applied version %v, want 2", got)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "pay's clusterset endpoint in Envoy", a.envoyHas("/clusters", "pay.shop.mesh:80::10.245.9.9:15008::", true))
	// -1: no such series (nothing was counted with that label; metric matches labels as
	// /metrics writes them, sorted).
	for name, want := range map[string]float64{
		"aether_config_import_services":                                               1,
		`aether_config_import_version{namespace="shop",origin="gamma",service="pay"}`: 2,
		`aether_config_ignored_projections_total{reason="not_control"}`:               1,
		`aether_config_import_version{namespace="shop",origin="beta",service="pay"}`:  -1,
		`aether_config_ignored_projections_total{reason="shadowed"}`:                  -1,
		`aether_config_import_errors_total{reason="invalid"}`:                         -1,
		`aether_config_import_errors_total{reason="state_write"}`:                     -1,
		`aether_config_import_errors_total{reason="state_read"}`:                      -1,
	} {
		if got := a.metric(name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := a.metric(`aether_agent_source_events_total{source="config"}`); got < 1 {
		t.Errorf(`aether_agent_source_events_total{source="config"} = %v, want at least 1`, got)
	}
	if age := a.metric("aether_config_import_age_max_seconds"); age <= 0 || age > 300 {
		t.Errorf("aether_config_import_age_max_seconds = %v, want the seconds since the projection was written", age)
	}
	// The projections and the registry view are persisted in --state-dir, 0600.
	for _, name := range []string{configStateFile, viewStateFile} {
		p := filepath.Join(a.stateDir, stateSubdir, name)
		testenv.Eventually(t, 30*time.Second, name+" persisted", func() error {
			fi, err := os.Stat(p)
			if err != nil {
				return err
			}
			if fi.Mode().Perm() != 0o600 {
				return fmt.Errorf("%s: mode %v, want 0600", p, fi.Mode().Perm())
			}
			return nil
		})
	}
	// The view file holds pay's endpoint (written within viewPersistInterval of the change).
	testenv.Eventually(t, 30*time.Second, "the view file holds pay's endpoint", func() error {
		st, err := newStateFile(a.stateDir, viewStateFile, "registry-view", "a").load()
		if err != nil {
			return err
		}
		for _, r := range st.Records {
			if strings.Contains(r.Key, "/endpoints/shop/pay/pay-uid-1") {
				return nil
			}
		}
		return fmt.Errorf("%d records, none of pay's endpoint", len(st.Records))
	})

	// Restarted while the registry is cut off: after the grace it serves the persisted state
	// (a new model, with gamma's projection applied and pay's endpoint pushed to Envoy),
	// degraded.
	regProxy.Cut()
	restarted := time.Now()
	a.killAndRestart(t)
	a.waitDegraded(t, "last-known registry state from "+filepath.Join(a.stateDir, stateSubdir, viewStateFile))
	testenv.Eventually(t, 60*time.Second, "a model pushed by the restarted agent", func() error {
		if got := a.metric("aether_agent_last_push_timestamp_seconds"); got < float64(restarted.Unix()) {
			return fmt.Errorf("last push at %v, before the restart at %d", got, restarted.Unix())
		}
		return nil
	})
	if got := a.metric(`aether_config_import_version{namespace="shop",origin="gamma",service="pay"}`); got != 2 {
		t.Errorf("after the restart during the cut: gamma's applied version %v, want 2 (persisted)", got)
	}
	if body := a.envoy("/clusters"); !strings.Contains(body, "pay.shop.mesh:80::10.245.9.9:15008::") {
		t.Errorf("after the restart during the cut: Envoy lost pay's persisted endpoint")
	}
	logged := string(mustReadFile(t, a.logPath))
	for _, want := range []string{"serving 2 last-known config projections from " + filepath.Join(a.stateDir, stateSubdir, configStateFile),
		"serving the last-known registry state from " + filepath.Join(a.stateDir, stateSubdir, viewStateFile) + " written at "} {
		if !strings.Contains(logged, want) {
			t.Errorf("the restarted agent's log does not say %q", want)
		}
	}
	regProxy.Restore()
	a.waitReady(t, 60*time.Second, "ready once the registry is back")
	if n := strings.Count(string(mustReadFile(t, a.logPath)), "config projection ignored: its origin is not the control cluster"); n != 2 {
		t.Errorf("beta's projection logged as not the control cluster's %d times over two agent runs, want once each", n)
	}

	// gamma deletes its projection: nothing is applied any more.
	if err := peers["gamma"].DeleteConfig(ctx, "shop", "pay"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "gamma's projection gone", func() error {
		if got := a.metric("aether_config_import_services"); got != 0 {
			return fmt.Errorf("aether_config_import_services = %v, want 0", got)
		}
		return nil
	})
}

// TestAgentSyncGraceWithoutUsableState: an agent that starts with the registry unreachable and
// no usable persisted view (a corrupt file: logged, ignored) waits for the registry past
// --registry-sync-grace, as without a file: no model, readiness "registry" not ready.
func TestAgentSyncGraceWithoutUsableState(t *testing.T) {
	api, _, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs)
	state := t.TempDir()
	if err := os.MkdirAll(filepath.Join(state, stateSubdir), 0o700); err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(state, stateSubdir, viewStateFile)
	if err := os.WriteFile(corrupt, []byte(`{"format":1,"kind":"registry-vi`), 0o600); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", dead, "--state-dir", state,
		"--registry-sync-grace", "1s", "--import-config")
	testenv.Eventually(t, 60*time.Second, "the corrupt file logged", func() error {
		if b, _ := os.ReadFile(a.logPath); !strings.Contains(string(b), "persisted registry view ignored") || !strings.Contains(string(b), corrupt) {
			return fmt.Errorf("no log line naming %s", corrupt)
		}
		return nil
	})
	time.Sleep(3 * time.Second) // well past the grace
	if code, body := a.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "registry") {
		t.Errorf("/readyz %d %q, want 503 naming the registry", code, body)
	}
	if v := a.metric("aether_agent_model_rebuilds_total"); v != 0 {
		t.Errorf("aether_agent_model_rebuilds_total = %v without a registry or a usable persisted view, want 0 (waiting)", v)
	}
	if b, _ := os.ReadFile(a.logPath); strings.Contains(string(b), "serving the last-known registry state") {
		t.Errorf("the agent says it serves a last-known registry state it could not read")
	}
}
