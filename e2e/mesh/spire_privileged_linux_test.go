package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/identity/spire"
	"github.com/aethermesh/aether/images"
	"github.com/aethermesh/aether/internal/testenv"
)

// testWriter sends log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestPrivilegedSPIREOnRealNodes installs aether with the chart's default identity, SPIRE, in one
// cluster of two real nodes (containerd, kubelet, kube-proxy; e2e/substrate) from the images
// images/ builds, the SPIRE server under an upstream authority from a Secret
// (spire.clusterset.mode sharedTrustDomain: what lets two clusters share a trust domain). It
// shows:
//   - the SPIRE server (StatefulSet, data in an emptyDir: the substrate has no volume
//     provisioner) and the Controller Manager beside it become ready, every node's SPIRE agent
//     attests with k8s_psat (spire-server agent list: spiffe://<td>/spire/agent/k8s_psat/alpha/<node
//     UID>) after bootstrapping from the bundle the server published, and that bundle is the
//     upstream authority's certificate alone: the server's CA is signed under it;
//   - the aether agents become ready (their readiness needs the SPIRE agent's answers);
//   - a pod of a meshed namespace gets its entry from the Controller Manager (ClusterSPIFFEID
//     aether-workloads): spiffe://<td>/ns/shop/sa/default, selector k8s:pod-uid, parent its node's
//     agent; it starts at all only because its node's aether agent got its SVID through the
//     Delegated Identity API and served it (the CNI ADD fails closed otherwise); and, through the
//     Workload API socket the chart puts on the node, the pod fetches its X.509 SVID itself: the k8s
//     workload attestor found it through the kubelet's secure port;
//   - every aether agent pod gets its delegate entry (ClusterSPIFFEID aether-agent):
//     spiffe://<td>/ns/aether-system/sa/aether-agent, the ID the SPIRE agents' authorized_delegates
//     name;
//   - the admin socket's directory on each node is 0700 root, and a caller that is not the
//     delegate (this test, a process outside any pod) is refused by the Delegated Identity API;
//   - every SPIRE container runs the image built here.
func TestPrivilegedSPIREOnRealNodes(t *testing.T) {
	testenv.RequireRoot(t)
	tl := testenv.RequireTools(t, testenv.ToolEtcd, testenv.ToolKubeAPIServer, testenv.ToolCNIPlugins, testenv.ToolNodes,
		testenv.ToolHelm, testenv.ToolSPIRE, testenv.ToolEnvoy)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	built, err := images.Build(ctx, images.Options{Root: root, CacheDir: filepath.Join(tl.Dir, "images"), Envoy: tl.Envoy,
		Tools: images.ToolPaths(tl.SPIREServer, tl.SPIREAgent, tl.SPIREControllerManager)}, images.Images())
	if err != nil {
		t.Fatal(err)
	}
	digests, err := imageDigests(built)
	if err != nil {
		t.Fatal(err)
	}
	s, err := substrate.Start(ctx, substrate.Options{
		RealNodes: true,
		Clusters:  []substrate.ClusterSpec{{Name: "alpha", PodCIDR: "10.244.0.0/16", Nodes: 2}},
		Logger:    log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := s.PushImages(ctx, built); err != nil {
		t.Fatal(err)
	}
	c := s.Clusters[0]
	chart := filepath.Join(root, chartDir)
	kubectl := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, filepath.Join(tl.KubernetesDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...).CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, args := range [][]string{
				{"get", "pods", "-A", "-o", "wide"},
				{"-n", "spire", "logs", "spire-server-0", "-c", "spire-server", "--tail", "40"},
				{"-n", "spire", "logs", "spire-server-0", "-c", "controller-manager", "--tail", "40"},
				{"-n", "spire", "logs", "daemonset/spire-agent", "--tail", "40"},
			} {
				out, _ := kubectl(args...)
				t.Logf("kubectl %s:\n%s", strings.Join(args, " "), testenv.Tail(out, 4000))
			}
		}
	})

	// aether with SPIRE (the chart's default identity.mode), the SPIRE server under an upstream
	// authority (spire.clusterset.mode sharedTrustDomain): the Secret in SPIRE's namespace, made
	// before the chart, as docs/identity.md says.
	const td = "aether.internal"
	upstream, err := testenv.NewCA("aether-e2e-spire-upstream")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateNamespace(ctx, spireNamespace, map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}); err != nil {
		t.Fatal(err)
	}
	if err := createSecrets(ctx, c, spireNamespace, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mesh-root"},
		Data: map[string][]byte{"upstream-ca.crt": upstream.CertPEM, "upstream-ca.key": upstream.KeyPEM}}); err != nil {
		t.Fatal(err)
	}
	out, err := installChart(ctx, c, tl.Helm, chart, "spire", nil, "--set", "logLevel=debug", "--set", "trustDomain="+td,
		"--set", "spire.server.dataVolume.type=emptyDir", "--set", "spire.createNamespace=false",
		"--set", "spire.clusterset.mode=sharedTrustDomain", "--set", "spire.clusterset.upstreamAuthority.secretName=mesh-root")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "spire-server agent list") {
		t.Errorf("helm install NOTES do not say how to check SPIRE:\n%s", out)
	}
	if err := waitInstalled(ctx, c); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Minute, "the SPIRE server and every node's SPIRE agent ready", func() error {
		st, err := c.Client.AppsV1().StatefulSets("spire").Get(ctx, "spire-server", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ds, err := c.Client.AppsV1().DaemonSets("spire").Get(ctx, "spire-agent", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if st.Status.ReadyReplicas != 1 || ds.Status.NumberReady != int32(len(c.Nodes)) {
			return fmt.Errorf("spire-server %d of 1 ready, spire-agent %d of %d", st.Status.ReadyReplicas, ds.Status.NumberReady, len(c.Nodes))
		}
		return nil
	})
	if err := runsBuiltImages(ctx, c, "spire", digests); err != nil {
		t.Error(err)
	}
	server := func(args ...string) (string, error) {
		return kubectl(append([]string{"-n", "spire", "exec", "spire-server-0", "-c", "spire-server", "--", "spire-server"},
			append(args, "-socketPath", "/run/spire/server-api/api.sock")...)...)
	}

	// The bundle is the upstream authority's certificate.
	bundle, err := server("bundle", "show")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(bundle) != strings.TrimSpace(string(upstream.CertPEM)) {
		t.Errorf("spire-server bundle show:\n%s\nwant the upstream authority's certificate alone:\n%s", bundle, upstream.CertPEM)
	}

	// Every node's agent attested with k8s_psat.
	agentID := map[string]string{}
	for _, n := range c.Nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		agentID[n.Name] = "spiffe://" + td + "/spire/agent/k8s_psat/" + c.Name + "/" + string(node.UID)
	}
	out, err = server("agent", "list")
	if err != nil {
		t.Fatal(err)
	}
	for node, id := range agentID {
		if !regexp.MustCompile(`SPIFFE ID\s*: ` + regexp.QuoteMeta(id) + `\n(.*\n)*?Attestation type\s*: k8s_psat`).MatchString(out) {
			t.Errorf("spire-server agent list holds no k8s_psat agent %s (node %s):\n%s", id, node, out)
		}
	}

	// A pod of a meshed namespace: its entry, and its SVID through the node's Workload API.
	if err := c.CreateNamespace(ctx, "shop", map[string]string{"aether.io/mesh": "enabled"}); err != nil {
		t.Fatal(err)
	}
	sockets := corev1.HostPathDirectory
	wl, err := c.Client.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "wl"},
		Spec: corev1.PodSpec{
			NodeName: c.Nodes[1].Name,
			Containers: []corev1.Container{{Name: "wl", Image: images.SPIREAgentImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{"/usr/local/bin/spire-agent", "api", "watch", "-socketPath", "/run/spire/agent-sockets/spire-agent.sock"},
				VolumeMounts: []corev1.VolumeMount{{Name: "spire", MountPath: "/run/spire/agent-sockets", ReadOnly: true}}}},
			Volumes: []corev1.Volume{{Name: "spire", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: "/run/spire/agent-sockets", Type: &sockets}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitPodReady(ctx, "shop", "wl"); err != nil {
		t.Fatal(err)
	}
	wantEntry := func(uid, spiffeID, parent string) error {
		out, err := server("entry", "show", "-selector", "k8s:pod-uid:"+uid)
		if err != nil {
			return err
		}
		for _, re := range []string{`SPIFFE ID\s*: ` + regexp.QuoteMeta(spiffeID) + `\n`, `Parent ID\s*: ` + regexp.QuoteMeta(parent) + `\n`,
			`Selector\s*: k8s:pod-uid:` + regexp.QuoteMeta(uid) + `\n`} {
			if !regexp.MustCompile(re).MatchString(out) {
				return fmt.Errorf("entry of pod %s: no %q in:\n%s", uid, re, out)
			}
		}
		return nil
	}
	wlID := "spiffe://" + td + "/ns/shop/sa/default"
	testenv.Eventually(t, 2*time.Minute, "the meshed pod's entry", func() error {
		return wantEntry(string(wl.UID), wlID, agentID[c.Nodes[1].Name])
	})
	testenv.Eventually(t, 2*time.Minute, "the meshed pod's SVID through the Workload API", func() error {
		out, err := c.ExecInPod(ctx, "shop", "wl", "/usr/local/bin/spire-agent", "api", "fetch", "x509", "-socketPath", "/run/spire/agent-sockets/spire-agent.sock")
		if err != nil {
			return err
		}
		if !regexp.MustCompile(`SPIFFE ID:\s*` + regexp.QuoteMeta(wlID) + `\n`).Match(out) {
			return fmt.Errorf("spire-agent api fetch x509 in the pod:\n%s", out)
		}
		return nil
	})

	// Every aether agent pod: its delegate entry, with the ID the SPIRE agents authorize.
	delegate := "spiffe://" + td + "/ns/" + Namespace + "/sa/aether-agent"
	cm, err := c.Client.CoreV1().ConfigMaps("spire").Get(ctx, "spire-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var agentConf struct {
		Agent struct {
			AuthorizedDelegates []string `json:"authorized_delegates"`
		} `json:"agent"`
	}
	conf := strings.NewReplacer("${AETHER_TRUST_DOMAIN}", td, "${AETHER_CLUSTER}", c.Name).Replace(cm.Data["agent.conf"])
	if err := json.Unmarshal([]byte(conf), &agentConf); err != nil || !slices.Equal(agentConf.Agent.AuthorizedDelegates, []string{delegate}) {
		t.Errorf("the SPIRE agents' authorized_delegates %v (%v), want [%s]", agentConf.Agent.AuthorizedDelegates, err, delegate)
	}
	agents, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + AgentDaemonSet})
	if err != nil || len(agents.Items) != len(c.Nodes) {
		t.Fatalf("aether agent pods: %d (%v), want one per node", len(agents.Items), err)
	}
	for _, p := range agents.Items {
		testenv.Eventually(t, 2*time.Minute, "the delegate entry of "+p.Name, func() error {
			return wantEntry(string(p.UID), delegate, agentID[p.Spec.NodeName])
		})
	}
	dyn := dynamic.NewForConfigOrDie(c.Config)
	ids := dyn.Resource(schema.GroupVersionResource{Group: "spire.spiffe.io", Version: "v1alpha1", Resource: "clusterspiffeids"})
	for name, pods := range map[string]int64{"aether-workloads": 1, "aether-agent": int64(len(c.Nodes))} {
		testenv.Eventually(t, time.Minute, "ClusterSPIFFEID "+name+" status", func() error {
			u, err := ids.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			stats := u.Object["status"].(map[string]any)["stats"].(map[string]any)
			if stats["podsSelected"] != pods || stats["entryFailures"] != nil && stats["entryFailures"] != int64(0) {
				return fmt.Errorf("stats %v, want %d pods selected, no entry failure", stats, pods)
			}
			return nil
		})
	}

	// The admin socket: 0700 root on every node, and no answer to a caller that is not the
	// authorized delegate.
	for _, n := range c.Nodes {
		dir := filepath.Join(n.Root, "run", "spire", "agent-admin")
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 || st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s: %s mode %v uid %d, want 0700 root", n.Name, dir, st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Uid)
		}
		if st, err := os.Stat(filepath.Join(n.Root, "run", "spire", "agent-sockets")); err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("%s: the Workload API's directory: %v %v, want 0755 (its users are not root)", n.Name, st, err)
		}
	}
	d, err := spire.New(spire.Config{AdminSocket: filepath.Join(c.Nodes[1].Root, "run", "spire", "agent-admin", "admin.sock"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithCancel(ctx)
	defer dcancel()
	d.Start(dctx)
	d.SetPods("test", []identity.Workload{{UID: string(wl.UID)}})
	testenv.Eventually(t, time.Minute, "the Delegated Identity API refuses a caller outside any pod", func() error {
		st, _ := d.Pod(string(wl.UID))
		if len(st.SVIDs) > 0 {
			t.Fatalf("the SPIRE agent gave a process outside the aether agent's pod the SVIDs of %s", wl.Name)
		}
		var se interface{ GRPCStatus() *status.Status }
		if !errors.As(st.Err, &se) || se.GRPCStatus().Code() != codes.PermissionDenied {
			return fmt.Errorf("subscription error %v, want PermissionDenied", st.Err)
		}
		return nil
	})

}
