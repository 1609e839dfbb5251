package scenarios

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
)

// Names the kind pair relies on: what e2e/kind/up.sh installs (deploy/) and builds
// (e2e/kind/workloads.Dockerfile).
const (
	// kindWorkloadImage holds the test workloads (e2e/workloads) in /usr/local/bin.
	kindWorkloadImage = "aether-e2e-workloads:dev"
	kindWorkloadDir   = "/usr/local/bin/"
	// aetherNamespace, agentDaemonSet, agentContainer and configMap are deploy/'s names.
	aetherNamespace = "aether-system"
	agentDaemonSet  = "aether-agent"
	agentContainer  = "agent"
	// registrarDeployment is deploy/'s registrar Deployment.
	registrarDeployment = "aether-registrar"
	configMap           = "aether-config"
	// defaultTrustDomain is aether-agent's --trust-domain default.
	defaultTrustDomain = "aether.internal"
	// defaultLeaseTTL is aether-agent's --registry-lease-ttl default.
	defaultLeaseTTL = 15 * time.Second
	// cutComment tags the iptables rules CutRegistry inserts on every node.
	cutComment = "aether-e2e-registry-cut"
	// envoyAdminSocket is the node Envoy's admin API, a unix socket in the hostPath directory
	// /var/run/aether the agent DaemonSet shares with the node (the agent's --envoy-admin).
	envoyAdminSocket = "/var/run/aether/envoy-admin.sock"
	// controlPlaneLabel marks kind's control-plane node (not a worker: Nodes leaves it out).
	controlPlaneLabel = "node-role.kubernetes.io/control-plane"
)

// runFunc runs a host command (docker) and returns its combined output.
type runFunc func(ctx context.Context, name string, args ...string) ([]byte, error)

// nodeShell reaches inside the nodes of a pair of real clusters: kind's node containers
// (dockerNodes) or the local substrate's real nodes (their namespaces).
type nodeShell interface {
	// exec runs argv on node (as root, in the node's network and files) and returns its output.
	exec(ctx context.Context, node string, argv ...string) ([]byte, error)
	// kill takes node down at once, as a power cut would: everything on it dies.
	kill(ctx context.Context, node string) error
}

// dockerNodes is the nodeShell of kind's node containers (a node's container is named after it).
type dockerNodes struct{ run runFunc }

func (d dockerNodes) exec(ctx context.Context, node string, argv ...string) ([]byte, error) {
	return d.run(ctx, "docker", append([]string{"exec", node}, argv...)...)
}

func (d dockerNodes) kill(ctx context.Context, node string) error {
	_, err := d.run(ctx, "docker", "kill", node)
	return err
}

func runHost(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("run %s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// kindCluster is one cluster of the kind pair.
type kindCluster struct {
	name        string
	trustDomain string // AETHER_TRUST_DOMAIN, default defaultTrustDomain
	kubeconfig  string
	config      *rest.Config
	kube        kubernetes.Interface
	dyn         dynamic.Interface
	gw          gwclient.Interface
	workers     []string // worker node names (kind node containers), sorted
	all         []string // every node, control plane included, sorted
}

// kindPair is the ClusterPair of two real clusters made by e2e/kind/up.sh: the API servers
// through their kubeconfigs (client-go; pod exec over the API server), node-level disruptions
// through the kind node containers (docker: a kind node's container is named after the node).
type kindPair struct {
	a, b     *kindCluster
	nodes    nodeShell
	leaseTTL time.Duration
	registry string // registry host (IP) the agents dial, from aether-config

	mu  sync.Mutex
	cut []string // nodes cut off the registry
}

// newKindPair connects to both clusters and reads what the scenarios need from them: nodes,
// the agents' lease TTL (from the aether-agent DaemonSet) and the registry address (from the
// aether-config ConfigMap). It returns an error naming the flag or object that is missing.
func newKindPair(kubeconfigA, kubeconfigB string) (ClusterPair, error) {
	if kubeconfigA == "" || kubeconfigB == "" {
		return nil, fmt.Errorf("pair kind: -kubeconfig-a %q and -kubeconfig-b %q: both are required", kubeconfigA, kubeconfigB)
	}
	return openRealPair(kubeconfigA, kubeconfigB, dockerNodes{run: runHost})
}

// openRealPair is the pair of two real clusters running aether as deploy/ installs it, whose
// nodes nodes reaches.
func openRealPair(kubeconfigA, kubeconfigB string, nodes nodeShell) (*kindPair, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := &kindPair{nodes: nodes}
	for i, kc := range []string{kubeconfigA, kubeconfigB} {
		c, err := openKindCluster(ctx, kc)
		if err != nil {
			return nil, fmt.Errorf("pair kind: -kubeconfig-%c: %w", 'a'+i, err)
		}
		if i == 0 {
			p.a = c
		} else {
			p.b = c
		}
	}
	if p.a.name == p.b.name {
		return nil, fmt.Errorf("pair kind: both kubeconfigs name cluster %q (AETHER_CLUSTER in %s/%s)", p.a.name, aetherNamespace, configMap)
	}
	ds, err := p.a.kube.AppsV1().DaemonSets(aetherNamespace).Get(ctx, agentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("pair kind: read the agent DaemonSet: %w", err)
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == agentContainer {
			if p.leaseTTL, err = leaseTTLFromArgs(c.Args); err != nil {
				return nil, fmt.Errorf("pair kind: DaemonSet %s/%s: %w", aetherNamespace, agentDaemonSet, err)
			}
		}
	}
	cm, err := p.a.kube.CoreV1().ConfigMaps(aetherNamespace).Get(ctx, configMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("pair kind: read the aether configuration: %w", err)
	}
	// The Helm chart sets the TTL in the ConfigMap (the agent reads AETHER_* as its flags).
	if v := cm.Data["AETHER_REGISTRY_LEASE_TTL"]; v != "" && !slices.ContainsFunc(ds.Spec.Template.Spec.Containers, func(c corev1.Container) bool {
		return c.Name == agentContainer && slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--registry-lease-ttl") })
	}) {
		if p.leaseTTL, err = time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("pair kind: ConfigMap %s/%s: AETHER_REGISTRY_LEASE_TTL %q: %w", aetherNamespace, configMap, v, err)
		}
	}
	if p.registry, err = registryHost(cm.Data["AETHER_REGISTRY_ENDPOINTS"]); err != nil {
		return nil, fmt.Errorf("pair kind: ConfigMap %s/%s: %w", aetherNamespace, configMap, err)
	}
	return p, nil
}

// openKindCluster builds the clients of one cluster and reads its name (AETHER_CLUSTER, the
// cluster's registry name) and nodes.
func openKindCluster(ctx context.Context, kubeconfig string) (*kindCluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	c := &kindCluster{kubeconfig: kubeconfig, config: cfg}
	if c.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("client of %s: %w", kubeconfig, err)
	}
	if c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("dynamic client of %s: %w", kubeconfig, err)
	}
	if c.gw, err = gwclient.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("gateway API client of %s: %w", kubeconfig, err)
	}
	cm, err := c.kube.CoreV1().ConfigMaps(aetherNamespace).Get(ctx, configMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read %s/%s (run e2e/kind/up.sh first): %w", aetherNamespace, configMap, err)
	}
	if c.name = cm.Data["AETHER_CLUSTER"]; c.name == "" {
		return nil, fmt.Errorf("%s/%s has no AETHER_CLUSTER", aetherNamespace, configMap)
	}
	if c.trustDomain = cm.Data["AETHER_TRUST_DOMAIN"]; c.trustDomain == "" {
		c.trustDomain = defaultTrustDomain
	}
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	c.workers, c.all = workerNodes(nodes.Items)
	if len(c.workers) < 2 {
		return nil, fmt.Errorf("cluster %s has %d worker nodes (%v): the scenarios need 2 (AETHER_KIND_WORKERS)", c.name, len(c.workers), c.workers)
	}
	return c, nil
}

// workerNodes returns the names of the nodes without the control-plane role label and of every
// node, each sorted.
func workerNodes(nodes []corev1.Node) (workers, all []string) {
	for _, n := range nodes {
		all = append(all, n.Name)
		if _, cp := n.Labels[controlPlaneLabel]; !cp {
			workers = append(workers, n.Name)
		}
	}
	slices.Sort(workers)
	slices.Sort(all)
	return workers, all
}

// leaseTTLFromArgs returns the --registry-lease-ttl in an aether-agent command line
// ("--registry-lease-ttl=5s" or "--registry-lease-ttl 5s"), else the agent's default.
func leaseTTLFromArgs(args []string) (time.Duration, error) {
	for i, a := range args {
		var v string
		switch {
		case strings.HasPrefix(a, "--registry-lease-ttl="):
			v = strings.TrimPrefix(a, "--registry-lease-ttl=")
		case a == "--registry-lease-ttl" && i+1 < len(args):
			v = args[i+1]
		default:
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("--registry-lease-ttl %q: want a positive duration", v)
		}
		return d, nil
	}
	return defaultLeaseTTL, nil
}

// registryHost returns the host of the first registry URL in a comma-separated
// AETHER_REGISTRY_ENDPOINTS value ("http://172.18.0.9:2379" -> "172.18.0.9").
func registryHost(endpoints string) (string, error) {
	first, _, _ := strings.Cut(endpoints, ",")
	u, err := url.Parse(strings.TrimSpace(first))
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("AETHER_REGISTRY_ENDPOINTS %q: want http(s)://host:port", endpoints)
	}
	return u.Hostname(), nil
}

// cutRules are the iptables rules (chain, then the rule spec after -I/-D chain) that cut a node's
// own traffic with the registry, both ways as a partition does: its packets to the registry
// (OUTPUT) and the registry's packets to it (INPUT; dropping only the first leaves an open watch
// stream delivering the registry's changes, whose data arrives although its acknowledgements are
// lost). The agent runs with host network, so its traffic passes those chains, while pods (the
// registrar) go through FORWARD and keep their access, as on the local substrate.
func cutRules(registry string) [][]string {
	return [][]string{
		{"OUTPUT", "-p", "tcp", "-d", registry, "--dport", "2379", "-m", "comment", "--comment", cutComment, "-j", "DROP"},
		{"INPUT", "-p", "tcp", "-s", registry, "--sport", "2379", "-m", "comment", "--comment", cutComment, "-j", "DROP"},
	}
}

func (p *kindPair) cluster(name string) *kindCluster {
	if name == p.a.name {
		return p.a
	}
	if name == p.b.name {
		return p.b
	}
	panic(fmt.Sprintf("pair kind: no cluster %q (have %s, %s)", name, p.a.name, p.b.name))
}

func (p *kindPair) Clusters() (string, string) { return p.a.name, p.b.name }

func (p *kindPair) Kube(cluster string) kubernetes.Interface { return p.cluster(cluster).kube }

func (p *kindPair) Dynamic(cluster string) dynamic.Interface { return p.cluster(cluster).dyn }

func (p *kindPair) Gateway(cluster string) gwclient.Interface { return p.cluster(cluster).gw }

func (p *kindPair) Nodes(cluster string) []string { return slices.Clone(p.cluster(cluster).workers) }

func (p *kindPair) Command(workload string) (string, string) {
	return kindWorkloadDir + workload, kindWorkloadImage
}

// execIn runs argv in a container of pod (container "": the pod's first) over the API server
// (exec subresource; WebSocket, falling back to SPDY), with stdin when not nil.
func execIn(ctx context.Context, c *kindCluster, ns, pod, container string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if container == "" {
		po, err := c.kube.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		container = po.Spec.Containers[0].Name
	}
	opts := &corev1.PodExecOptions{Container: container, Command: argv, Stdin: stdin != nil, Stdout: true, Stderr: true}
	req := c.kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(opts, scheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(c.config, "POST", req.URL())
	if err != nil {
		return err
	}
	ws, err := remotecommand.NewWebSocketExecutor(c.config, "GET", req.URL().String())
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, httpstream.IsUpgradeFailure)
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// Exec runs argv like kubectl exec; argv[0] may name a workload ("client"), found on the
// image's PATH.
func (p *kindPair) Exec(ctx context.Context, cluster, ns, pod string, argv ...string) ([]byte, error) {
	var out, errb bytes.Buffer
	if err := execIn(ctx, p.cluster(cluster), ns, pod, "", argv, nil, &out, &errb); err != nil {
		return out.Bytes(), fmt.Errorf("exec %q in %s/%s (%s): %w: %s", argv, ns, pod, cluster, err, bytes.TrimSpace(errb.Bytes()))
	}
	return out.Bytes(), nil
}

// execConn is one end of a net.Pipe whose other end is the stdin and stdout of "client relay"
// running in the pod; Close also ends the exec stream.
type execConn struct {
	net.Conn
	cancel context.CancelFunc
}

func (c *execConn) Close() error {
	err := c.Conn.Close()
	c.cancel()
	return err
}

// Dial runs "client relay addr" in the pod (its connection leaves from the pod's network
// namespace, so capture applies) and returns a connection to its stdin and stdout; it lives
// until Close, independently of ctx.
func (p *kindPair) Dial(ctx context.Context, cluster, ns, pod, addr string) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dial %s from %s/%s: %w", addr, ns, pod, err)
	}
	local, remote := net.Pipe()
	sctx, cancel := context.WithCancel(context.Background())
	go func() {
		_ = execIn(sctx, p.cluster(cluster), ns, pod, "", []string{"client", "relay", addr}, remote, remote, io.Discard)
		remote.Close()
	}()
	return &execConn{Conn: local, cancel: cancel}, nil
}

// RestartAgent sends SIGTERM to the agent container's process (the kubelet restarts the
// container; the Envoy container of the same pod keeps running) and waits until the restarted
// agent is ready.
func (p *kindPair) RestartAgent(ctx context.Context, cluster, node string) error {
	return p.restartAgent(ctx, cluster, node, true)
}

// restartAgent stops the agent container on node (TERM) and returns once the kubelet has started
// it again and, with ready, once it is ready.
func (p *kindPair) restartAgent(ctx context.Context, cluster, node string, ready bool) error {
	c := p.cluster(cluster)
	pod, err := agentPod(ctx, c.kube, node)
	if err != nil {
		return fmt.Errorf("restart agent on %s: %w", node, err)
	}
	before := restarts(pod, agentContainer)
	// Separate buffers: client-go copies stdout and stderr concurrently.
	var out, errb bytes.Buffer
	// The stream may end with an error when the container exits under it: the restart count
	// below is what tells.
	_ = execIn(ctx, c, aetherNamespace, pod.Name, agentContainer, []string{"sh", "-c", "kill -TERM 1"}, nil, &out, &errb)
	for {
		pod, err = c.kube.CoreV1().Pods(aetherNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && restarts(pod, agentContainer) > before && containerRunning(pod, agentContainer) && (!ready || containerReady(pod, agentContainer)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restart agent on %s: not restarted (ready %v) (%s%s): %w", node, ready, bytes.TrimSpace(out.Bytes()), bytes.TrimSpace(errb.Bytes()), ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// agentKiller restarts a node's agent without waiting for it to be ready (it may not be: the
// registry may be cut off).
type agentKiller interface {
	// KillAgent stops the agent container on node (TERM) and returns once the kubelet has
	// started it again; its Envoy keeps running.
	KillAgent(ctx context.Context, cluster, node string) error
}

// KillAgent implements agentKiller.
func (p *kindPair) KillAgent(ctx context.Context, cluster, node string) error {
	return p.restartAgent(ctx, cluster, node, false)
}

// containerRunning reports whether pod's container is in state running.
func containerRunning(pod *corev1.Pod, container string) bool {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			return s.State.Running != nil
		}
	}
	return false
}

// agentPod returns the aether-agent pod on node.
func agentPod(ctx context.Context, kube kubernetes.Interface, node string) (*corev1.Pod, error) {
	pods, err := kube.CoreV1().Pods(aetherNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=" + agentDaemonSet, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no %s pod on node %s", agentDaemonSet, node)
}

func restarts(pod *corev1.Pod, container string) int32 {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			return s.RestartCount
		}
	}
	return 0
}

func containerReady(pod *corev1.Pod, container string) bool {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			return s.Ready
		}
	}
	return false
}

// StopNode kills the node's kind container (agent, Envoy and pods die with it; the agent's
// registry lease then expires) and deletes its Node object.
func (p *kindPair) StopNode(ctx context.Context, cluster, node string) error {
	c := p.cluster(cluster)
	if err := p.nodes.kill(ctx, node); err != nil {
		return fmt.Errorf("stop node %s: %w", node, err)
	}
	if err := c.kube.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("stop node %s: delete Node: %w", node, err)
	}
	for _, l := range []*[]string{&c.workers, &c.all} {
		*l = slices.DeleteFunc(*l, func(n string) bool { return n == node })
	}
	return nil
}

// CutRegistry inserts, on every node of the given clusters (both when none is given), iptables
// rules dropping the node's own traffic with the registry both ways (cutRules); open connections
// hang as in a network partition.
func (p *kindPair) CutRegistry(ctx context.Context, clusters ...string) error {
	cs := []*kindCluster{p.a, p.b}
	if len(clusters) > 0 {
		cs = nil
		for _, name := range clusters {
			cs = append(cs, p.cluster(name))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		for _, n := range c.all {
			for _, r := range cutRules(p.registry) {
				args := append([]string{"iptables", "-I"}, r...)
				if _, err := p.nodes.exec(ctx, n, args...); err != nil {
					return fmt.Errorf("cut registry: %w", err)
				}
			}
			p.cut = append(p.cut, n)
		}
	}
	return nil
}

// RestoreRegistry deletes the rules CutRegistry inserted (every copy of them).
func (p *kindPair) RestoreRegistry(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, n := range p.cut {
		for _, r := range cutRules(p.registry) {
			args := append([]string{"iptables", "-D"}, r...)
			if _, err := p.nodes.exec(ctx, n, args...); err != nil {
				errs = append(errs, err)
			}
		}
	}
	p.cut = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("restore registry: %w", err)
	}
	return nil
}

// EnvoyAdmin runs curl in the node's kind container (the kind node image has it) against the
// Envoy admin socket the agent DaemonSet puts in the node's /var/run/aether; --fail makes a
// status other than 200 an error.
func (p *kindPair) EnvoyAdmin(ctx context.Context, cluster, node, path string) (string, error) {
	p.cluster(cluster) // panics on a cluster that is not in the pair, as every method does
	out, err := p.nodes.exec(ctx, node, "curl", "-sS", "--fail", "--max-time", "10",
		"--unix-socket", envoyAdminSocket, "http://envoy"+path)
	if err != nil {
		return "", fmt.Errorf("get %s's Envoy admin %s: %w", node, path, err)
	}
	return string(out), nil
}

func (p *kindPair) TrustDomain(cluster string) string { return p.cluster(cluster).trustDomain }

func (p *kindPair) LeaseTTL() int { return int((p.leaseTTL + time.Second - 1) / time.Second) }

// Debug lists the kubeconfigs and the last lines of every agent's log.
func (p *kindPair) Debug() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	tail := int64(60)
	for _, c := range []*kindCluster{p.a, p.b} {
		fmt.Fprintf(&b, "cluster %s: kubeconfig %s (kubectl --kubeconfig %s -n %s logs ds/%s -c %s)\n",
			c.name, c.kubeconfig, c.kubeconfig, aetherNamespace, agentDaemonSet, agentContainer)
		pods, err := c.kube.CoreV1().Pods(aetherNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + agentDaemonSet})
		if err != nil {
			fmt.Fprintf(&b, "  list agent pods: %v\n", err)
			continue
		}
		for _, pod := range pods.Items {
			data, err := c.kube.CoreV1().Pods(aetherNamespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: agentContainer, TailLines: &tail}).DoRaw(ctx)
			if err != nil {
				data = []byte(err.Error())
			}
			fmt.Fprintf(&b, "--- agent %s on %s, tail:\n%s\n", pod.Name, pod.Spec.NodeName, data)
		}
	}
	return b.String()
}
