package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/cni"
	"github.com/aethermesh/aether/internal/policysource"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestInboundSync: each pod's inbound policy of the model reaches the CNI server as capture
// modes and ports; an unchanged model sets nothing again; a failed set is tried again with the
// newest model.
func TestInboundSync(t *testing.T) {
	mesh := func(v uint64, in map[string]model.PodInbound) *model.Mesh {
		return &model.Mesh{Version: v, Inbound: in}
	}
	var mu sync.Mutex
	var calls []map[string]cni.PodInbound
	fail := true
	set := func(_ context.Context, m map[string]cni.PodInbound) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, m)
		if fail {
			fail = false
			return errors.New("pod p2 not reached")
		}
		return nil
	}
	ncalls := func() int { mu.Lock(); defer mu.Unlock(); return len(calls) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	latest := make(chan *model.Mesh, 1)
	go inboundSync(ctx, latest, set, nil, 50*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))

	first := map[string]model.PodInbound{
		"p1": {Mode: model.MTLSPermissive, StrictPorts: []uint32{8080}},
		"p2": {Mode: model.MTLSStrict, PermissivePorts: []uint32{9090}},
	}
	replaceLatest(latest, mesh(1, first))
	// The first set fails; the retry sets the same again, successfully.
	testenv.Eventually(t, 10*time.Second, "the failed set tried again", func() error {
		if n := ncalls(); n < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	mu.Lock()
	got := calls[1]
	mu.Unlock()
	want := map[string]cni.PodInbound{
		"p1": {Mode: capture.ModePermissive, StrictPorts: []uint16{8080}},
		"p2": {Mode: capture.ModeStrict, PermissivePorts: []uint16{9090}},
	}
	if len(got) != len(want) {
		t.Fatalf("set %v, want %v", got, want)
	}
	for uid, w := range want {
		if !samePodInbound(got[uid], w) {
			t.Errorf("pod %s: %+v, want %+v", uid, got[uid], w)
		}
	}
	// Same policies in a newer model: nothing set.
	replaceLatest(latest, mesh(2, first))
	time.Sleep(200 * time.Millisecond)
	if n := ncalls(); n != 2 {
		t.Errorf("%d sets after an unchanged model, want 2", n)
	}
	// A change: set once more.
	replaceLatest(latest, mesh(3, map[string]model.PodInbound{"p1": {Mode: model.MTLSStrict}}))
	testenv.Eventually(t, 10*time.Second, "the changed policy set", func() error {
		if n := ncalls(); n != 3 {
			return errors.New("not yet")
		}
		return nil
	})
}

// TestMTLSMode: --inbound-mode's values as model modes.
func TestMTLSMode(t *testing.T) {
	for in, want := range map[string]model.MTLSMode{"strict": model.MTLSStrict, "permissive": model.MTLSPermissive, "": model.MTLSStrict} {
		if got := mtlsMode(in); got != want {
			t.Errorf("mtlsMode(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCNIInboundReservedPorts: a port the node's capture reserves (a --dns-port other than the
// default) never reaches the CNI server, and is never opened instead: left out of a strict pod's
// permissive ports, it makes a permissive pod that lists it as strict strict on every port.
func TestCNIInboundReservedPorts(t *testing.T) {
	m := &model.Mesh{Inbound: map[string]model.PodInbound{
		"strict": {Mode: model.MTLSStrict, PermissivePorts: []uint32{9090, 5353}},
		"perm":   {Mode: model.MTLSPermissive, StrictPorts: []uint32{5353, 8080}},
		"other":  {Mode: model.MTLSPermissive, StrictPorts: []uint32{8080}},
	}}
	got := cniInbound(m, []uint16{5353})
	want := map[string]cni.PodInbound{
		"strict": {Mode: capture.ModeStrict, PermissivePorts: []uint16{9090}},
		"perm":   {Mode: capture.ModeStrict},
		"other":  {Mode: capture.ModePermissive, StrictPorts: []uint16{8080}},
	}
	if !maps.EqualFunc(got, want, samePodInbound) {
		t.Errorf("cniInbound = %+v, want %+v", got, want)
	}
}

// TestCNIInboundFixedPorts: a DENY policy on aether's own inbound port (15008), which a tenant can
// write and which ResolveInbound turns into a strict port of a permissive pod, never reaches the
// CNI server as a per-port rule (review finding: the CNI server refused the node's whole set,
// and no pod's mode changed again); the set is taken and persisted.
func TestCNIInboundFixedPorts(t *testing.T) {
	deny := &model.AuthzPolicy{Namespace: "b", Name: "deny-15008", Action: model.AuthzDeny,
		Rules: []model.AuthzRule{{AnySource: true, Ports: []uint32{15008, 8080}}}}
	in := model.ResolveInbound(model.MTLSPermissive, nil, "b", nil, []*model.AuthzPolicy{deny})
	m := &model.Mesh{Inbound: map[string]model.PodInbound{"uid-b": in}}
	got := cniInbound(m, []uint16{18054})["uid-b"]
	want := cni.PodInbound{Mode: capture.ModePermissive, StrictPorts: []uint16{8080}}
	if !samePodInbound(got, want) {
		t.Fatalf("cniInbound = %+v, want %+v", got, want)
	}
	dir := t.TempDir()
	srv := &cni.Server{Config: cni.ServerConfig{StateDir: dir, DNSPort: 18054}}
	if err := srv.SetInboundPolicies(context.Background(), map[string]cni.PodInbound{"uid-b": got, "uid-a": {Mode: capture.ModeStrict}}); err != nil {
		t.Fatalf("SetInboundPolicies: %v", err)
	}
	if p, err := cni.LoadInboundPolicies(dir, 18054); err != nil || !samePodInbound(p["uid-b"], want) {
		t.Fatalf("persisted %v, %v; want uid-b %+v", p, err, want)
	}
}

// TestPolicyFillersWhileUnknown: while it is not known whether the policy CRDs are installed (or
// their watch has not synced), the fillers return an error, so the assembler keeps the last model
// and never builds one without the policies it had (review finding: a discovery error counted as
// "not installed", and every pod lost its RBAC and its strict ports).
func TestPolicyFillersWhileUnknown(t *testing.T) {
	var s model.Sources
	if err := (authzPolicies{&policysource.AuthorizationPolicies{}}).Fill(&s); err == nil {
		t.Error("AuthorizationPolicies filled while unknown")
	}
	if err := (peerAuthns{&policysource.PeerAuthentications{}}).Fill(&s); err == nil {
		t.Error("PeerAuthentications filled while unknown")
	}
}

// TestAuthzOverrides names the pods authorization made stricter than their mTLS mode, with the
// ports and the PeerAuthentication it overrode, and only those.
func TestAuthzOverrides(t *testing.T) {
	m := &model.Mesh{
		Pods: []*model.LocalPod{
			{UID: "u1", Namespace: "shop", Name: "all"}, {UID: "u2", Namespace: "shop", Name: "some"},
			{UID: "u3", Namespace: "shop", Name: "plain"}, {UID: "u4", Namespace: "shop", Name: "none"},
		},
		Inbound: map[string]model.PodInbound{
			"u1": {Mode: model.MTLSStrict, Policy: "shop/migrate", AuthzAll: true},
			"u2": {Mode: model.MTLSPermissive, StrictPorts: []uint32{8080, 9090}, AuthzStrict: []uint32{8080, 9090}},
			"u3": {Mode: model.MTLSPermissive, Policy: "shop/migrate"},
		},
	}
	want := map[string]string{
		"shop/all":  "every port (over PeerAuthentication shop/migrate)",
		"shop/some": "ports 8080,9090 (over the mesh default)",
	}
	if got := authzOverrides(m); !maps.Equal(got, want) {
		t.Fatalf("authzOverrides = %v, want %v", got, want)
	}
}
