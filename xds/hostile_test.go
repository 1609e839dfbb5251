package xds

import (
	"context"
	"net/netip"
	"testing"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/aethermesh/aether/model"
)

// TestSetMeshWithUnusableAttachments: persisted CNI attachments that parse but cannot be served
// (no IP, an empty IP string, which netip reads as the zero Addr, no netns path: an old or
// hand-edited record in the agent's state directory) leave their pods out of the model, named in
// Mesh.Skipped, and the node's snapshot is still built with the other pod. Before, Build failed
// for the whole node ("inbound listener: pod has no IP"), so no later change reached Envoy.
func TestSetMeshWithUnusableAttachments(t *testing.T) {
	s := newTestServer(t)
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: k8stypes.UID("uid-" + name)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}}}}
	}
	ok := netip.MustParseAddr("10.244.1.5")
	in := model.Sources{Cluster: "c1", MeshNamespaces: map[string]bool{"shop": true},
		Pods: []*corev1.Pod{pod("good"), pod("noip"), pod("zeroip"), pod("nonetns")},
		Attachments: map[string]cniv1.PodAttachment{
			"uid-good":    {PodUID: "uid-good", NetnsPath: "/var/run/netns/good", IPs: []netip.Addr{ok}},
			"uid-noip":    {PodUID: "uid-noip", NetnsPath: "/var/run/netns/noip"},
			"uid-zeroip":  {PodUID: "uid-zeroip", NetnsPath: "/var/run/netns/zeroip", IPs: []netip.Addr{{}}},
			"uid-nonetns": {PodUID: "uid-nonetns", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.6")}},
		}}
	m := model.Assemble(1, in)
	if _, err := s.SetMesh(context.Background(), m); err != nil {
		t.Fatalf("SetMesh: %v", err)
	}
	if len(m.Pods) != 1 || m.Pods[0].Name != "good" {
		t.Errorf("model pods = %v, want only shop/good", m.Pods)
	}
	var got []string
	for _, sk := range m.Skipped() {
		got = append(got, sk.Object+" "+sk.Field)
	}
	want := []string{"Pod shop/noip attachment.ips", "Pod shop/zeroip attachment.ips", "Pod shop/nonetns attachment.netnsPath"}
	if len(got) != len(want) {
		t.Fatalf("Skipped = %q, want %q", got, want)
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Errorf("Skipped = %q, lacks %q", got, w)
		}
	}
}
