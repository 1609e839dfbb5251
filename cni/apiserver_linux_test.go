//go:build linux

package cni

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// withUID returns rt with K8S_POD_UID set to uid.
func withUID(rt *libcni.RuntimeConf, uid string) *libcni.RuntimeConf {
	for i := range rt.Args {
		if rt.Args[i][0] == "K8S_POD_UID" {
			rt.Args[i][1] = uid
		}
	}
	return rt
}

// TestPrivilegedCNIWithAPIServer runs the agent's server with the client-go lookup against a
// real kube-apiserver: a meshed pod is captured through the real chain, an opted-out pod is not,
// and repair at start deletes a meshed pod that runs on the node without an attachment, and one
// whose only attachment is from a sandbox that is gone (a rebooted node: the pod's new sandbox
// came up through the primary CNI alone).
func TestPrivilegedCNIWithAPIServer(t *testing.T) {
	testenv.RequireRoot(t)
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	createNamespaces(t, cs)
	web := createPod(t, cs, "mesh", "web", nil, false)
	optout := createPod(t, cs, "mesh", "optout", map[string]string{model.AnnotationCapture: "false"}, false)
	early := createPod(t, cs, "mesh", "early", nil, true) // started before the agent was ready
	rebooted := createPod(t, cs, "mesh", "rebooted", nil, true)

	sock := filepath.Join(sockDir(t), "cni.sock")
	state := t.TempDir()
	// The record of rebooted's sandbox before the node rebooted: its netns is gone.
	if err := (&Store{Dir: state}).Save(&Record{Network: "test-net", Captured: true, Added: time.Now(),
		Attachment: cniv1.PodAttachment{ContainerID: "ctr-before-reboot", Interface: "eth0", Namespace: "mesh", Name: "rebooted",
			PodUID: string(rebooted.UID), NetnsPath: filepath.Join(t.TempDir(), "gone-netns")}}); err != nil {
		t.Fatal(err)
	}
	kp := &KubePods{Client: cs}
	srv := &Server{Config: ServerConfig{Socket: sock, StateDir: state, NodeName: "node-a",
		HostIP: netip.MustParseAddr(hostIP), ClusterDNS: []netip.Addr{netip.MustParseAddr(clusterDNS)}},
		Lookup: kp, NodePods: kp, Dataplane: &recordingDataplane{}, Backend: capture.NFTables{},
		Log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(30 * time.Second); !srv.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("agent not ready")
		}
	}
	for _, name := range []string{early.Name, rebooted.Name} {
		p, err := cs.CoreV1().Pods("mesh").Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && p.DeletionTimestamp == nil {
			t.Errorf("meshed pod %s without a live attachment was not deleted", name)
		}
	}
	if recs := records(t, state); len(recs) != 0 {
		t.Fatalf("records after repair: %+v, want the gone sandbox's released", recs)
	}

	n := newNode(t, "1.0.0", "10.244.40.0/24", sock, nil)
	podWeb, podOpt := testenv.NewNetns(t), testenv.NewNetns(t)
	if _, err := n.add(t, withUID(podRT(podWeb, "ctr-web", "mesh", "web"), string(web.UID))); err != nil {
		t.Fatalf("ADD web: %v", err)
	}
	if _, err := n.add(t, withUID(podRT(podOpt, "ctr-opt", "mesh", "optout"), string(optout.UID))); err != nil {
		t.Fatalf("ADD optout: %v", err)
	}
	if !tableIn(t, podWeb) {
		t.Fatal("meshed pod not captured")
	}
	if tableIn(t, podOpt) {
		t.Fatal("opted-out pod captured")
	}
	recs := records(t, srv.Config.StateDir)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for _, r := range recs {
		if r.Attachment.Name == "web" && (r.ServiceAccount != "web" || len(r.Ports) != 2 || !r.Captured) {
			t.Fatalf("web record = %+v", r)
		}
	}
	// A stale UID (the pod was replaced) fails ADD.
	podOld := testenv.NewNetns(t)
	if _, err := n.add(t, withUID(podRT(podOld, "ctr-old", "mesh", "web"), "stale-uid")); err == nil {
		t.Fatal("ADD with a stale pod UID succeeded")
	}
	if tableIn(t, podOld) {
		t.Fatal("rules left after the stale ADD")
	}
}
