package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
)

// partitionKeys returns every key of a partition with its mod revision.
func partitionKeys(t testing.TB, cli *clientv3.Client, o registry.Origin) map[string]int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), o.Prefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.ModRevision
	}
	return out
}

// kubeSystemUID returns the UID of a cluster's kube-system Namespace.
func kubeSystemUID(t testing.TB, c client.Client) string {
	t.Helper()
	var ns corev1.Namespace
	if err := c.Get(context.Background(), client.ObjectKey{Name: "kube-system"}, &ns); err != nil {
		t.Fatal(err)
	}
	return string(ns.UID)
}

// runReclaim runs `aether-registrar reclaim-partition args...` and returns its output and exit
// code.
func runReclaim(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return runSubcommand(t, registrar.ReclaimCommand, nil, args...)
}

// waitExit waits for the process to exit by itself and returns its exit code and log.
func (p *proc) waitExit(t testing.TB, within time.Duration) (int, string) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		b, _ := os.ReadFile(p.log)
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), string(b)
		}
		return 0, string(b)
	case <-time.After(within):
		t.Fatalf("registrar still running after %s", within)
		return 0, ""
	}
}

// TestBinaryPartitionClaim: two real clusters (kube-apiservers) whose registrars are given one
// cluster name and share one etcd. The first claims the partition with its kube-system UID and
// exports; the second exits with status 1 and an error naming the cluster name, both cluster IDs
// and both fixes, and nothing in the partition changes (although its own cluster has another
// ServiceExport and none of the first's). The first restarting keeps its claim and keeps
// exporting. After the first cluster is gone, reclaim-partition with its ID hands the partition
// to the second (idempotent, a wrong ID refused, bad input named); the second's registrar then
// owns the partition, and the first's registrar is refused in turn.
func TestBinaryPartitionClaim(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	apiA := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	apiB := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, apiA.Config, "deploy/crds")
	testenv.InstallCRDs(t, apiB.Config, "deploy/crds")
	ca, cb := kubeClient(t, apiA), kubeClient(t, apiB)
	idA, idB := kubeSystemUID(t, ca), kubeSystemUID(t, cb)
	if idA == idB {
		t.Fatalf("two API servers share the kube-system UID %s", idA)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	east := registry.Origin{Region: "eu", Cluster: "east"}
	// The flags the registrar and reclaim-partition share.
	target := func(api *testenv.KubeAPIServer) []string {
		return []string{"--cluster", "east", "--region", "eu", "--kubeconfig", api.Kubeconfig,
			"--registry-endpoints", etcd.Endpoints[0], "--registry-data-dir", ""}
	}
	args := func(api *testenv.KubeAPIServer) []string {
		return append(target(api), "--registry-probe-interval", "500ms")
	}
	hasMark := func(svc string, want bool) func() error { return markPresent(ctx, cli, east, "apps", svc, want) }
	claimOf := func() (string, error) {
		resp, err := cli.Get(ctx, east.ClaimKey())
		if err != nil || len(resp.Kvs) == 0 {
			return "", fmt.Errorf("no claim: %v", err)
		}
		return string(resp.Kvs[0].Value), nil
	}

	pA := startProc(t, args(apiA)...)
	testenv.Eventually(t, 60*time.Second, "registrar A ready", pA.ready)
	if err := exportService(ctx, ca, "apps", "web"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "A's export mark", hasMark("web", true))
	// A's config exporter projects web's config after the mark: wait for it, so that the
	// partition is in A's steady state before B starts.
	testenv.Eventually(t, 60*time.Second, "A's config projection", func() error {
		resp, err := cli.Get(ctx, east.ConfigKey("apps", "web"))
		if err != nil || len(resp.Kvs) == 0 {
			return fmt.Errorf("no config projection of apps/web: %v", err)
		}
		return nil
	})
	claimA, err := claimOf()
	if err != nil || !strings.Contains(claimA, idA) {
		t.Fatalf("claim %q, %v; want A's cluster ID %s", claimA, err, idA)
	}
	before := partitionKeys(t, cli, east)

	// B: another cluster, the same cluster name, an export of its own (and none of A's, which
	// its export controller would otherwise delete as stale).
	if err := exportService(ctx, cb, "apps", "api"); err != nil {
		t.Fatal(err)
	}
	pB := startProc(t, args(apiB)...)
	code, log := pB.waitExit(t, 90*time.Second)
	if code != 1 {
		t.Fatalf("registrar B exit status %d, want 1; log:\n%s", code, log)
	}
	if i := strings.LastIndex(log, "aether-registrar: "); i >= 0 {
		t.Logf("registrar B's error:\n%s", log[i:])
	}
	for _, want := range []string{`cluster name \"east\"`, idA, idB, "--cluster (AETHER_CLUSTER", registrar.ReclaimCommand + " --cluster east --region eu --previous-cluster-id " + idA} {
		if !strings.Contains(log, want) && !strings.Contains(strings.ReplaceAll(log, `\"`, `"`), strings.ReplaceAll(want, `\"`, `"`)) {
			t.Errorf("registrar B's output lacks %q:\n%s", want, log)
		}
	}
	if after := partitionKeys(t, cli, east); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the refused registrar changed the partition:\nbefore %v\nafter  %v", before, after)
	}
	if err := pA.ready(); err != nil {
		t.Errorf("registrar A after B was refused: %v", err)
	}

	// A restarts: same claim, still exporting.
	if err := pA.stop(); err != nil {
		t.Fatal(err)
	}
	pA = startProc(t, args(apiA)...)
	testenv.Eventually(t, 60*time.Second, "restarted registrar A ready", pA.ready)
	if err := exportService(ctx, ca, "apps", "web2"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "restarted A's new export mark", hasMark("web2", true))
	if c, err := claimOf(); err != nil || c != claimA {
		t.Fatalf("claim after A's restart %q, %v; want it unchanged", c, err)
	}
	if err := pA.stop(); err != nil {
		t.Fatal(err)
	}

	// Cluster A is gone; B replaces it. Bad input and a wrong previous ID change nothing.
	before = partitionKeys(t, cli, east)
	base := target(apiB)
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--previous-cluster-id is required"},
		{[]string{"--previous-cluster-id", "a b"}, `--previous-cluster-id: invalid value "a b"`},
		{[]string{"--previous-cluster-id", idA, "--cluster", "East"}, `--cluster "East"`},
	} {
		if out, code := runReclaim(t, append(append([]string{}, base...), c.args...)...); code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("reclaim %v: exit %d, output %q; want exit 2 naming %s", c.args, code, out, c.want)
		}
	}
	if out, code := runReclaim(t, append(base, "--previous-cluster-id", "not-"+idA)...); code != 1 || !strings.Contains(out, idA) || !strings.Contains(out, "not-"+idA) {
		t.Errorf("reclaim with a wrong previous ID: exit %d, output %q; want exit 1 naming both IDs", code, out)
	}
	if after := partitionKeys(t, cli, east); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("refused re-claims changed the partition:\nbefore %v\nafter  %v", before, after)
	}
	out, code := runReclaim(t, append(base, "--previous-cluster-id", idA)...)
	if code != 0 || !strings.Contains(out, "claimed by this cluster (cluster ID "+idB+"), replacing cluster ID "+idA) {
		t.Fatalf("reclaim: exit %d, output:\n%s", code, out)
	}
	out, code = runReclaim(t, append(base, "--previous-cluster-id", idA)...)
	if code != 0 || !strings.Contains(out, "already claimed by this cluster (cluster ID "+idB+")") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("second reclaim: exit %d, output:\n%s", code, out)
	}

	// B's registrar now owns the partition: its export appears, A's stale marks go.
	pB = startProc(t, args(apiB)...)
	testenv.Eventually(t, 60*time.Second, "registrar B ready", pB.ready)
	testenv.Eventually(t, 60*time.Second, "B's export mark", hasMark("api", true))
	testenv.Eventually(t, 60*time.Second, "A's stale mark removed by B", hasMark("web", false))
	// A's registrar (the old cluster coming back by mistake) is refused now.
	pA = startProc(t, args(apiA)...)
	if code, log := pA.waitExit(t, 90*time.Second); code != 1 || !strings.Contains(log, idB) {
		t.Fatalf("registrar A after the re-claim: exit %d, want 1 naming B's ID; log:\n%s", code, log)
	}
}

// readyz returns the registrar's verbose /readyz answer: its status code and body (one line per
// check, "[-]<check> failed" for a failing one).
func (p *proc) readyz() (int, string, error) {
	resp, err := http.Get("http://" + p.health + "/readyz?verbose")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestBinaryEmbeddedClaimConflictKeepsRegistry: in the single-machine shape the registrar hosts
// the clusterset's registry. When its own partition turns out to be claimed by another cluster
// (here cluster B re-claims cluster name "east" through the embedded registry while A's
// registrar runs), A's registrar does not exit: the embedded etcd keeps serving, so a writer of
// another partition (cluster west) and B's writer of the partition it now holds read and write;
// A's export controller writes nothing (a ServiceExport created meanwhile gets no mark);
// /readyz fails naming check partition-claim; the log names both cluster IDs and the re-claim
// command that reaches the running registry. Re-claimed for A with that command, the same
// process (no restart) is ready again and exports what was created meanwhile.
func TestBinaryEmbeddedClaimConflictKeepsRegistry(t *testing.T) {
	apiA := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	apiB := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, apiA.Config, "deploy/crds")
	ca := kubeClient(t, apiA)
	idA, idB := kubeSystemUID(t, ca), kubeSystemUID(t, kubeClient(t, apiB))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	listen := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
	pA := startProc(t, "--cluster", "east", "--region", "eu", "--kubeconfig", apiA.Kubeconfig,
		"--registry-data-dir", filepath.Join(t.TempDir(), "registry"), "--registry-listen", listen,
		"--registry-peer-listen", fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)),
		"--registry-probe-interval", "500ms", "--leader-elect-namespace", "aether-system")
	testenv.Eventually(t, 90*time.Second, "registrar A ready", pA.ready)
	pid := pA.cmd.Process.Pid
	cli := etcdClient(t, listen)
	east := registry.Origin{Region: "eu", Cluster: "east"}
	hasMark := func(svc string, want bool) func() error { return markPresent(ctx, cli, east, "apps", svc, want) }
	if err := exportService(ctx, ca, "apps", "web"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "A's export mark", hasMark("web", true))

	// Cluster B takes cluster name east through A's embedded registry.
	reclaimVia := func(api *testenv.KubeAPIServer, previous string) {
		t.Helper()
		out, code := runReclaim(t, "--cluster", "east", "--region", "eu", "--kubeconfig", api.Kubeconfig,
			"--registry-endpoints", listen, "--previous-cluster-id", previous)
		if code != 0 {
			t.Fatalf("reclaim-partition replacing %s: exit %d:\n%s", previous, code, out)
		}
	}
	reclaimVia(apiB, idA)
	testenv.Eventually(t, 60*time.Second, "A not ready, naming check partition-claim", func() error {
		code, body, err := pA.readyz()
		if err != nil {
			return err
		}
		if code == http.StatusOK || !strings.Contains(body, "[-]partition-claim failed") || !strings.Contains(body, "[+]registry ok") {
			return fmt.Errorf("/readyz %d:\n%s", code, body)
		}
		return nil
	})
	if err := exportService(ctx, ca, "apps", "late"); err != nil {
		t.Fatal(err)
	}

	// The registry keeps serving every other writer.
	writer := func(cluster, id string) *registry.Registry {
		r, err := registry.New(registry.Config{Endpoints: []string{listen}, Region: "eu", Cluster: cluster, ClusterID: id, Claimer: true,
			LeaseTTL: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	for _, w := range []*registry.Registry{writer("west", "uid-west"), writer("east", idB)} {
		ep := &registryv1.ServiceEndpoint{
			Service: &registryv1.ServiceRef{Namespace: "apps", Name: "api"}, Addresses: []string{"10.1.0.5"},
			Ports:  []*registryv1.EndpointPort{{Name: "http", Port: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
			Health: registryv1.Health_HEALTH_HEALTHY, SpiffeId: "spiffe://aether.internal/ns/apps/sa/default",
			Kubernetes: &registryv1.KubernetesMetadata{NodeName: "n1", PodName: "api-1", PodUid: "pod-" + w.Origin().Cluster},
		}
		if err := w.RegisterEndpoint(ctx, ep); err != nil {
			t.Fatalf("%s writes its partition while A is in conflict: %v", w.Origin(), err)
		}
		eps, _, err := w.ListEndpoints(ctx)
		if err != nil {
			t.Fatalf("%s reads the registry while A is in conflict: %v", w.Origin(), err)
		}
		found := false
		for _, e := range eps {
			found = found || e.Key == w.Origin().EndpointKey("apps", "api", "pod-"+w.Origin().Cluster)
		}
		if !found {
			t.Fatalf("%s does not read back its endpoint: %v", w.Origin(), eps)
		}
	}
	if err := hasMark("late", false)(); err != nil {
		t.Fatalf("A's export controller wrote while another cluster holds its partition: %v", err)
	}
	select {
	case err := <-pA.done:
		pA.done <- err
		t.Fatalf("registrar A exited in conflict: %v", err)
	default:
	}
	b, err := os.ReadFile(pA.log)
	if err != nil {
		t.Fatal(err)
	}
	log := strings.ReplaceAll(string(b), `\"`, `"`)
	for _, want := range []string{"export and import stopped", idA, idB, registrar.ReclaimCommand + " --cluster east --region eu --registry-endpoints " + listen + " --previous-cluster-id " + idB} {
		if !strings.Contains(log, want) {
			t.Errorf("registrar A's log lacks %q:\n%s", want, log)
		}
	}

	// Re-claimed for A with the command it printed: the same process resumes.
	reclaimVia(apiA, idB)
	testenv.Eventually(t, 60*time.Second, "A ready again", pA.ready)
	testenv.Eventually(t, 60*time.Second, "A's export made during the conflict", hasMark("late", true))
	if pA.cmd.Process.Pid != pid || pA.cmd.ProcessState != nil {
		t.Fatal("registrar A was restarted")
	}
}

// markPresent checks, for testenv.Eventually, whether origin's export mark of ns/svc is in the
// registry (want) or not.
func markPresent(ctx context.Context, cli *clientv3.Client, origin registry.Origin, ns, svc string, want bool) func() error {
	return func() error {
		resp, err := cli.Get(ctx, origin.ExportKey(ns, svc))
		if err != nil {
			return err
		}
		if (len(resp.Kvs) == 1) != want {
			return fmt.Errorf("export mark %s/%s present: %v, want %v", ns, svc, len(resp.Kvs) == 1, want)
		}
		return nil
	}
}
