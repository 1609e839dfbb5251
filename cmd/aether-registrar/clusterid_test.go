package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registry"
)

// TestBinaryEmbeddedRegistryWaitsOutForbiddenClusterID: in the single-machine shape the
// registrar's credentials may not read Namespace kube-system yet (a real kube-apiserver with RBAC
// answers 403: its ClusterRole not bound yet). The registrar keeps the embedded registry serving
// and keeps trying, logging the refusal; once the permission is granted it reads its cluster ID
// and becomes ready, the same process. Before, a 403 (or 401) ended clusterid.Get at once and the
// registrar exited, taking every cluster's registry down, although it waits as long as it takes
// for an API server that does not answer.
func TestBinaryEmbeddedRegistryWaitsOutForbiddenClusterID(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	kubeClient(t, api) // namespaces aether-system and apps
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(api.Config)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "aether-system", Name: "host-registrar"}}
	if _, err := cs.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, api.Config.Host, tok.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
	host := startProc(t, "--cluster", "solo", "--kubeconfig", kubeconfig, "--leader-elect=false",
		"--registry-data-dir", filepath.Join(dir, "registry"), "--registry-listen", listen,
		"--registry-peer-listen", fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)))
	cli := etcdClient(t, listen)
	registryAnswers := hostServes(ctx, host, cli)
	testenv.Eventually(t, 60*time.Second, "embedded registry answers", registryAnswers)
	testenv.Eventually(t, 60*time.Second, "the refusal logged", func() error {
		b, err := os.ReadFile(host.log)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "forbidden") {
			return fmt.Errorf("no 403 in the registrar's log yet")
		}
		return nil
	})
	if err := registryAnswers(); err != nil {
		t.Fatalf("after a 403 for the cluster ID: %v", err)
	}

	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "host-registrar"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: sa.Namespace, Name: sa.Name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "registrar ready once it may read its cluster ID", func() error {
		if err := registryAnswers(); err != nil {
			return err
		}
		return host.ready()
	})
}

// TestBinaryEmbeddedRegistryOutlivesAPIServerOutage: in the single-machine shape (default
// flags, so leader election as a Deployment would have it) this cluster's API server stops
// after the registrar is ready. A registrar of another cluster name using that registry as an
// external one, with the same lease timings, loses its leader lease and exits (its Deployment
// would restart it). The host registrar does not: its registry goes on serving and, once the API
// server is back, it is ready again, the same process. Before, the host registrar lost its lease
// too and exited, taking every cluster's registry down.
func TestBinaryEmbeddedRegistryOutlivesAPIServerOutage(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	kubeClient(t, api) // namespaces aether-system and apps
	dir := t.TempDir()
	lease := []string{"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "1s"}
	listen := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
	host := startProc(t, append([]string{"--cluster", "solo", "--kubeconfig", api.Kubeconfig,
		"--registry-data-dir", filepath.Join(dir, "registry"), "--registry-listen", listen,
		"--registry-peer-listen", fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))}, lease...)...)
	testenv.Eventually(t, 90*time.Second, "host registrar ready", host.ready)
	other := startProc(t, append([]string{"--cluster", "other", "--kubeconfig", api.Kubeconfig, "--registry-endpoints", listen,
		"--leader-elect-id", "other-registrar"}, lease...)...)
	testenv.Eventually(t, 90*time.Second, "other registrar ready", other.ready)
	pid := host.cmd.Process.Pid

	api.StopAPIServer()
	select {
	case err := <-other.done:
		other.done <- err
	case <-time.After(2 * time.Minute):
		t.Fatal("the external-registry registrar did not give up its leadership 2 minutes into the API server outage")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := api.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	cli := etcdClient(t, listen)
	testenv.Eventually(t, 90*time.Second, "host registrar serving and ready after the outage", func() error {
		if err := hostServes(ctx, host, cli)(); err != nil {
			return err
		}
		return host.ready()
	})
	if host.cmd.Process.Pid != pid {
		t.Fatal("host registrar was restarted")
	}
}

// TestBinaryEmbeddedRegistryWaitsForCRDs: in the single-machine shape one cluster's API server
// lacks the MCS CRDs (installed late). A registrar of another cluster name using that registry
// as an external one gives up when its controllers' caches do not sync within
// controller-runtime's CacheSyncTimeout (2 minutes) and exits (its Deployment would restart it).
// The host registrar does not: its registry goes on serving, /readyz fails naming the caches,
// and once the CRDs are installed it exports, the same process. Before, the host registrar
// exited on the same timeout, taking every cluster's registry down.
func TestBinaryEmbeddedRegistryWaitsForCRDs(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	c := kubeClient(t, api) // namespaces aether-system and apps
	dir := t.TempDir()
	listen := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
	host := startProc(t, "--cluster", "solo", "--kubeconfig", api.Kubeconfig,
		"--registry-data-dir", filepath.Join(dir, "registry"), "--registry-listen", listen,
		"--registry-peer-listen", fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)))
	cli := etcdClient(t, listen)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	alive := hostServes(ctx, host, cli)
	testenv.Eventually(t, 60*time.Second, "embedded registry answers", alive)
	other := startProc(t, "--cluster", "other", "--kubeconfig", api.Kubeconfig, "--registry-endpoints", listen, "--leader-elect=false")
	select {
	case err := <-other.done:
		other.done <- err
	case <-time.After(4 * time.Minute):
		t.Fatal("the external-registry registrar still runs 4 minutes without its CRDs")
	}
	if err := alive(); err != nil {
		t.Fatalf("after the other registrar's cache sync timeout: %v", err)
	}
	code, body, err := host.readyz()
	if err != nil || code == http.StatusOK || !strings.Contains(body, "[-]caches failed") {
		t.Fatalf("host /readyz without the CRDs: %d, %v:\n%s", code, err, body)
	}

	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	if err := exportService(ctx, c, "apps", "web"); err != nil {
		t.Fatal(err)
	}
	solo := registry.Origin{Region: "default", Cluster: "solo"}
	testenv.Eventually(t, 2*time.Minute, "host registrar ready and exporting once the CRDs exist", func() error {
		if err := alive(); err != nil {
			return err
		}
		if err := host.ready(); err != nil {
			return err
		}
		resp, err := cli.Get(ctx, solo.ExportKey("apps", "web"))
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 {
			return fmt.Errorf("no export mark %s", solo.ExportKey("apps", "web"))
		}
		return nil
	})
}

// hostServes returns a check that the host registrar p still runs and its embedded registry
// (cli) answers a read.
func hostServes(ctx context.Context, p *proc, cli *clientv3.Client) func() error {
	return func() error {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("host registrar exited: %v", err)
		default:
		}
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		defer rcancel()
		_, err := cli.Get(rctx, "/aether/v1/regions/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err
	}
}
