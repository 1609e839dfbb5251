package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/model"
)

// podKube is a KubeFiller holding one meshed pod bound to the node.
type podKube struct{ pod *corev1.Pod }

func (k podKube) Fill(s *model.Sources) error {
	s.Node = model.Node{Name: "n1", IP: netip.MustParseAddr("192.168.0.9")}
	s.MeshNamespaces = map[string]bool{k.pod.Namespace: true}
	s.Pods = []*corev1.Pod{k.pod}
	return nil
}

// TestPodDataplaneStaleAttachmentRemoval: a pod whose sandbox was recreated has two attachments
// of one pod UID, the stale one (old container, netns gone, never DEL'ed: the agent was down, or
// the runtime sends the DEL late) and the live one. Releasing the stale one (repair, GC, a late
// DEL) must leave the live one served. Before, PodRemoved deleted the pod by UID, whatever the
// container, so the live pod lost its listeners while its capture rules still redirected its
// traffic to them: the pod was cut off until its next sandbox.
func TestPodDataplaneStaleAttachmentRemoval(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "web"}}
	att := newAttachments(nil)
	asm := model.NewAssembler(model.AssemblerConfig{Cluster: "a", MeshDomain: "mesh", TrustDomain: "td",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, podKube{pod}, nil, att)
	dp := &podDataplane{att: att, asm: asm}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go asm.Run(ctx)

	lp := func(cid, netns, ip string) model.LocalPod {
		return model.LocalPod{UID: "u1", Namespace: "shop", Name: "web-1", ServiceAccount: "web", ContainerID: cid,
			NetnsPath: netns, IPs: []netip.Addr{netip.MustParseAddr(ip)}}
	}
	stale, live := lp("c-old", "/run/netns/old", "10.1.0.5"), lp("c-new", "/run/netns/new", "10.1.0.6")
	if err := dp.PodAdded(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if err := dp.PodAdded(ctx, live); err != nil {
		t.Fatal(err)
	}
	// The recreated sandbox's ADD returns only once the model serves its container, not the
	// old sandbox's (the pod UID was in the model already).
	if p := asm.Current().Pod("u1"); p == nil || p.ContainerID != "c-new" {
		t.Fatalf("PodAdded(live) returned while the model serves %+v, want container c-new", p)
	}
	if err := dp.PodRemoved(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if got := att.Attachments()["u1"]; got.ContainerID != "c-new" {
		t.Fatalf("after releasing the stale attachment the dataplane holds %+v, want the live container c-new", got)
	}
	asm.Trigger()
	time.Sleep(200 * time.Millisecond) // several Quiet periods: a rebuild would have run
	if err := asm.Rebuild(); err != nil {
		t.Fatal(err)
	}
	if p := asm.Current().Pod("u1"); p == nil || p.ContainerID != "c-new" {
		t.Fatalf("model pod after releasing the stale attachment = %+v, want the live container c-new", p)
	}
	// Removing the live attachment removes the pod.
	if err := dp.PodRemoved(ctx, live); err != nil {
		t.Fatal(err)
	}
	if p := asm.Current().Pod("u1"); p != nil {
		t.Fatalf("pod still in the model after its live attachment was removed: %+v", p)
	}
}

// TestPodDataplaneWaitsForSVIDOnAdd: a new sandbox's ADD waits until the node proxy serves the pod
// (its SVID), and fails with the reason when that does not come in time; a pod announced again
// with the same container (a repair pass, a restarted agent) does not wait for it, so a repair
// never stalls on a pod whose SVID the SPIRE agent cannot give yet.
func TestPodDataplaneWaitsForSVIDOnAdd(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "web"}}
	att := newAttachments(nil)
	asm := model.NewAssembler(model.AssemblerConfig{Cluster: "a", MeshDomain: "mesh", TrustDomain: "td",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, podKube{pod}, nil, att)
	served := make(chan string, 10)
	svid := make(chan struct{})
	dp := &podDataplane{att: att, asm: asm, served: func(ctx context.Context, uid string) error {
		served <- uid
		select {
		case <-svid:
			return nil
		case <-ctx.Done():
			return errors.New("pod " + uid + " not served by the node proxy: no SVID yet")
		}
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go asm.Run(ctx)
	lp := model.LocalPod{UID: "u1", Namespace: "shop", Name: "web-1", ServiceAccount: "web", ContainerID: "c1",
		NetnsPath: "/run/netns/c1", IPs: []netip.Addr{netip.MustParseAddr("10.1.0.5")}}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	err := dp.PodAdded(short, lp)
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "no SVID yet") {
		t.Fatalf("ADD without an SVID = %v, want the wait's error", err)
	}
	if got := <-served; got != "u1" {
		t.Fatalf("served asked for %q", got)
	}
	// Announced again (same container): no wait for the SVID.
	if err := dp.PodAdded(ctx, lp); err != nil {
		t.Fatalf("announcing the pod again: %v", err)
	}
	select {
	case uid := <-served:
		t.Fatalf("a repeated announcement waited for %s's SVID", uid)
	default:
	}
	// A new sandbox waits, and returns once the SVID is served.
	lp.ContainerID, lp.NetnsPath = "c2", "/run/netns/c2"
	done := make(chan error, 1)
	go func() { done <- dp.PodAdded(ctx, lp) }()
	if got := <-served; got != "u1" {
		t.Fatalf("served asked for %q", got)
	}
	close(svid)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestListenUnixSurvivesOldListenerClose: the agent's xDS socket. When a second agent on the node
// (a DaemonSet update with maxSurge) has taken the path over, the old agent closing its listener
// must not remove the new one's socket file; before, Go's unlink on close removed it by path, and
// Envoy, which outlives agents, could not reconnect to the new agent's xDS.
func TestListenUnixSurvivesOldListenerClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "xds.sock")
	old, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	go func() {
		for {
			c, err := cur.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the new listener after the old one closed: %v", err)
	}
	c.Close()
}
