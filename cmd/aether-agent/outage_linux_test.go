//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestPrivilegedAgentTrafficSurvivesSourceOutages runs the real agent with two captured pods (a
// client and a web server, each in its own network namespace, on a node namespace) and checks
// that mesh traffic from the client to the web Service's VIP, over mTLS with the client's
// identity, keeps flowing on an established keep-alive connection and on new connections while
// the API server is stopped, and separately while the registry is cut off; readiness names the
// missing source meanwhile and recovers after it returns.
func TestPrivilegedAgentTrafficSurvivesSourceOutages(t *testing.T) {
	testenv.RequireRoot(t)
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	regProxy := testenv.NewCutProxy(t, strings.TrimPrefix(etcd.Endpoints[0], "http://"))
	cs := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop",
		Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}))
	for _, sa := range []string{"web", "client"} {
		must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	}
	web, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"web", "client"} {
		p, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: name, AutomountServiceAccountToken: new(bool),
				Containers: []corev1.Container{{Name: "app", Image: name, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if p, err = cs.CoreV1().Pods("shop").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[name] = p
	}

	// The node is a namespace of its own (as on the substrate): the agent and its Envoy run in
	// it and reach the pods over veth pairs; the API server and the registry (through the cut
	// proxy) are forwarded into it at their loopback addresses.
	node, clientNS, webNS := testenv.NewNetns(t), testenv.NewNetns(t), testenv.NewNetns(t)
	clientIP, webIP := netip.MustParsePrefix("10.250.1.2/24"), netip.MustParsePrefix("10.250.2.2/24")
	testenv.Veth(t, node, "vclient", netip.MustParsePrefix("10.250.1.1/24"), clientNS, "eth0", clientIP)
	testenv.Veth(t, node, "vweb", netip.MustParsePrefix("10.250.2.1/24"), webNS, "eth0", webIP)
	clientNS.DefaultRoute(t, netip.MustParseAddr("10.250.1.1"))
	webNS.DefaultRoute(t, netip.MustParseAddr("10.250.2.1"))
	apiAddr := strings.TrimPrefix(api.Config.Host, "https://")
	node.Forward(t, apiAddr, apiAddr)
	node.Forward(t, regProxy.Addr(), regProxy.Addr())
	a := startAgentWith(t, agentOpts{wrap: []string{"ip", "netns", "exec", node.Name}, client: node.HTTPClient(false)},
		"--kubeconfig", api.Kubeconfig, "--registry-endpoints", regProxy.URL())
	ready := func(d time.Duration, what string) {
		t.Helper()
		eventually(t, d, what, func() error {
			if code, body := a.get("/readyz"); code != http.StatusOK {
				return fmt.Errorf("/readyz %d: %s", code, body)
			}
			return nil
		})
	}
	degraded := func(source string) {
		t.Helper()
		eventually(t, 60*time.Second, "readiness naming "+source, func() error {
			if code, body := a.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, source) {
				return fmt.Errorf("/readyz %d: %s", code, body)
			}
			return nil
		})
	}
	ready(60*time.Second, "agent ready")

	webNS.ServeHTTP(t, "0.0.0.0:8080", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "web saw %s", r.Header.Get("X-Forwarded-Client-Cert"))
	}))
	cl := plugin.NewClient(a.cniSocket)
	for name, att := range map[string]struct {
		ns *testenv.Netns
		ip netip.Prefix
	}{"web": {webNS, webIP}, "client": {clientNS, clientIP}} {
		p := pods[name]
		if _, err := cl.Add(ctx, plugin.Request{Network: "test", Attachment: plugin.PodAttachment{
			ContainerID: "ctr-" + name, PodUID: string(p.UID), Namespace: "shop", Name: p.Name,
			NetnsPath: att.ns.Path, IPs: []netip.Addr{att.ip.Addr()}, Interface: "eth0"}}); err != nil {
			t.Fatalf("CNI ADD %s: %v", p.Name, err)
		}
	}

	url := "http://" + web.Spec.ClusterIP + "/"
	wantID := "spiffe://aether.internal/ns/shop/sa/client"
	// One keep-alive connection, reused for every request (checked), and fresh connections.
	kept := clientNS.HTTPClient(true)
	kept.Transport.(*http.Transport).MaxConnsPerHost = 1
	fresh := clientNS.HTTPClient(false)
	call := func(c *http.Client, wantReused bool) error {
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
	// The web endpoint goes through the registry before it reaches EDS: wait for the first answer.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("envoy clusters:\n%s", grepLines(a.envoy("/clusters"), "web.shop"))
			t.Logf("envoy listeners:\n%s", a.envoy("/listeners"))
			out, _ := webNS.Command("nft", "list", "ruleset").CombinedOutput()
			t.Logf("web pod rules:\n%s", out)
		}
	})
	eventually(t, 60*time.Second, "client reaches web through the mesh", func() error { return call(fresh, false) })
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
	degraded("kubernetes")
	traffic("API server stopped")
	if err := api.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	ready(90*time.Second, "ready after the API server returns")
	traffic("after the API server returned")

	regProxy.Cut()
	degraded("registry")
	traffic("registry cut off")
	regProxy.Restore()
	ready(60*time.Second, "ready after the registry returns")
	traffic("after the registry returned")
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
