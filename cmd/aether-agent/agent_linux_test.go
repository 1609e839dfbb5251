//go:build linux

package main

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/registry"
)

// TestPrivilegedAgentPodLifecycle sends a pod's CNI ADD and DEL to the real agent binary and
// checks that the pod's listeners appear in and leave the real Envoy, its capture rules are
// installed, and its endpoint is registered and removed in the registry.
func TestPrivilegedAgentPodLifecycle(t *testing.T) {
	testenv.RequireRoot(t)
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	cs := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
	must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{}))
	pod, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "web", AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: "echo", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := cs.CoreV1().Pods("shop").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0])
	eventually(t, 60*time.Second, "agent ready", func() error {
		if code, body := a.get("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		return nil
	})

	// The pod's network namespace, with its address (Envoy binds the inbound listener to it).
	ns := testenv.NewNetns(t)
	podIP := netip.MustParseAddr("10.250.0.5")
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	lo, _ := h.LinkByName("lo")
	addr, _ := netlink.ParseAddr(podIP.String() + "/32")
	if err := h.AddrAdd(lo, addr); err != nil {
		t.Fatal(err)
	}
	h.Close()

	cl := plugin.NewClient(a.cniSocket)
	req := plugin.Request{Network: "test", Attachment: plugin.PodAttachment{
		ContainerID: "ctr-1", PodUID: string(pod.UID), Namespace: "shop", Name: "web-1",
		NetnsPath: ns.Path, IPs: []netip.Addr{podIP}, Interface: "eth0"}}
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
	// The pod's endpoint is registered: healthy (Ready), with the node IP and the target port.
	reader, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "default", Cluster: "reader"})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	eventually(t, 30*time.Second, "web-1's endpoint in the registry", func() error {
		recs, _, err := reader.ListEndpoints(ctx)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.Value.GetKubernetes().GetPodUid() == string(pod.UID) && r.Origin.Cluster == "a" &&
				r.Value.GetKubernetes().GetNodeIp() == "127.0.0.1" && len(r.Value.GetPorts()) == 1 && r.Value.GetPorts()[0].GetPort() == 8080 {
				return nil
			}
		}
		return fmt.Errorf("not registered yet (%d records)", len(recs))
	})

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
	eventually(t, 30*time.Second, "web-1's endpoint removed", func() error {
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
