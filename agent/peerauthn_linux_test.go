//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestPrivilegedPeerAuthnPermissiveNamespace is issue #32's "a namespace in permissive mode
// accepts plaintext while its neighbours stay strict", end to end: the real agent binary (mesh
// default strict), a real kube-apiserver with the PeerAuthentication CRD, real network
// namespaces and capture rules. Meshed pods shop/web-1, legacy/old-1 and legacy/db-1, and a
// plaintext client outside the mesh (a netns of its own, not captured, linked to each pod).
// Once legacy/migrate (namespace-wide PERMISSIVE) and legacy/db-port (app=db, portLevelMtls 9090
// STRICT, the mode inherited) exist, plaintext reaches old-1 and db-1:8080, while db-1:9090 and
// every port of the strict neighbour shop/web-1 reset it; 15008 stays open everywhere. Deleting
// legacy/migrate makes legacy strict again.
func TestPrivilegedPeerAuthnPermissiveNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	api, etcd, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs, "web")
	mustCreate(t)(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "legacy",
		Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}))
	for _, sa := range []string{"old", "db"} {
		mustCreate(t)(cs.CoreV1().ServiceAccounts("legacy").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	}
	in := func(ns string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Namespace = ns } }
	pods := map[string]*corev1.Pod{
		"web-1": createReadyPod(t, ctx, cs, "web-1", "web"),
		"old-1": createReadyPod(t, ctx, cs, "old-1", "old", in("legacy")),
		"db-1":  createReadyPod(t, ctx, cs, "db-1", "db", in("legacy")),
	}

	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0])
	a.waitReady(t, 60*time.Second, "agent ready")

	// The plaintext client has one veth to each pod (10.250.<i>.1 <-> 10.250.<i>.2): it reaches
	// them directly, not captured itself.
	client := testenv.NewNetns(t)
	ips := map[string]string{}
	nets := map[string]*testenv.Netns{}
	cl := plugin.NewClient(a.cniSocket)
	for i, name := range []string{"web-1", "old-1", "db-1"} {
		p := pods[name]
		nets[name] = testenv.NewNetns(t)
		podIP := netip.MustParsePrefix(fmt.Sprintf("10.250.%d.2/24", i+1))
		testenv.Veth(t, client, fmt.Sprintf("v%d", i+1), netip.MustParsePrefix(fmt.Sprintf("10.250.%d.1/24", i+1)), nets[name], "eth0", podIP)
		ips[name] = podIP.Addr().String()
		for _, port := range []string{"8080", "9090"} {
			l := nets[name].Listen(t, ips[name]+":"+port)
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
		if _, err := cl.Add(ctx, cniv1.Request{Network: "test", Attachment: cniv1.PodAttachment{
			ContainerID: "ctr-" + name, PodUID: string(p.UID), Namespace: p.Namespace, Name: p.Name,
			NetnsPath: nets[name].Path, IPs: []netip.Addr{podIP.Addr()}, Interface: "eth0"}}); err != nil {
			t.Fatalf("CNI ADD %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, ns := range nets {
				out, _ := ns.Command("nft", "list", "ruleset").CombinedOutput()
				t.Logf("%s rules:\n%s", name, out)
			}
		}
	})

	type dial struct {
		pod, port string
		ok        bool
	}
	// check dials each in plaintext from the client: ok wants the connection accepted, else
	// refused (the strict rules reset a new plaintext connection).
	check := func(ds ...dial) error {
		var errs []string
		for _, d := range ds {
			c, err := client.Dial(ips[d.pod] + ":" + d.port)
			if err == nil {
				c.Close()
			}
			switch {
			case d.ok && err != nil:
				errs = append(errs, fmt.Sprintf("%s:%s: %v, want accepted", d.pod, d.port, err))
			case !d.ok && !errors.Is(err, syscall.ECONNREFUSED):
				errs = append(errs, fmt.Sprintf("%s:%s: %v, want reset", d.pod, d.port, err))
			}
		}
		if len(errs) > 0 {
			return errors.New(strings.Join(errs, "; "))
		}
		return nil
	}
	if err := check(dial{"web-1", "8080", false}, dial{"old-1", "8080", false}, dial{"db-1", "8080", false}); err != nil {
		t.Fatalf("mesh default strict: %v", err)
	}

	dyn := dynamic.NewForConfigOrDie(api.Config).Resource(sec.PeerAuthenticationResource).Namespace("legacy")
	for _, p := range []*sec.PeerAuthentication{
		{ObjectMeta: metav1.ObjectMeta{Name: "migrate"}, Spec: sec.PeerAuthenticationSpec{MTLS: &sec.PeerAuthenticationMTLS{Mode: sec.MTLSPermissive}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "db-port"}, Spec: sec.PeerAuthenticationSpec{
			Selector:      &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PortLevelMTLS: map[string]sec.PeerAuthenticationMTLS{"9090": {Mode: sec.MTLSStrict}}}},
	} {
		p.TypeMeta = metav1.TypeMeta{APIVersion: sec.GroupVersion.String(), Kind: "PeerAuthentication"}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "legacy permissive, db-1:9090 and shop strict", func() error {
		return check(
			dial{"old-1", "8080", true}, dial{"old-1", "9090", true},
			dial{"db-1", "8080", true}, dial{"db-1", "9090", false},
			dial{"web-1", "8080", false}, dial{"web-1", "9090", false})
	})
	for _, name := range []string{"web-1", "old-1", "db-1"} {
		if _, err := client.Dial(ips[name] + ":15008"); errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s:15008 refused: inbound mTLS must stay open in every mode", name)
		}
	}

	if err := dyn.Delete(ctx, "migrate", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "legacy strict again without its namespace-wide policy", func() error {
		return check(dial{"old-1", "8080", false}, dial{"db-1", "8080", false}, dial{"db-1", "9090", false}, dial{"web-1", "8080", false})
	})
}
