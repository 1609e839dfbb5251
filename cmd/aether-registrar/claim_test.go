package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registrar/registry"
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
	return runSubcommand(t, reclaimCommand, nil, args...)
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
	hasMark := func(svc string, want bool) func() error {
		return func() error {
			resp, err := cli.Get(ctx, east.ExportKey("apps", svc))
			if err != nil {
				return err
			}
			if (len(resp.Kvs) == 1) != want {
				return fmt.Errorf("export mark apps/%s present: %v, want %v", svc, len(resp.Kvs) == 1, want)
			}
			return nil
		}
	}
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
	for _, want := range []string{`cluster name \"east\"`, idA, idB, "--cluster (AETHER_CLUSTER", reclaimCommand + " --cluster east --region eu --previous-cluster-id " + idA} {
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
