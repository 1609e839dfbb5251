//go:build linux

// Command demo is `make demo`: it starts the local two-cluster substrate with aether (e2e/mesh),
// deploys a sample (service "hello" in namespace "demo" of cluster beta, exported with an MCS
// ServiceExport; a client pod in cluster alpha), sends requests from alpha to beta through beta's
// node waypoints, prints both identities, shows the waypoint path (alpha-node1's EDS entries for
// the service, beta's node IPs at :15443, and beta's tunnel counters before and after the
// requests, waypoint.go), and says how to look further. It then runs until
// SIGTERM or SIGINT (`make demo-down`) and tears everything down.
//
//	demo [-state-dir DIR] [-requests N]
//
// It needs root and the cached tools (hack/tools.sh). While it runs, DIR (default
// /run/aether-demo) holds demo.env (where everything is) and ready (written once the demo
// requests went through).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/aethermesh/aether/e2e/mesh"
	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/internal/testenv"
)

type config struct {
	stateDir string
	requests int
	standIn  bool
}

func main() {
	var cfg config
	flag.StringVar(&cfg.stateDir, "state-dir", "/run/aether-demo", "where demo.env and the ready mark go")
	flag.IntVar(&cfg.requests, "requests", 4, "requests the client sends to beta")
	flag.BoolVar(&cfg.standIn, "stand-in", false, "run the nodes as the substrate's fast kubelet stand-in (pods as processes, aether as node processes) instead of real nodes with aether installed by its Helm chart")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

const ns = "demo"

func run(ctx context.Context, cfg config) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("run as root (network namespaces, nftables)")
	}
	if err := os.MkdirAll(cfg.stateDir, 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if cfg.standIn {
		step("building aether and starting two clusters (alpha, beta: 2 nodes each, the fast kubelet stand-in) with an agent and Envoy per node")
	} else {
		step("building aether's images and starting two clusters (alpha, beta: 2 real nodes each: containerd, kubelet, kube-proxy), then helm install aether in each")
	}
	// Directories are kept so a failed demo leaves its logs; a clean stop removes them, and
	// `make demo-down` removes what the dirs file lists.
	m, err := mesh.StartMesh(sctx, mesh.Options{Logger: log, KeepDir: true, RealNodes: !cfg.standIn})
	if err != nil {
		return err
	}
	dirs := m.Substrate.Dir + "\n" + m.Dir + "\n"
	if werr := os.WriteFile(filepath.Join(cfg.stateDir, "dirs"), []byte(dirs), 0o644); werr != nil {
		log.Warn("write dirs file", "err", werr)
	}
	defer func() {
		m.Stop()
		if err == nil {
			os.RemoveAll(m.Substrate.Dir)
			os.RemoveAll(m.Dir)
		}
	}()
	alpha, beta := m.Clusters[0], m.Clusters[1]
	step("deploying the sample: service hello (2 pods) in beta, exported; a client pod in alpha")
	if err := deploySample(sctx, m); err != nil {
		return err
	}
	url := "http://hello." + ns + ".svc.clusterset.local/"
	step("client in alpha -> " + url)
	var last reply
	before := tunnelCountersOf(beta.Nodes)
	onNode := map[string]string{} // hello pod -> its node
	for i, n := range beta.Nodes {
		onNode[helloPod(i)] = n.Name
	}
	deadline := time.Now().Add(2 * time.Minute)
	for sent := 0; sent < cfg.requests; {
		client, _ := m.Workload("client")
		out, err := alpha.ExecInPod(sctx, ns, "client", client, "-timeout", "3s", "http", url)
		var r reply
		if err == nil {
			err = json.Unmarshal(out, &r)
		}
		if err != nil || r.CallerID == "" {
			if time.Now().After(deadline) {
				return fmt.Errorf("request from alpha to beta: %v (answer %q); agent logs under %s/logs", err, out, m.Substrate.Dir)
			}
			time.Sleep(500 * time.Millisecond)
			continue
		}
		sent++
		last = r
		fmt.Printf("  request %d: alpha/%s/client (%s)\n      -> beta: answered by pod %s/%s on %s in cluster %s\n      caller's SPIFFE ID seen in beta: %s\n",
			sent, ns, clientID, ns, r.Server, cmp.Or(onNode[r.Server], "?"), r.Cluster, r.CallerID)
	}
	fmt.Printf("  XFCC header beta's pod received (By = the server's identity, URI = the caller's):\n      %s\n", last.XFCC)
	showWaypoint(alpha.Nodes[0], beta.Nodes, before)
	env := describe(m)
	if err := os.WriteFile(filepath.Join(cfg.stateDir, "demo.env"), []byte(env), 0o644); err != nil {
		return fmt.Errorf("write demo.env: %w", err)
	}
	fmt.Print(lookFurther(m, beta.Name))
	if err := os.WriteFile(filepath.Join(cfg.stateDir, "ready"), nil, 0o644); err != nil {
		return fmt.Errorf("write ready mark: %w", err)
	}
	<-ctx.Done()
	step("shutting down")
	return nil
}

const clientID = "spiffe://aether.internal/ns/" + ns + "/sa/client"

// reply is the echo workload's JSON answer.
type reply struct {
	Server   string `json:"server"`
	Cluster  string `json:"cluster"`
	XFCC     string `json:"xfcc"`
	CallerID string `json:"callerID"`
}

// helloPod names the hello pod on beta's i-th node (0-based).
func helloPod(i int) string { return fmt.Sprintf("hello-%d", i+1) }

func step(s string) { fmt.Printf("==> %s\n", s) }

func deploySample(ctx context.Context, m *mesh.Mesh) error {
	alpha, beta := m.Clusters[0], m.Clusters[1]
	for _, c := range []*substrate.Cluster{alpha, beta} {
		if err := c.CreateNamespace(ctx, ns, map[string]string{"aether.io/mesh": "enabled"}); err != nil {
			return fmt.Errorf("deploy sample: %w", err)
		}
	}
	// Caller and server run under their own service accounts, so the two SPIFFE IDs printed
	// (the caller's in beta, the server's in XFCC By=) differ.
	for c, sa := range map[*substrate.Cluster]string{alpha: "client", beta: "hello"} {
		if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("deploy sample: %w", err)
		}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hello"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "hello"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(substrate.EchoHTTPPort)}}}}
	if _, err := beta.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deploy sample: %w", err)
	}
	var pods []*corev1.Pod
	echoCmd, echoImg := m.Workload("echo")
	for i, n := range beta.Nodes {
		p := substrate.EchoPod(ns, helloPod(i), n.Name, beta.Name, echoCmd)
		p.Spec.Containers[0].Image = echoImg
		p.Labels["app"] = "hello"
		p.Spec.ServiceAccountName = "hello"
		pods = append(pods, p)
	}
	for _, p := range pods {
		if _, err := beta.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("deploy sample: %w", err)
		}
	}
	clientCmd, clientImg := m.Workload("client")
	client := substrate.ClientPod(ns, "client", alpha.Nodes[0].Name, alpha.Name, clientCmd)
	client.Spec.Containers[0].Image = clientImg
	client.Spec.ServiceAccountName = "client"
	if _, err := alpha.Client.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deploy sample: %w", err)
	}
	dyn, err := dynamic.NewForConfig(beta.Config)
	if err != nil {
		return fmt.Errorf("deploy sample: %w", err)
	}
	export := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
		"metadata": map[string]any{"name": "hello", "namespace": ns}}}
	gvr := schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1beta1", Resource: "serviceexports"}
	if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, export, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deploy sample: export hello: %w", err)
	}
	for _, p := range pods {
		if _, err := beta.WaitPodReady(ctx, ns, p.Name); err != nil {
			return fmt.Errorf("deploy sample: %w", err)
		}
	}
	return nil
}

// describe renders where everything is as shell variable assignments (demo.env).
func describe(m *mesh.Mesh) string {
	var b strings.Builder
	fmt.Fprintf(&b, "AEDEMO_RUN_DIR=%s\nAEDEMO_REGISTRY=%s\nAEDEMO_REGISTRY_CA=%s\nAEDEMO_REGISTRY_CERT=%s\nAEDEMO_REGISTRY_KEY=%s\nAEDEMO_BIN_DIR=%s\n",
		m.Substrate.Dir, m.RegistryEndpoint, m.Substrate.RegistryCAFile, m.Substrate.RegistryRootCertFile, m.Substrate.RegistryRootKeyFile, filepath.Dir(m.Bins["client"]))
	for _, c := range m.Clusters {
		up := strings.ToUpper(c.Name)
		fmt.Fprintf(&b, "AEDEMO_%s_KUBECONFIG=%s\n", up, c.Kubeconfig)
		for _, n := range c.Nodes {
			fmt.Fprintf(&b, "AEDEMO_NETNS_%s=%s\n", strings.ToUpper(strings.ReplaceAll(n.Name, "-", "_")), n.Netns.Path)
		}
	}
	return b.String()
}

// lookFurther says which commands and admin endpoints show more.
func lookFurther(m *mesh.Mesh, beta string) string {
	a, bc := m.Clusters[0], m.Cluster(beta)
	n := a.Nodes[0]
	bn := bc.Nodes[0]
	var b strings.Builder
	fmt.Fprintf(&b, `
==> the demo runs; look further (as root):
  kubectl --kubeconfig %s get pods,svc,serviceimports -A      # cluster alpha (the client, the imported hello-clusterset VIP)
  kubectl --kubeconfig %s get pods,svc,serviceexports -A      # cluster beta (hello, exported)
  curl -s --unix-socket %s http://envoy/clusters | grep hello   # alpha-node1's Envoy admin (0600 socket): beta's node IPs at :15443 (waypoint)
  curl -s --unix-socket %s http://envoy/listeners           # beta-node1's Envoy: the east-west tunnel listener on :15443
  curl -s --unix-socket %s 'http://envoy/stats?filter=^tcp\.waypoint\.'   # beta-node1's waypoint counters per service
  nsenter --net=%s curl -s 127.0.0.1:15021/readyz              # alpha-node1's agent (metrics on :15020, Envoy's on :15090)
  nsenter --net=%s dig @%s hello.%s.svc.clusterset.local        # the agent's DNS
`, a.Kubeconfig, bc.Kubeconfig, n.HostPath(envoyAdmin), bn.HostPath(envoyAdmin), bn.HostPath(envoyAdmin), n.Netns.Path, n.Netns.Path, n.Plan.IP.String()+" -p 18054", ns)
	if mnt := n.MountNamespace(); mnt != "" {
		crictl := "crictl"
		if tl, err := testenv.FindTools(); err == nil {
			crictl = tl.Crictl
		}
		// Real nodes: aether is the Helm release's pods; kubectl reaches them.
		name := "hello." + ns + ".svc.clusterset.local"
		fmt.Fprintf(&b, `  kubectl --kubeconfig %[1]s -n aether-system get pods -o wide   # the agent DaemonSet (agent + Envoy per node) and the registrar
  kubectl --kubeconfig %[1]s -n aether-system logs ds/aether-agent -c agent     # an agent's log
  kubectl --kubeconfig %[1]s -n %[2]s exec client -- client -timeout 3s http http://%[3]s/   # a request from the client pod
  kubectl --kubeconfig %[1]s -n %[2]s exec client -- client resolve %[3]s                   # its DNS answer (the clusterset VIP)
  nsenter --net=%[4]s --mount=%[5]s %[6]s -r unix:///run/containerd/containerd.sock ps   # alpha-node1's containers (crictl inside the node)
  node logs: %[7]s/logs/<node>/{containerd,kubelet,kube-proxy}.log
  everything above is in /run/aether-demo/demo.env
`, a.Kubeconfig, ns, name, n.Netns.Path, mnt, crictl, m.Substrate.Dir)
	} else {
		fmt.Fprintf(&b, "  logs: %s/logs/<node>/aether-agent.log, %s/logs/<cluster>/aether-registrar.log\n  everything above is in /run/aether-demo/demo.env\n", m.Substrate.Dir, m.Substrate.Dir)
	}
	if sb, _, ok := a.Sandbox(ns, "client"); ok && sb.Netns != nil {
		// The client pod's own namespace: its DNS to kube-dns is DNAT'ed to its node's agent,
		// and its connections are captured by the node's Envoy, as for the demo's requests.
		name := "hello." + ns + ".svc.clusterset.local"
		fmt.Fprintf(&b, `  from alpha's client pod (its DNS goes to the agent, its connections through the mesh):
    nsenter --net=%[1]s dig +short @%[2]s %[3]s
    nsenter --net=%[1]s %[4]s -timeout 3s http "http://$(nsenter --net=%[1]s dig +short @%[2]s %[3]s)/"
`, sb.Netns.Path, a.Plan.DNSIP, name, m.Bins["client"])
	}
	b.WriteString("==> stop and clean up: make demo-down\n")
	return b.String()
}
