package kind

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestScriptsWithStandIns runs up.sh, run.sh and down.sh with stand-ins for docker, kind,
// kubectl, helm, curl, openssl and go (testdata/stub.sh logs every call) and checks the commands
// they issue: two clusters with kind's CNI disabled and identical pod CIDRs, Flannel, the
// registry container, every image built and loaded into both clusters, the chart rendered for
// each cluster (its name, the registry's address, identity.mode dev-ca) and applied, and the
// scenario suite run with both kubeconfigs.
func TestScriptsWithStandIns(t *testing.T) {
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	stub, err := filepath.Abs("testdata/stub.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"docker", "kind", "kubectl", "helm", "curl", "openssl", "go"} {
		if err := os.Symlink(stub, filepath.Join(bin, n)); err != nil {
			t.Fatal(err)
		}
	}
	logPath := filepath.Join(tmp, "calls.log")
	work := filepath.Join(tmp, "work")
	run := func(script string, args ...string) {
		t.Helper()
		cmd := exec.Command("bash", append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "STUB_LOG="+logPath,
			"AETHER_KIND_WORK="+work, "AETHER_KIND_PREFIX=t")
		if out, err := cmd.CombinedOutput(); err != nil {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("%s: %v\n%s\ncalls:\n%s", script, err, out, b)
		}
	}
	run("up.sh")
	run("run.sh", "-v")
	run("down.sh")
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	calls := string(b)
	kcA, kcB := filepath.Join(work, "kubeconfig-t-a"), filepath.Join(work, "kubeconfig-t-b")
	for _, want := range []string{
		"kind create cluster --name t-a --config " + work + "/kind-t-a.yaml --kubeconfig " + kcA,
		"kind create cluster --name t-b --config " + work + "/kind-t-b.yaml --kubeconfig " + kcB,
		"  | networking:\n  |   disableDefaultCNI: true\n  |   podSubnet: 10.244.0.0/16\n  |   serviceSubnet: 10.96.0.0/16",
		"  |   disableDefaultCNI: true\n  |   podSubnet: 10.244.0.0/16\n  |   serviceSubnet: 10.112.0.0/16",
		"docker exec t-a-control-plane tar -C /opt/cni/bin -xzf /tmp/cni-plugins.tgz",
		"kubectl --kubeconfig " + kcB + " wait --for=condition=Ready nodes --all",
		"docker run -d --name t-registry --network kind quay.io/coreos/etcd:",
		"kind load docker-image aether-agent:dev --name t-a",
		"kind load docker-image aether-envoy:dev --name t-b",
		"kind load docker-image aether-registrar:dev --name t-b",
		"kind load docker-image aether-e2e-workloads:dev --name t-a",
		"kind load docker-image aether-e2e-workloads:dev --name t-b",
		"--set identity.mode=dev-ca --set cluster=t-a --set registry.endpoints={http://172.18.0.9:2379} --set registry.insecure=true",
		"--set identity.mode=dev-ca --set cluster=t-b --set registry.endpoints={http://172.18.0.9:2379} --set registry.insecure=true",
		"create secret tls aether-ca --cert " + work + "/ca.crt --key " + work + "/ca.key",
		"kubectl --kubeconfig " + kcA + " -n aether-system rollout status daemonset/aether-agent",
		"go test ./e2e/scenarios/ -run TestScenarios -count=1 -timeout 60m -v -args -pair=kind -kubeconfig-a=" + kcA + " -kubeconfig-b=" + kcB,
		"kind delete cluster --name t-b",
		"docker rm -f t-registry",
	} {
		if !strings.Contains(calls, want) {
			t.Errorf("no call %q", want)
		}
	}
	for _, df := range []string{"agent", "envoy", "registrar"} {
		if !regexp.MustCompile(`docker build -f \S+/images/` + df + `/Dockerfile -t aether-` + df + `:dev \S+`).MatchString(calls) {
			t.Errorf("images/%s/Dockerfile not built", df)
		}
	}
	if !regexp.MustCompile(`docker build -f \S+/e2e/kind/workloads.Dockerfile -t aether-e2e-workloads:dev \S+`).MatchString(calls) {
		t.Error("the workloads image (e2e/kind/workloads.Dockerfile) not built")
	}
	// The chart (identity.mode dev-ca, issue #28) goes in after the namespace and the CA Secret,
	// in both clusters.
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, kc := range []string{kcA, kcB} {
		last := -1
		for _, step := range []string{
			"apply -f " + root + "/deploy/namespace.yaml",
			"-n aether-system create secret tls aether-ca",
			"apply --server-side --force-conflicts -f -",
		} {
			i := strings.Index(calls, "kubectl --kubeconfig "+kc+" "+step)
			if i <= last {
				t.Errorf("%s: %q at %d, want it after the previous step (%d)", kc, step, i, last)
			}
			last = i
		}
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("down.sh left %s (%v)", work, err)
	}
}
