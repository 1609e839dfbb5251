package scenarios

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/aethermesh/aether/e2e/mesh"
	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/internal/testenv"
)

// ns is the meshed namespace of the scenarios, in both clusters; plainNS is a namespace of
// cluster A outside the mesh; frontNS is a second meshed namespace of cluster A (the GAMMA
// consumer-route scenarios' callers).
const (
	ns      = "shop"
	plainNS = "plain"
	frontNS = "front"
)

// TestScenarios runs the scenario suite on the pair chosen by -pair: by default the local
// substrate three times (the kubelet stand-in with distinct pod CIDRs and SPIRE federation, a
// trust domain per cluster: every scenario; with identical pod CIDRs and one trust domain under
// a shared SPIRE upstream authority: the cross-cluster ones; real nodes with aether and SPIRE
// installed by the Helm chart, federated as the chart's spire.clusterset.mode federation does
// it: every scenario, through the same code as on kind), which needs root.
func TestScenarios(t *testing.T) {
	switch *pairFlag {
	case "kind":
		p, err := newKindPair(*kubeconfigAFlag, *kubeconfigBFlag)
		if err != nil {
			t.Fatal(err)
		}
		runScenarios(t, p, true)
	case "local":
		testenv.RequireRoot(t)
		t.Run("distinct-pod-cidrs", func(t *testing.T) { runScenarios(t, startLocal(t, false, mesh.IdentitySPIREFederated), true) })
		t.Run("identical-pod-cidrs", func(t *testing.T) { runScenarios(t, startLocal(t, true, mesh.IdentitySPIREShared), false) })
		t.Run("real-nodes", func(t *testing.T) { runScenarios(t, startNodes(t, false, mesh.IdentitySPIREFederated), true) })
	default:
		t.Fatalf("-pair %q: want local or kind", *pairFlag)
	}
}

// startLocal starts a mesh on the local substrate with identity, stopped when t ends.
func startLocal(t *testing.T, identical bool, identity mesh.Identity) ClusterPair {
	m := startMesh(t, mesh.Options{IdenticalPodCIDRs: identical, Identity: identity})
	checkRegistryAuth(t, m)
	return &localPair{m: m}
}

// startNodes starts a mesh on the local substrate's real nodes, aether installed from the Helm
// chart with identity, and returns it as the same pair the kind clusters are (the scenarios
// reach it through its API servers and kubectl-like exec only), plus the node lifecycle;
// stopped when t ends.
func startNodes(t *testing.T, identical bool, identity mesh.Identity) ClusterPair {
	m := startMesh(t, mesh.Options{IdenticalPodCIDRs: identical, RealNodes: true, Identity: identity})
	p, err := openRealPair(m.Clusters[0].Kubeconfig, m.Clusters[1].Kubeconfig, substrateNodes{m.Substrate})
	if err != nil {
		t.Fatal(err)
	}
	return &nodesPair{kindPair: p, m: m}
}

// startMesh starts a mesh with opts (the shared binaries, warnings logged) and stops it when t
// ends (after -hold on failure).
func startMesh(t *testing.T, opts mesh.Options) *mesh.Mesh {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	opts.BinDir = sharedBins(t)
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := mesh.StartMesh(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mesh up in %s (substrate %s, real nodes %v, identity %s)", time.Since(start).Round(time.Millisecond), m.StartupTime.Round(time.Millisecond), opts.RealNodes, m.Identity)
	t.Cleanup(func() {
		if t.Failed() && *holdFlag > 0 {
			t.Logf("holding the failed pair for %s: substrate %s, mesh %s", *holdFlag, m.Substrate.Dir, m.Dir)
			time.Sleep(*holdFlag)
		}
		m.Stop()
	})
	return m
}

var bins struct {
	dir string
	err error
}

// sharedBins builds the binaries once per test binary run.
func sharedBins(t *testing.T) string {
	t.Helper()
	if bins.dir == "" && bins.err == nil {
		dir, err := os.MkdirTemp("", "aemesh-bin-")
		if err == nil {
			_, err = mesh.Build(context.Background(), dir)
		}
		bins.dir, bins.err = dir, err
	}
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// reply is the echo workload's answer (e2e/workloads/echo).
type reply struct {
	Server    string `json:"server"`
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	Protocol  string `json:"protocol"`
	Peer      string `json:"peer"`
	XFCC      string `json:"xfcc"`
	CallerID  string `json:"callerID"`
	Message   string `json:"message"`
}

// world is the deployed sample: in A an echo service on both nodes and a client on node 1; in
// B an exported echo service on both nodes and an unexported one.
type world struct {
	p          ClusterPair
	a, b       string
	nodesA     []string
	nodesB     []string
	clientNode string
}

// id is the SPIFFE ID of ServiceAccount podNS/sa of cluster: in the cluster's trust domain.
func (w *world) id(cluster, podNS, sa string) string {
	return "spiffe://" + w.p.TrustDomain(cluster) + "/ns/" + podNS + "/sa/" + sa
}

// w.callerID() is the SPIFFE ID of A's client pod (default ServiceAccount in ns), the caller of
// get and tcp.
func (w *world) callerID() string { return w.id(w.a, ns, "default") }

func echoService(name, app string) *corev1.Service {
	tcp := "tcp"
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": app},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(substrate.EchoHTTPPort), Protocol: corev1.ProtocolTCP},
				{Name: "tcp", Port: substrate.EchoTCPPort, TargetPort: intstr.FromInt32(substrate.EchoTCPPort), Protocol: corev1.ProtocolTCP, AppProtocol: &tcp},
			},
		},
	}
}

func deploy(t *testing.T, p ClusterPair) *world {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w := &world{p: p}
	w.a, w.b = p.Clusters()
	w.nodesA, w.nodesB = p.Nodes(w.a), p.Nodes(w.b)
	w.clientNode = w.nodesA[0]
	echoCmd, echoImg := p.Command("echo")
	clientCmd, clientImg := p.Command("client")
	type podSpec struct {
		cluster string
		pod     *corev1.Pod
	}
	var pods []podSpec
	mkEcho := func(cluster, name, app, node string) {
		pod := substrate.EchoPod(ns, name, node, cluster, echoCmd)
		pod.Labels["app"] = app
		pod.Spec.Containers[0].Image = echoImg
		pods = append(pods, podSpec{cluster, pod})
	}
	for i, n := range w.nodesA {
		mkEcho(w.a, fmt.Sprintf("echo-%d", i+1), "echo", n)
	}
	pods[0].pod.Labels["headless"] = "yes" // echo-1 backs the headless Service too
	for i, n := range w.nodesB {
		mkEcho(w.b, fmt.Sprintf("remote-%d", i+1), "remote", n)
	}
	mkEcho(w.b, "hidden-1", "hidden", w.nodesB[0])
	// A meshed pod beside the client, in no Service: plaintext-to-app-port-refused dials it by
	// pod IP on the same node's bridge (the same-node bypass of docs/security.md).
	mkEcho(w.a, "neighbour-1", "neighbour", w.clientNode)
	client := substrate.ClientPod(ns, "client", w.clientNode, w.a, clientCmd)
	client.Spec.Containers[0].Image = clientImg
	pods = append(pods, podSpec{w.a, client})
	// A pod outside the mesh beside the client (namespace plainNS is not opted in): the
	// cross-node bypass matrix dials from it.
	plain := substrate.ClientPod(plainNS, "plain-client", w.clientNode, w.a, clientCmd)
	plain.Spec.Containers[0].Image = clientImg
	pods = append(pods, podSpec{w.a, plain})
	// The GAMMA scenarios' fixtures (gamma_linux_test.go). In B: two versions of the exported
	// service canary, canary-v1 on node 1 and canary-v2 on node 2 (Services canary, canary-v1,
	// canary-v2), and a client on node 1. In A: a client in the second meshed namespace frontNS
	// beside the first client, a backend alt-1 (Service alt) on node 2, and Service hop over the
	// echo pods.
	for i, v := range []string{"v1", "v2"} {
		mkEcho(w.b, "canary-"+v, "canary", w.nodesB[i])
		pods[len(pods)-1].pod.Labels["version"] = v
	}
	mkEcho(w.a, "alt-1", "alt", w.nodesA[1])
	for _, c := range []struct{ cluster, ns, node string }{{w.b, ns, w.nodesB[0]}, {w.a, frontNS, w.clientNode}} {
		pod := substrate.ClientPod(c.ns, "client", c.node, c.cluster, clientCmd)
		pod.Spec.Containers[0].Image = clientImg
		pods = append(pods, podSpec{c.cluster, pod})
	}

	// The authorization scenario's fixtures (authz_linux_test.go): in B, Service guardedSvc
	// (exported) over the echo pod guardedPod on node 2; in A, pod authzPod beside the client,
	// running as ServiceAccount authzSA (created below, with the namespaces).
	mkEcho(w.b, guardedPod, guardedSvc, w.nodesB[1])
	authzClient := substrate.ClientPod(ns, authzPod, w.clientNode, w.a, clientCmd)
	authzClient.Spec.Containers[0].Image = clientImg
	authzClient.Spec.ServiceAccountName = authzSA
	pods = append(pods, podSpec{w.a, authzClient})

	if _, err := p.Kube(w.a).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: plainNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "default ServiceAccount in "+plainNS, func() error {
		_, err := p.Kube(w.a).CoreV1().ServiceAccounts(plainNS).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	for _, m := range []struct{ cluster, ns string }{{w.a, ns}, {w.b, ns}, {w.a, frontNS}} {
		if _, err := p.Kube(m.cluster).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: m.ns, Labels: map[string]string{"aether.io/mesh": "enabled"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, "default ServiceAccount in "+m.ns+" in "+m.cluster, func() error {
			_, err := p.Kube(m.cluster).CoreV1().ServiceAccounts(m.ns).Get(ctx, "default", metav1.GetOptions{})
			return err
		})
	}
	if _, err := p.Kube(w.a).CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: authzSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A headless Service of echo-1 only: echo-2's pod IP stays an address no headless Service
	// names, which plaintext-to-app-port-refused needs (a meshed client's connection to it is
	// passed through in plaintext).
	headless := echoService("echo-pods", "echo")
	headless.Spec.Selector["headless"] = "yes"
	headless.Spec.ClusterIP = corev1.ClusterIPNone
	canaryV1, canaryV2 := echoService("canary-v1", "canary"), echoService("canary-v2", "canary")
	canaryV1.Spec.Selector["version"], canaryV2.Spec.Selector["version"] = "v1", "v2"
	canary := echoService("canary", "canary")
	// A UDP port for mesh-udproute (udproute_linux_test.go).
	for _, s := range []*corev1.Service{canary, canaryV1, canaryV2} {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "udp", Port: udpCanaryPort,
			TargetPort: intstr.FromInt32(substrate.EchoUDPPort), Protocol: corev1.ProtocolUDP})
	}
	for _, s := range []struct {
		c   string
		svc *corev1.Service
	}{{w.a, echoService("echo", "echo")}, {w.a, headless}, {w.b, echoService("remote", "remote")}, {w.b, echoService("hidden", "hidden")},
		{w.b, canary}, {w.b, canaryV1}, {w.b, canaryV2}, {w.a, echoService("alt", "alt")}, {w.a, echoService("hop", "echo")},
		{w.b, echoService(guardedSvc, guardedSvc)}} {
		if _, err := p.Kube(s.c).CoreV1().Services(ns).Create(ctx, s.svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ps := range pods {
		if _, err := p.Kube(ps.cluster).CoreV1().Pods(ps.pod.Namespace).Create(ctx, ps.pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Export "remote", "canary" and guardedSvc from B (MCS ServiceExport).
	for _, name := range []string{"remote", "canary", guardedSvc} {
		export := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
			"metadata": map[string]any{"name": name, "namespace": ns}}}
		if _, err := p.Dynamic(w.b).Resource(serviceExports).Namespace(ns).Create(ctx, export, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ps := range pods {
		testenv.Eventually(t, 2*time.Minute, "pod "+ps.pod.Name+" ready", func() error {
			pod, err := p.Kube(ps.cluster).CoreV1().Pods(ps.pod.Namespace).Get(ctx, ps.pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if (ps.pod.Name == "client" || ps.pod.Name == "plain-client" || ps.pod.Name == authzPod) && pod.Status.Phase == corev1.PodRunning {
				return nil
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("phase %s", pod.Status.Phase)
		})
	}
	return w
}

var (
	serviceExports = schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1beta1", Resource: "serviceexports"}
	serviceImports = schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1beta1", Resource: "serviceimports"}
)

// get runs "client http URL" in the client pod and decodes the echo's reply.
func (w *world) get(ctx context.Context, url string) (reply, error) {
	return w.clientReply(ctx, w.a, "http", url)
}

func (w *world) tcp(ctx context.Context, addr, msg string) (reply, error) {
	return w.clientReply(ctx, w.a, "tcp", addr, msg)
}

// clientReply runs the client workload with args (a 3 s timeout) in the client pod of ns in
// cluster and decodes the echo's reply it prints.
func (w *world) clientReply(ctx context.Context, cluster string, args ...string) (reply, error) {
	var r reply
	out, err := w.p.Exec(ctx, cluster, ns, "client", append([]string{"client", "-timeout", "3s"}, args...)...)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("decode %q: %w", out, err)
	}
	return r, nil
}

// wantHTTP waits until GET url from the client answers from cluster with the client's identity.
func (w *world) wantHTTP(t *testing.T, url, cluster string) reply {
	t.Helper()
	var got reply
	testenv.Eventually(t, 90*time.Second, "GET "+url, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := w.get(ctx, url)
		if err != nil {
			return err
		}
		if r.Cluster != cluster || r.CallerID != w.callerID() {
			return fmt.Errorf("answered by %s in %s seeing caller %q (xfcc %q); want cluster %s, caller %s", r.Server, r.Cluster, r.CallerID, r.XFCC, cluster, w.callerID())
		}
		got = r
		return nil
	})
	return got
}

func (w *world) wantTCP(t *testing.T, addr, cluster string) reply {
	t.Helper()
	var got reply
	testenv.Eventually(t, 90*time.Second, "TCP "+addr, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := w.tcp(ctx, addr, "hello")
		if err != nil {
			return err
		}
		if r.Cluster != cluster || r.Message != "hello" {
			return fmt.Errorf("answer %+v; want cluster %s, message hello", r, cluster)
		}
		// Through the mesh the application's peer is the destination pod's inbound listener,
		// which reaches it from the pod's loopback after terminating mTLS; a connection that
		// bypassed the mesh would come from the caller's address.
		if host, _, err := net.SplitHostPort(r.Peer); err != nil || host != "127.0.0.1" {
			return fmt.Errorf("answer %+v: peer %q, want 127.0.0.1 (the destination pod's inbound mTLS listener)", r, r.Peer)
		}
		got = r
		return nil
	})
	return got
}

func (w *world) clusterIP(t *testing.T, cluster, svc string) string {
	t.Helper()
	s, err := w.p.Kube(cluster).CoreV1().Services(ns).Get(context.Background(), svc, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Spec.ClusterIP
}

// runScenarios deploys the sample and runs every scenario in order; all=false runs only the
// cross-cluster ones (the identical-pod-CIDR pair).
func runScenarios(t *testing.T, p ClusterPair, all bool) {
	w := deploy(t, p)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(p.Debug())
		}
	})
	run := func(name string, f func(t *testing.T)) {
		start, ran := time.Now(), false
		ok := t.Run(name, func(t *testing.T) { ran = true; f(t) })
		if ran { // a -run pattern that leaves the scenario out passes it without running it
			t.Logf("scenario %s: passed=%v in %s", name, ok, time.Since(start).Round(time.Millisecond))
		}
	}
	if all {
		run("intra-cluster-http-by-name", func(t *testing.T) { w.wantHTTP(t, "http://echo."+ns+".mesh/", w.a) })
		run("intra-cluster-http-by-vip", func(t *testing.T) { w.wantHTTP(t, "http://"+w.clusterIP(t, w.a, "echo")+"/", w.a) })
		run("intra-cluster-tcp-by-name", func(t *testing.T) { w.wantTCP(t, fmt.Sprintf("echo.%s.mesh:%d", ns, substrate.EchoTCPPort), w.a) })
		run("intra-cluster-tcp-by-vip", func(t *testing.T) {
			w.wantTCP(t, fmt.Sprintf("%s:%d", w.clusterIP(t, w.a, "echo"), substrate.EchoTCPPort), w.a)
		})
	}
	if all {
		run("headless-by-mesh-name", func(t *testing.T) { w.headless(t) })
	}
	var vip string
	run("mcs-import-and-dns", func(t *testing.T) { vip = w.mcsImport(t) })
	run("mcs-clusterset-vip", func(t *testing.T) {
		if vip == "" {
			t.Fatal("no clusterset VIP (mcs-import-and-dns failed)")
		}
		r := w.wantHTTP(t, "http://"+vip+"/", w.b)
		t.Logf("A -> B by clusterset VIP %s: answered by %s in %s, caller %s", vip, r.Server, r.Cluster, r.CallerID)
	})
	run("cross-cluster-http-through-waypoint", func(t *testing.T) {
		w.wantHTTP(t, "http://remote."+ns+".svc.clusterset.local/", w.b)
	})
	run("cross-cluster-tcp-through-waypoint", func(t *testing.T) {
		w.wantTCP(t, fmt.Sprintf("remote.%s.svc.clusterset.local:%d", ns, substrate.EchoTCPPort), w.b)
	})
	run("gamma-serviceimport-backend", func(t *testing.T) { w.gammaImportBackend(t) })
	if lp, ok := p.(*localPair); ok && lp.m.Identity != mesh.IdentityDevCA {
		// The SPIRE meshes: the bundles and SVIDs each node's Envoy got from SPIRE, and no CA
		// key where an aether pod, a Secret or a node could read it (identity_linux_test.go).
		run("spire-trust-bundles", func(t *testing.T) { w.spireTrustBundles(t, lp.m) })
		run("no-ca-private-key", func(t *testing.T) { w.noCAPrivateKey(t, lp.m) })
	}
	// Identity-based authorization (issue #32): also with identical pod CIDRs, where a caller's
	// address says nothing about who it is and only its certificate can.
	run("authz-two-clusters", func(t *testing.T) { w.authzTwoClusters(t) })
	if !all {
		return
	}
	run("gamma-producer-canary", func(t *testing.T) { w.gammaProducerCanary(t) })
	run("gamma-consumer-route", func(t *testing.T) { w.gammaConsumerRoute(t) })
	run("gamma-route-delete-keeps-connections", func(t *testing.T) { w.gammaRouteDelete(t) })
	run("unexported-service-invisible", func(t *testing.T) { w.unexported(t) })
	run("mcs-port-conflict", func(t *testing.T) { w.mcsPortConflict(t) })
	run("plaintext-to-app-port-refused", func(t *testing.T) { w.plaintextRefused(t) })
	run("cross-node-bypass-matrix", func(t *testing.T) { w.crossNodeMatrix(t) })
	if _, ok := p.(nodeLifecycle); ok {
		// Edge Gateways need Deployments and kube-proxy: real nodes only. Before the agent
		// restart and the registry cut: right after a registry outage the agents hold endpoint
		// deletions back for twice the lease TTL (docs/agent.md, "Registry outages"), which the
		// failover's 5 s bound does not allow for.
		// kube-proxy, for the Service after the route is gone: real nodes only.
		run("mesh-udproute", func(t *testing.T) { w.meshUDPRoute(t) })
		var gwAddr string
		run("edge-gateway-to-remote-through-waypoint", func(t *testing.T) {
			gwAddr = w.edgeGatewaySetup(t)
			w.edgeToRemote(t, gwAddr)
		})
		run("edge-gateway-route-not-allowed", func(t *testing.T) {
			if gwAddr == "" {
				t.Fatal("no Gateway address (edge-gateway-to-remote-through-waypoint failed)")
			}
			w.edgeRouteNotAllowed(t, gwAddr)
		})
		run("edge-gateway-failover-to-remote", func(t *testing.T) {
			if gwAddr == "" {
				t.Fatal("no Gateway address (edge-gateway-to-remote-through-waypoint failed)")
			}
			w.edgeFailover(t, gwAddr)
		})
		// Config projections (projection_linux_test.go): a Helm upgrade sets controlCluster.
		run("config-projections", func(t *testing.T) { w.configProjections(t, p.(nodeLifecycle)) })
	}
	run("agent-restart-keeps-connections", func(t *testing.T) { w.agentRestart(t) })
	run("registry-cut-keeps-serving", func(t *testing.T) { w.registryCut(t) })
	if nl, ok := p.(nodeLifecycle); ok {
		run("agent-upgrade-under-traffic", func(t *testing.T) { w.agentUpgrade(t, nl) })
		run("node-reboot-pods-captured", func(t *testing.T) { w.nodeReboot(t, nl) })
	}
	run("destination-node-removed", func(t *testing.T) { w.nodeRemoved(t) })
}

// mcsImport: B's exported service gets a ServiceImport and a clusterset VIP in A, and
// remote.<ns>.svc.clusterset.local resolves to that VIP in A's pods. It returns the VIP.
func (w *world) mcsImport(t *testing.T) string {
	var vip string
	testenv.Eventually(t, 90*time.Second, "ServiceImport and remote-clusterset Service in "+w.a, func() error {
		if _, err := w.p.Dynamic(w.a).Resource(serviceImports).Namespace(ns).Get(context.Background(), "remote", metav1.GetOptions{}); err != nil {
			return err
		}
		s, err := w.p.Kube(w.a).CoreV1().Services(ns).Get(context.Background(), "remote-clusterset", metav1.GetOptions{})
		if err != nil {
			return err
		}
		vip = s.Spec.ClusterIP
		return nil
	})
	testenv.Eventually(t, 60*time.Second, "clusterset name resolves to the VIP "+vip, func() error {
		out, err := w.p.Exec(context.Background(), w.a, ns, "client", "client", "resolve", "remote."+ns+".svc.clusterset.local")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) != vip {
			return fmt.Errorf("resolves to %q", out)
		}
		return nil
	})
	return vip
}

// headless: the mesh name of A's headless Service echo-pods resolves to its ready pod's IP (the
// agent's resolver, as kube-dns answers a headless Service), a request to that name on the
// target port reaches the pod over mTLS with the client's identity, and <pod>.echo-pods.shop.mesh
// resolves to the pod's IP.
func (w *world) headless(t *testing.T) {
	ctx := context.Background()
	pods, err := w.p.Kube(w.a).CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=echo,headless=yes"})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range pods.Items {
		want = append(want, p.Status.PodIP)
	}
	slices.Sort(want)
	name := "echo-pods." + ns + ".mesh"
	testenv.Eventually(t, 60*time.Second, name+" resolves to its pods "+strings.Join(want, ","), func() error {
		out, err := w.p.Exec(ctx, w.a, ns, "client", "client", "resolve", name)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		got := strings.Fields(string(out))
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("resolves to %q", got)
		}
		return nil
	})
	r := w.wantHTTP(t, fmt.Sprintf("http://%s:%d/", name, substrate.EchoHTTPPort), w.a)
	t.Logf("headless %s: answered by %s, caller %s", name, r.Server, r.CallerID)
	// The pod's own name under the Service, as a StatefulSet's clients use it.
	podName := pods.Items[0].Name + "." + name
	out, err := w.p.Exec(ctx, w.a, ns, "client", "client", "resolve", podName)
	if err != nil || strings.TrimSpace(string(out)) != pods.Items[0].Status.PodIP {
		t.Errorf("%s resolves to %q (%v), want %s", podName, out, err, pods.Items[0].Status.PodIP)
	}
}

// unexported: B's "hidden" service (not exported) has no import in A, its clusterset name does
// not resolve, and its mesh name does not reach it.
func (w *world) unexported(t *testing.T) {
	ctx := context.Background()
	if _, err := w.p.Kube(w.a).CoreV1().Services(ns).Get(ctx, "hidden-clusterset", metav1.GetOptions{}); err == nil {
		t.Error("A has a hidden-clusterset Service for B's unexported service")
	}
	if _, err := w.p.Dynamic(w.a).Resource(serviceImports).Namespace(ns).Get(ctx, "hidden", metav1.GetOptions{}); err == nil {
		t.Error("A has a ServiceImport for B's unexported service")
	}
	// The control: the exported service's names resolve from the same pod.
	for _, name := range []string{"remote." + ns + ".svc.clusterset.local", "echo." + ns + ".mesh"} {
		if out, err := w.p.Exec(ctx, w.a, ns, "client", "client", "resolve", name); err != nil {
			t.Errorf("control: %s does not resolve in A: %v %s", name, err, out)
		}
	}
	for _, name := range []string{"hidden." + ns + ".svc.clusterset.local", "hidden." + ns + ".mesh"} {
		if out, err := w.p.Exec(ctx, w.a, ns, "client", "client", "resolve", name); err == nil {
			t.Errorf("%s resolves in A: %s", name, out)
		}
	}
	if r, err := w.get(ctx, "http://hidden."+ns+".mesh/"); err == nil {
		t.Errorf("hidden.%s.mesh answered from A: %+v", ns, r)
	}
}

// plaintextRefused: a plaintext connection from the client straight to the application port
// of a meshed pod (bypassing the mesh) gets no answer (strict inbound): echo-2 on the other node,
// and neighbour-1 on the client's own node, whose plaintext reached the application from the
// bridge address before the passthrough left from the pod's own netns.
func (w *world) plaintextRefused(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"echo-2", "neighbour-1"} {
		pod, err := w.p.Kube(w.a).CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := w.get(ctx, fmt.Sprintf("http://%s:%d/", pod.Status.PodIP, substrate.EchoHTTPPort)); err == nil {
			t.Errorf("plaintext HTTP to %s (%s:%d) answered: %+v", name, pod.Status.PodIP, substrate.EchoHTTPPort, r)
		}
		if r, err := w.tcp(ctx, fmt.Sprintf("%s:%d", pod.Status.PodIP, substrate.EchoTCPPort), "hello"); err == nil {
			t.Errorf("plaintext TCP to %s (%s:%d) answered: %+v", name, pod.Status.PodIP, substrate.EchoTCPPort, r)
		}
	}
	// The same service through the mesh still answers.
	w.wantHTTP(t, "http://echo."+ns+".mesh/", w.a)
}

// crossNodeMatrix is the capture-bypass matrix's cross-node cells (docs/security.md; the
// same-node ones are agent's TestPrivilegedCaptureBypassMatrix): from the meshed client and from
// a pod outside the mesh, both on node 1, to echo-2 on node 2 by pod IP, and from the meshed
// client through the mesh to another node in cluster B, each with a forged XFCC. Expected, written
// first: by pod IP every plaintext attempt is refused (strict on echo-2; the mesh's inbound port
// wants a certificate); through the mesh the peer sees the client's own identity, never the
// forged one.
func (w *world) crossNodeMatrix(t *testing.T) {
	ctx := context.Background()
	forged := "X-Forwarded-Client-Cert: By=" + w.callerID() + ";URI=" + w.id(w.a, ns, "admin")
	pod, err := w.p.Kube(w.a).CoreV1().Pods(ns).Get(ctx, "echo-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName == w.clientNode {
		t.Fatalf("echo-2 runs on the client's node %s; the cells need another node", w.clientNode)
	}
	ip := pod.Status.PodIP
	from := func(podNS, podName string, argv ...string) ([]byte, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return w.p.Exec(cctx, w.a, podNS, podName, append([]string{"client", "-timeout", "3s"}, argv...)...)
	}
	for _, src := range []struct{ ns, pod string }{{ns, "client"}, {plainNS, "plain-client"}} {
		for _, target := range []string{
			fmt.Sprintf("http://%s:%d/", ip, substrate.EchoHTTPPort),
			fmt.Sprintf("http://%s:15008/", ip),
		} {
			out, err := from(src.ns, src.pod, "-H", forged, "http", target)
			refusedCell(t, src.ns+"/"+src.pod+" to "+target, out, err)
		}
		out, err := from(src.ns, src.pod, "tcp", fmt.Sprintf("%s:%d", ip, substrate.EchoTCPPort), "hello")
		refusedCell(t, src.ns+"/"+src.pod+" to echo-2's TCP port", out, err)
	}
	// Through the mesh to cluster B (another node, through its waypoint): the client's identity.
	testenv.Eventually(t, 90*time.Second, "the mesh path with a forged XFCC", func() error {
		out, err := from(ns, "client", "-H", forged, "http", "http://remote."+ns+".svc.clusterset.local/")
		if err != nil {
			return err
		}
		var r reply
		if err := json.Unmarshal(out, &r); err != nil {
			return fmt.Errorf("decode %q: %w", out, err)
		}
		if r.CallerID != w.callerID() || strings.Contains(r.XFCC, "sa/admin") {
			return fmt.Errorf("%s saw caller %q, XFCC %q: want %s and no forged identity", r.Server, r.CallerID, r.XFCC, w.callerID())
		}
		return nil
	})
}

// refusedCell fails unless a client run ended because the connection was refused or reset (not
// because the client could not run, which would prove nothing).
func refusedCell(t *testing.T, what string, out []byte, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: answered in plaintext: %s", what, out)
		return
	}
	msg := err.Error()
	if !strings.Contains(msg, "connection refused") && !strings.Contains(msg, "connection reset") && !strings.Contains(msg, "EOF") &&
		!strings.Contains(msg, "server closed idle connection") {
		t.Errorf("%s: %v, want the connection refused or reset", what, err)
	}
	t.Logf("%s: %v", what, strings.TrimSpace(msg))
}

// agentRestart: a TCP connection through the client node's Envoy stays up while that node's
// agent restarts, and new connections work after (pods repaired, Envoy adopted).
func (w *world) agentRestart(t *testing.T) {
	ctx := context.Background()
	conn, err := w.p.Dial(ctx, w.a, ns, "client", fmt.Sprintf("%s:%d", w.clusterIP(t, w.a, "echo"), substrate.EchoTCPPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	roundTrip := func(msg string) error {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintln(conn, msg); err != nil {
			return err
		}
		line, err := rd.ReadString('\n')
		if err != nil {
			return err
		}
		var r reply
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Message != msg {
			return fmt.Errorf("answer %q (%v)", line, err)
		}
		return nil
	}
	if err := roundTrip("before"); err != nil {
		t.Fatalf("established connection before the restart: %v", err)
	}
	for _, n := range []string{w.clientNode} {
		if err := w.p.RestartAgent(ctx, w.a, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := roundTrip("after"); err != nil {
		t.Fatalf("established connection after the agent restart: %v", err)
	}
	w.wantHTTP(t, "http://echo."+ns+".mesh/", w.a)
	w.wantHTTP(t, "http://remote."+ns+".svc.clusterset.local/", w.b)
	if err := roundTrip("later"); err != nil {
		t.Fatalf("established connection after new requests: %v", err)
	}
}

// registryCut: with every node cut off the registry for longer than the endpoint lease, the
// last-known endpoints keep serving, intra- and cross-cluster, through the whole cut and through
// the re-registrations after it. (The registry expires every node's lease during the cut; the
// agents hold those deletions, see agent registryView.) Every request must answer.
func (w *world) registryCut(t *testing.T) {
	ctx := context.Background()
	if err := w.p.CutRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	restored := false
	defer func() {
		if !restored {
			_ = w.p.RestoreRegistry(ctx)
		}
	}()
	ttl := time.Duration(w.p.LeaseTTL()) * time.Second
	urls := []struct{ url, cluster string }{{"http://echo." + ns + ".mesh/", w.a}, {"http://remote." + ns + ".svc.clusterset.local/", w.b}}
	// callFor calls both services until d has passed; every call must answer from the right
	// cluster with the caller's identity.
	callFor := func(phase string, d time.Duration) {
		start := time.Now()
		for n := 0; n == 0 || time.Since(start) < d; n++ {
			for _, c := range urls {
				r, err := w.get(ctx, c.url)
				if err != nil || r.Cluster != c.cluster || r.CallerID != w.callerID() {
					t.Errorf("%s, %s in: GET %s = %+v, %v", phase, time.Since(start).Round(time.Millisecond), c.url, r, err)
				}
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	callFor("registry cut", 2*ttl+time.Second)
	if err := w.p.RestoreRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	restored = true
	callFor("registry back", 2*ttl+time.Second)
	w.wantHTTP(t, "http://echo."+ns+".mesh/", w.a)
	w.wantHTTP(t, "http://remote."+ns+".svc.clusterset.local/", w.b)
}

// nodeRemoved: B's second node dies; calls to B's exported service move to the remaining node.
func (w *world) nodeRemoved(t *testing.T) {
	ctx := context.Background()
	url := "http://remote." + ns + ".svc.clusterset.local/"
	seen := map[string]bool{}
	testenv.Eventually(t, 90*time.Second, "both of B's nodes serve", func() error {
		r, err := w.get(ctx, url)
		if err != nil {
			return err
		}
		seen[r.Server] = true
		if len(seen) < 2 {
			return fmt.Errorf("answered only by %v", seen)
		}
		return nil
	})
	gone := w.nodesB[1]
	if err := w.p.StopNode(ctx, w.b, gone); err != nil {
		t.Fatal(err)
	}
	// Once the dead node's endpoints expired, every call lands on the remaining node.
	testenv.Eventually(t, 2*time.Minute, "calls move to "+w.nodesB[0], func() error {
		for i := 0; i < 6; i++ {
			r, err := w.get(ctx, url)
			if err != nil {
				return err
			}
			if r.Server != "remote-1" || r.CallerID != w.callerID() {
				return fmt.Errorf("answered by %s (caller %q)", r.Server, r.CallerID)
			}
		}
		return nil
	})
}
