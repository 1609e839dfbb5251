//go:build linux

package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registry"
)

// TestPrivilegedAgentPodLifecycle sends a pod's CNI ADD and DEL to the real agent binary and
// checks that the pod's listeners appear in and leave the real Envoy, its capture rules are
// installed, and its endpoint is registered (healthy while the pod is Ready, unhealthy once it is
// not) and removed in the registry.
func TestPrivilegedAgentPodLifecycle(t *testing.T) {
	testenv.RequireRoot(t)
	api, etcd, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs, "web")
	must := mustCreate(t)
	must(cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{}))
	pod := createReadyPod(t, ctx, cs, "web-1", "web")

	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0], "--zone", "z9")
	a.waitReady(t, 60*time.Second, "agent ready")

	ns, req := podAttachment(t, pod, "ctr-1", netip.MustParseAddr("10.250.0.5"))
	cl := plugin.NewClient(a.cniSocket)
	start := time.Now()
	resp, err := cl.Add(ctx, req)
	if err != nil {
		t.Fatalf("CNI ADD through the agent: %v", err)
	}
	t.Logf("ADD answered after %s (Envoy ACKed the pod's listeners)", time.Since(start).Round(time.Millisecond))
	if !resp.Captured {
		t.Fatalf("ADD response = %+v, want the pod captured", resp)
	}
	// ADD returns only after Envoy ACKed the pod's listeners: they are there now, no waiting.
	listeners := a.envoy("/listeners")
	for _, want := range []string{"capture|shop/web-1", "inbound|shop/web-1", "lane|shop/web-1"} {
		if !strings.Contains(listeners, want) {
			t.Errorf("after ADD, Envoy has no listener %q:\n%s", want, listeners)
		}
	}
	if out, err := ns.Command("nft", "list", "ruleset").CombinedOutput(); err != nil || !strings.Contains(string(out), "15001") {
		t.Errorf("capture rules in the pod netns: %v\n%s", err, out)
	}
	// The pod's endpoint is registered: healthy (Ready), with the node IP, the target port and
	// the zone of --zone.
	reader, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "default", Cluster: "reader"})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	registered := func(health registryv1.Health) func() error {
		return func() error {
			recs, _, err := reader.ListEndpoints(ctx)
			if err != nil {
				return err
			}
			for _, r := range recs {
				if r.Value.GetKubernetes().GetPodUid() == string(pod.UID) && r.Origin.Cluster == "a" &&
					r.Value.GetKubernetes().GetNodeIp() == "127.0.0.1" && len(r.Value.GetPorts()) == 1 && r.Value.GetPorts()[0].GetPort() == 8080 &&
					r.Value.GetZone() == "z9" && r.Value.GetHealth() == health {
					return nil
				}
			}
			return fmt.Errorf("not registered %s yet (%d records)", health, len(recs))
		}
	}
	testenv.Eventually(t, 30*time.Second, "web-1's endpoint in the registry, healthy", registered(registryv1.Health_HEALTH_HEALTHY))
	// The endpoint is healthy while the pod is Ready.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := cs.CoreV1().Pods("shop").Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
		_, err = cs.CoreV1().Pods("shop").UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "web-1's endpoint unhealthy once the pod is not Ready", registered(registryv1.Health_HEALTH_UNHEALTHY))

	if err := cl.Del(ctx, req); err != nil {
		t.Logf("lds stats: %s", a.envoy("/stats?filter=listener_manager"))
		t.Logf("listeners: %s", a.envoy("/listeners"))
		t.Fatalf("CNI DEL: %v", err)
	}
	if l := a.envoy("/listeners"); strings.Contains(l, "shop/web-1") {
		t.Errorf("after DEL, Envoy still has the pod's listeners:\n%s", l)
	}
	if out, _ := ns.Command("nft", "list", "ruleset").CombinedOutput(); strings.Contains(string(out), "15001") {
		t.Errorf("capture rules left after DEL:\n%s", out)
	}
	testenv.Eventually(t, 30*time.Second, "web-1's endpoint removed", func() error {
		recs, _, err := reader.ListEndpoints(ctx)
		if err != nil {
			return err
		}
		if len(recs) != 0 {
			return fmt.Errorf("%d endpoints left", len(recs))
		}
		return nil
	})
}

// TestPrivilegedAgentTrafficSurvivesSourceOutages runs the real agent with two captured pods (a
// client and a web server, each in its own network namespace, on a node namespace) and checks
// that mesh traffic from the client to the web Service's VIP, over mTLS with the client's
// identity, keeps flowing on an established keep-alive connection and on new connections while
// the API server is stopped, and separately while the registry is cut off; readiness names the
// missing source meanwhile and recovers after it returns.
func TestPrivilegedAgentTrafficSurvivesSourceOutages(t *testing.T) {
	testenv.RequireRoot(t)
	api, etcd, cs := startSources(t)
	regProxy := testenv.NewCutProxy(t, strings.TrimPrefix(etcd.Endpoints[0], "http://"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs, "web", "client")
	web := createWebService(t, ctx, cs)
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"web", "client"} {
		pods[name] = createReadyPod(t, ctx, cs, name+"-1", name)
	}

	// The node is a namespace of its own (as on the substrate); the registry is reached through
	// the cut proxy.
	tn := startTwoPodNode(t, ctx, api, regProxy.Addr(), regProxy.URL(), agentOpts{}, pods)
	a, clientNS := tn.a, tn.clientNS

	url := "http://" + web.Spec.ClusterIP + "/"
	wantID := "spiffe://aether.internal/ns/shop/sa/client"
	// One keep-alive connection, reused for every request (checked), and fresh connections.
	kept := clientNS.HTTPClient(true)
	kept.Transport.(*http.Transport).MaxConnsPerHost = 1
	fresh := clientNS.HTTPClient(false)
	call := func(c *http.Client, wantReused bool) error { return callAs(ctx, c, url, wantID, wantReused) }
	// The web endpoint goes through the registry before it reaches EDS: wait for the first answer.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("envoy clusters:\n%s", grepLines(a.envoy("/clusters"), "web.shop"))
			t.Logf("envoy listeners:\n%s", a.envoy("/listeners"))
			out, _ := tn.webNS.Command("nft", "list", "ruleset").CombinedOutput()
			t.Logf("web pod rules:\n%s", out)
		}
	})
	testenv.Eventually(t, 60*time.Second, "client reaches web through the mesh", func() error { return call(fresh, false) })
	if err := call(kept, false); err != nil {
		t.Fatal(err)
	}
	traffic := func(when string) {
		t.Helper()
		for i := 0; i < 20; i++ {
			if err := call(kept, true); err != nil {
				t.Fatalf("%s: established connection, request %d: %v", when, i, err)
			}
			if err := call(fresh, false); err != nil {
				t.Fatalf("%s: new connection %d: %v", when, i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	api.StopAPIServer()
	a.waitDegraded(t, "kubernetes")
	traffic("API server stopped")
	if err := api.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	a.waitReady(t, 90*time.Second, "ready after the API server returns")
	traffic("after the API server returned")

	regProxy.Cut()
	a.waitDegraded(t, "registry")
	traffic("registry cut off")
	regProxy.Restore()
	a.waitReady(t, 60*time.Second, "ready after the registry returns")
	traffic("after the registry returned")
}

// twoPodNode is a node namespace with two pod namespaces, client (10.250.1.2) and web
// (10.250.2.2), on veth pairs, and the real agent running in the node namespace.
type twoPodNode struct {
	node, clientNS, webNS *testenv.Netns
	a                     *agentProc
}

// startTwoPodNode makes a twoPodNode: the API server and the registry (registryAddr, reached as
// registryURL) forwarded into the node namespace at their loopback addresses, the agent started
// there with o (its wrap and client set here) and ready, web serving on :8080 the
// X-Forwarded-Client-Cert it sees, and pods["web"] and pods["client"] ADDed through the agent's
// CNI server (each ADD's time logged).
func startTwoPodNode(t *testing.T, ctx context.Context, api *testenv.KubeAPIServer, registryAddr, registryURL string, o agentOpts, pods map[string]*corev1.Pod) *twoPodNode {
	t.Helper()
	n := &twoPodNode{node: testenv.NewNetns(t), clientNS: testenv.NewNetns(t), webNS: testenv.NewNetns(t)}
	clientIP, webIP := netip.MustParsePrefix("10.250.1.2/24"), netip.MustParsePrefix("10.250.2.2/24")
	testenv.Veth(t, n.node, "vclient", netip.MustParsePrefix("10.250.1.1/24"), n.clientNS, "eth0", clientIP)
	testenv.Veth(t, n.node, "vweb", netip.MustParsePrefix("10.250.2.1/24"), n.webNS, "eth0", webIP)
	n.clientNS.DefaultRoute(t, netip.MustParseAddr("10.250.1.1"))
	n.webNS.DefaultRoute(t, netip.MustParseAddr("10.250.2.1"))
	apiAddr := strings.TrimPrefix(api.Config.Host, "https://")
	n.node.Forward(t, apiAddr, apiAddr)
	n.node.Forward(t, registryAddr, registryAddr)
	o.wrap, o.client = []string{"ip", "netns", "exec", n.node.Name}, n.node.HTTPClient(false)
	n.a = startAgentWith(t, o, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", registryURL)
	n.a.waitReady(t, 90*time.Second, "agent ready")
	n.webNS.ServeHTTP(t, "0.0.0.0:8080", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "web saw %s", r.Header.Get("X-Forwarded-Client-Cert"))
	}))
	cl := plugin.NewClient(n.a.cniSocket)
	for _, name := range []string{"web", "client"} {
		ns, ip := n.webNS, webIP
		if name == "client" {
			ns, ip = n.clientNS, clientIP
		}
		p := pods[name]
		start := time.Now()
		if _, err := cl.Add(ctx, cniv1.Request{Network: "test", Attachment: cniv1.PodAttachment{
			ContainerID: "ctr-" + name, PodUID: string(p.UID), Namespace: "shop", Name: p.Name,
			NetnsPath: ns.Path, IPs: []netip.Addr{ip.Addr()}, Interface: "eth0"}}); err != nil {
			t.Fatalf("CNI ADD %s: %v", p.Name, err)
		}
		t.Logf("ADD %s answered after %s (Envoy serves its listeners and SVID)", p.Name, time.Since(start).Round(time.Millisecond))
	}
	return n
}

// callAs GETs url with c and returns nil when the answer is 200 and carries the caller's identity
// wantID (the web handler echoes X-Forwarded-Client-Cert) over a connection reused or not as
// wantReused says.
func callAs(ctx context.Context, c *http.Client, url, wantID string, wantReused bool) error {
	var reused bool
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}), http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), wantID) {
		return fmt.Errorf("GET %s: %d %q, want 200 with the caller's identity %s", url, resp.StatusCode, b, wantID)
	}
	if reused != wantReused {
		return fmt.Errorf("GET %s: connection reused = %v, want %v", url, reused, wantReused)
	}
	return nil
}

// createWebService creates the Service shop/web: port 80 (http) to target port 8080 of the pods
// labelled app=web.
func createWebService(t testing.TB, ctx context.Context, cs kubernetes.Interface) *corev1.Service {
	t.Helper()
	web, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return web
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestPrivilegedAgentKilledAdoptsEnvoy kills the real agent binary with SIGKILL twice: Envoy,
// in its own session, keeps running and serving its last configuration; the restarted agent
// adopts it (Envoy holds <state-dir>/envoy/envoy.lock: first with the pid file naming it, then
// with the pid file removed, the lock alone): one Envoy, the same process, and new configuration
// flows to it. A pod captured before the kills keeps its listeners, and its capture rules,
// deleted while the agent was down, are back once the restarted agent is ready (repair runs
// before readiness).
func TestPrivilegedAgentKilledAdoptsEnvoy(t *testing.T) {
	testenv.RequireRoot(t)
	api, etcd, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs, "web")
	pod := createReadyPod(t, ctx, cs, "web-1", "web")
	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0])
	a.waitReady(t, 60*time.Second, "agent ready")
	service := func(name string) {
		t.Helper()
		if _, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, name+"'s cluster in Envoy", a.envoyHas("/clusters", name+".shop.mesh:80::", true))
	}
	service("web")
	// A captured pod: its rules are in its netns, its listeners in Envoy.
	podNS, req := podAttachment(t, pod, "ctr-1", netip.MustParseAddr("10.250.0.6"))
	if _, err := plugin.NewClient(a.cniSocket).Add(ctx, req); err != nil {
		t.Fatalf("CNI ADD: %v", err)
	}
	captured := func() error {
		if out, err := podNS.Command("nft", "list", "table", "inet", "aether").CombinedOutput(); err != nil {
			return fmt.Errorf("pod's capture rules: %v: %s", err, out)
		}
		if l := a.envoy("/listeners"); !strings.Contains(l, "inbound|shop/web-1") {
			return fmt.Errorf("pod's listeners not in Envoy: %s", l)
		}
		return nil
	}
	if err := captured(); err != nil {
		t.Fatal(err)
	}
	envoys := a.envoyProcesses()
	if len(envoys) != 1 || a.envoyPID() != envoys[0] {
		t.Fatalf("Envoy processes %v, pid file %d: want one, named in the pid file", envoys, a.envoyPID())
	}

	for i, removePID := range []bool{false, true} {
		a.killAndRestart(t)
		// (Between kill and restart nothing serves xDS; Envoy keeps its last configuration.)
		if !strings.Contains(a.envoy("/clusters"), "web.shop.mesh:80::") {
			t.Fatalf("round %d: Envoy lost its configuration when the agent was killed", i+1)
		}
		if removePID {
			if err := os.Remove(filepath.Join(a.stateDir, "envoy", "envoy.pid")); err != nil {
				t.Fatal(err)
			}
		} else if out, err := podNS.Command("nft", "delete", "table", "inet", "aether").CombinedOutput(); err != nil {
			// The pod's rules are lost while the agent is down: the restart repairs them.
			t.Fatalf("delete the pod's rules: %v: %s", err, out)
		}
		a.waitReady(t, 60*time.Second, fmt.Sprintf("round %d: the restarted agent ready", i+1))
		if err := captured(); err != nil {
			t.Fatalf("round %d: after the restart: %v", i+1, err)
		}
		if got := a.envoyProcesses(); !slices.Equal(got, envoys) {
			t.Fatalf("round %d: Envoy processes after the restart %v, want the same one %v (adopted, not a second)", i+1, got, envoys)
		}
		service(fmt.Sprintf("api%d", i+1))
	}
	if adopted := grepLines(mustReadFile(t, a.logPath), "adopted running envoy"); !strings.Contains(adopted, `"holds_lock":true`) {
		t.Errorf("the agent log never records adopting Envoy through its lock:\n%s", adopted)
	}
}

func mustReadFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// createReadyPod creates Pod shop/<name> on node-1 (label app=<app>, service account <app>, one
// container port 8080), after edit (which may set another namespace), and marks it Ready.
func createReadyPod(t testing.TB, ctx context.Context, cs kubernetes.Interface, name, app string, edit ...func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: app, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: app, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}
	for _, e := range edit {
		e(pod)
	}
	p, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if p, err = cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// podAttachment makes pod's network namespace with ip on its loopback (Envoy binds the inbound
// listener to it) and returns it with the CNI request that attaches it as container cid.
func podAttachment(t testing.TB, pod *corev1.Pod, cid string, ip netip.Addr) (*testenv.Netns, cniv1.Request) {
	t.Helper()
	ns := testenv.NewNetns(t)
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, _ := h.LinkByName("lo")
	addr, _ := netlink.ParseAddr(ip.String() + "/32")
	if err := h.AddrAdd(lo, addr); err != nil {
		t.Fatal(err)
	}
	return ns, cniv1.Request{Network: "test", Attachment: cniv1.PodAttachment{
		ContainerID: cid, PodUID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name,
		NetnsPath: ns.Path, IPs: []netip.Addr{ip}, Interface: "eth0"}}
}

// TestPrivilegedAgentRepairsWhenEnvoyRejects: a pod's netns disappears without a DEL, then
// Envoy restarts. The new Envoy rejects the configuration (it cannot open that netns to bind the
// pod's listeners), and the rejection starts a CNI repair at once, which releases the pod: the
// other pod's listeners are in the new Envoy and a new Service reaches it, with the periodic
// repair an hour away (--cni-repair-interval 1h), so only the rejection can have started it.
func TestPrivilegedAgentRepairsWhenEnvoyRejects(t *testing.T) {
	testenv.RequireRoot(t)
	api, etcd, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs, "web")
	live := createReadyPod(t, ctx, cs, "web-1", "web")
	gone := createReadyPod(t, ctx, cs, "web-2", "web")
	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0], "--cni-repair-interval", "1h")
	a.waitReady(t, 60*time.Second, "agent ready")

	_, liveReq := podAttachment(t, live, "ctr-live", netip.MustParseAddr("10.250.0.6"))
	// The other pod's netns is one the test deletes itself (testenv's cleanup would fail on it).
	goneNS := fmt.Sprintf("aet-gone-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", goneNS).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", goneNS).Run() })
	goneReq := liveReq
	goneReq.Attachment = cniv1.PodAttachment{ContainerID: "ctr-gone", PodUID: string(gone.UID), Namespace: gone.Namespace,
		Name: gone.Name, NetnsPath: "/var/run/netns/" + goneNS, IPs: []netip.Addr{netip.MustParseAddr("10.250.0.7")}, Interface: "eth0"}
	for _, req := range []cniv1.Request{liveReq, goneReq} {
		if _, err := plugin.NewClient(a.cniSocket).Add(ctx, req); err != nil {
			t.Fatalf("CNI ADD %s: %v", req.Attachment.Name, err)
		}
	}
	for _, name := range []string{"inbound|shop/web-1", "inbound|shop/web-2"} {
		testenv.Eventually(t, 30*time.Second, name+" in Envoy", a.envoyHas("/listeners", name, true))
	}

	if out, err := exec.Command("ip", "netns", "delete", goneNS).CombinedOutput(); err != nil {
		t.Fatalf("ip netns delete: %v: %s", err, out)
	}
	old := a.envoyPID()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "a new Envoy", func() error {
		if p := a.envoyPID(); p == 0 || p == old || !strings.Contains(a.envoy("/server_info"), "LIVE") {
			return fmt.Errorf("envoy pid %d (old %d), server_info %.80s", p, old, a.envoy("/server_info"))
		}
		return nil
	})
	// The new Envoy rejected the update holding web-2's listeners (it applies the listeners it
	// can open, so web-1's are there either way). Until web-2 is released every later update is
	// rejected too, as each holds web-2's listeners: the new Service below reaches Envoy only
	// because the rejection started the repair that released web-2.
	testenv.Eventually(t, 60*time.Second, "web-1's listeners in the new Envoy", a.envoyHas("/listeners", "inbound|shop/web-1", true))
	testenv.Eventually(t, 30*time.Second, "web-2's listeners not in the new Envoy", a.envoyHas("/listeners", "inbound|shop/web-2", false))
	if _, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "a new Service's cluster in the new Envoy", a.envoyHas("/clusters", "api.shop.mesh:80::", true))
	log := mustReadFile(t, a.logPath)
	if !strings.Contains(log, "envoy rejected xds response (NACK)") {
		t.Errorf("the agent log records no rejection: the new Envoy was expected to reject web-2's listeners")
	}
}

// TestPrivilegedUninstallRemovesGuard runs the agent binary's --uninstall-cni in a node netns that
// holds the node source guard: the guard goes with aether-cni.
func TestPrivilegedUninstallRemovesGuard(t *testing.T) {
	testenv.RequireRoot(t)
	node := testenv.NewNetns(t)
	g := capture.NFTGuard{NetnsPath: node.Path}
	addrs := []netip.Addr{netip.MustParseAddr("10.244.0.1")}
	if _, err := g.Apply(addrs); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out, err := node.Command(buildAgent(t), "--uninstall-cni", "--cni-conf-dir", dir, "--cni-bin-dir", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("--uninstall-cni: %v\n%s", err, out)
	}
	if err := g.Check(addrs); err == nil {
		t.Fatalf("the guard is still there after --uninstall-cni:\n%s", out)
	}
	if !strings.Contains(string(out), "node source guard removed") {
		t.Fatalf("--uninstall-cni did not say it removed the guard:\n%s", out)
	}
}
