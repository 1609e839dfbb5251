package scenarios

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestKindWorkerNodes(t *testing.T) {
	node := func(name string, cp bool) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
		if cp {
			n.Labels[controlPlaneLabel] = ""
		}
		return n
	}
	workers, all := workerNodes([]corev1.Node{node("b-worker2", false), node("b-control-plane", true), node("b-worker", false)})
	if !slices.Equal(workers, []string{"b-worker", "b-worker2"}) || !slices.Equal(all, []string{"b-control-plane", "b-worker", "b-worker2"}) {
		t.Errorf("workers %v, all %v", workers, all)
	}
}

func TestKindLeaseTTLFromArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want time.Duration
		err  bool
	}{
		{"flag with =", []string{"--envoy-binary=", "--registry-lease-ttl=5s"}, 5 * time.Second, false},
		{"flag and value", []string{"--registry-lease-ttl", "1m"}, time.Minute, false},
		{"absent: the agent's default", []string{"--envoy-binary="}, defaultLeaseTTL, false},
		{"bad value", []string{"--registry-lease-ttl=soon"}, 0, true},
		{"not positive", []string{"--registry-lease-ttl=0s"}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := leaseTTLFromArgs(tc.args)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("leaseTTLFromArgs(%q) = %v, %v; want %v, error %v", tc.args, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestKindRegistryHost(t *testing.T) {
	for in, want := range map[string]string{
		"http://172.18.0.9:2379":                             "172.18.0.9",
		"https://reg.example:2379,https://reg2.example:2379": "reg.example",
		"":           "",
		"172.18.0.9": "",
	} {
		got, err := registryHost(in)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("registryHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestKindDisruptions checks the node-level commands of the kind pair with a recorded docker:
// the registry cut inserts, on every node of both clusters, an OUTPUT rule (the node's packets to
// the registry) and an INPUT rule (the registry's packets back) and the restore deletes the same
// rules; StopNode kills the node's container and deletes its Node; EnvoyAdmin curls the
// admin socket inside the node's container.
func TestKindDisruptions(t *testing.T) {
	var calls []string
	kubeB := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b-worker2"}})
	p := &kindPair{
		a:        &kindCluster{name: "a", all: []string{"a-control-plane", "a-worker"}, workers: []string{"a-worker"}},
		b:        &kindCluster{name: "b", kube: kubeB, all: []string{"b-control-plane", "b-worker", "b-worker2"}, workers: []string{"b-worker", "b-worker2"}},
		registry: "172.18.0.9", leaseTTL: 4500 * time.Millisecond,
		nodes: dockerNodes{run: func(_ context.Context, name string, args ...string) ([]byte, error) {
			calls = append(calls, name+" "+strings.Join(args, " "))
			return nil, nil
		}},
	}
	ctx := context.Background()
	if err := p.CutRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.RestoreRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.StopNode(ctx, "b", "b-worker2"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.EnvoyAdmin(ctx, "b", "b-worker", "/stats?filter=%5Etcp"); err != nil {
		t.Fatal(err)
	}
	rules := []string{
		"OUTPUT -p tcp -d 172.18.0.9 --dport 2379 -m comment --comment aether-e2e-registry-cut -j DROP",
		"INPUT -p tcp -s 172.18.0.9 --sport 2379 -m comment --comment aether-e2e-registry-cut -j DROP",
	}
	var want []string
	for _, op := range []string{"-I", "-D"} {
		for _, n := range []string{"a-control-plane", "a-worker", "b-control-plane", "b-worker", "b-worker2"} {
			for _, r := range rules {
				want = append(want, "docker exec "+n+" iptables "+op+" "+r)
			}
		}
	}
	want = append(want, "docker kill b-worker2",
		"docker exec b-worker curl -sS --fail --max-time 10 --unix-socket /var/run/aether/envoy-admin.sock http://envoy/stats?filter=%5Etcp")
	if !slices.Equal(calls, want) {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	if _, err := kubeB.CoreV1().Nodes().Get(ctx, "b-worker2", metav1.GetOptions{}); err == nil {
		t.Error("StopNode left the Node object")
	}
	if got := p.Nodes("b"); !slices.Equal(got, []string{"b-worker"}) {
		t.Errorf("Nodes(b) after StopNode = %v", got)
	}
	if p.LeaseTTL() != 5 {
		t.Errorf("LeaseTTL() = %d, want 5 (4.5s rounded up)", p.LeaseTTL())
	}
	if cmd, img := p.Command("echo"); cmd != "/usr/local/bin/echo" || img != kindWorkloadImage {
		t.Errorf("Command(echo) = %q, %q", cmd, img)
	}
}

func TestKindPairFlags(t *testing.T) {
	if _, err := newKindPair("", "b"); err == nil || !strings.Contains(err.Error(), "-kubeconfig-a") {
		t.Errorf("newKindPair without -kubeconfig-a: %v", err)
	}
	if _, err := newKindPair("/nonexistent/a", "/nonexistent/b"); err == nil || !strings.Contains(err.Error(), "/nonexistent/a") {
		t.Errorf("newKindPair with a missing kubeconfig: %v", err)
	}
}
