//go:build linux

package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedCNIFailClosed shows that ADD fails and leaves no rules and no record when the
// agent is down, when the API lookup fails, and when the dataplane does not accept the pod.
func TestPrivilegedCNIFailClosed(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	n := newNode(t, "1.1.0", "10.244.30.0/24", sock, nil)

	t.Run("agent down", func(t *testing.T) {
		pod := testenv.NewNetns(t)
		_, err := n.add(t, podRT(pod, "ctr-down", "mesh", "down"))
		var te *types.Error
		if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater || !strings.Contains(err.Error(), "agent unavailable") {
			t.Fatalf("ADD with the agent down = %v, want error 11 naming the agent", err)
		}
		if tableIn(t, pod) {
			t.Fatal("rules left after a failed ADD")
		}
		// DEL still succeeds (the runtime cleans up after the failed ADD).
		if err := n.do(func(ctx context.Context) error {
			return n.cni.DelNetworkList(ctx, n.list, podRT(pod, "ctr-down", "mesh", "down"))
		}); err != nil {
			t.Fatalf("DEL with the agent down: %v", err)
		}
	})

	state := t.TempDir()
	lookup, dp := &staticLookup{}, &recordingDataplane{}
	startAgent(t, sock, state, ServerConfig{LookupTimeout: time.Second, DataplaneTimeout: time.Second}, lookup, dp)
	for _, tc := range []struct {
		name    string
		lookup  error
		dp      error
		hang    bool
		message string
	}{
		{"lookup fails", fmt.Errorf("apiserver timeout"), nil, false, "look up pod"},
		{"dataplane refuses", nil, fmt.Errorf("envoy NACK"), false, "program pod listeners"},
		{"dataplane never acks", nil, nil, true, "deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup.set(nil, tc.lookup)
			dp.mu.Lock()
			dp.fail, dp.hang = tc.dp, tc.hang
			dp.mu.Unlock()
			pod := testenv.NewNetns(t)
			rt := podRT(pod, "ctr-"+strings.ReplaceAll(tc.name, " ", "-"), "mesh", "p")
			_, err := n.add(t, rt)
			if err == nil || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("ADD = %v, want an error naming %q", err, tc.message)
			}
			if tableIn(t, pod) {
				t.Fatal("rules left after a failed ADD")
			}
			if recs := records(t, state); len(recs) != 0 {
				t.Fatalf("records left after a failed ADD: %d", len(recs))
			}
			_ = n.do(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, n.list, rt) })
		})
	}
	t.Run("capture cannot be installed", func(t *testing.T) {
		lookup.set(nil, nil)
		dp.mu.Lock()
		dp.fail, dp.hang = nil, false
		dp.mu.Unlock()
		notNetns := filepath.Join(t.TempDir(), "not-a-netns")
		_ = os.WriteFile(notNetns, nil, 0o600)
		_, err := plugin.NewClient(sock).Add(context.Background(), cniv1.Request{Network: "aethertest", Attachment: cniv1.PodAttachment{
			ContainerID: "ctr-bad", Namespace: "mesh", Name: "bad", NetnsPath: notNetns, Interface: "eth0",
			IPs: []netip.Addr{netip.MustParseAddr("10.244.30.9")}}})
		if err == nil || !strings.Contains(err.Error(), "install capture rules") {
			t.Fatalf("ADD into a file that is no netns = %v, want an error naming capture", err)
		}
		if recs := records(t, state); len(recs) != 0 {
			t.Fatalf("records left after a failed ADD: %d", len(recs))
		}
	})
}

// TestPrivilegedCNIRepairAfterRestart stops the agent, deletes a pod's rules by hand and removes
// another pod's netns, then starts a new agent on the same state directory: the rules come back
// and the gone pod's attachment is dropped. It logs the time from start to restored rules.
func TestPrivilegedCNIRepairAfterRestart(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	state := t.TempDir()
	n := newNode(t, "1.0.0", "10.244.31.0/24", sock, nil)
	first := startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, &recordingDataplane{})
	kept := testenv.NewNetns(t)
	gone := ownNetns(t)
	for _, p := range []struct {
		ns  *testenv.Netns
		cid string
	}{{kept, "ctr-kept"}, {gone, "ctr-gone"}} {
		if _, err := n.add(t, podRT(p.ns, p.cid, "mesh", p.cid)); err != nil {
			t.Fatal(err)
		}
	}
	first.stop()
	if out, err := kept.Command("nft", "delete", "table", "inet", "aether").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	// The gone pod's netns disappears while the agent is down (the bridge's veth goes with it).
	if out, err := runIP("netns", "delete", gone.Name); err != nil {
		t.Fatalf("%v %s", err, out)
	}

	dp := &recordingDataplane{}
	start := time.Now()
	startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, dp)
	deadline := time.Now().Add(60 * time.Second)
	for !tableIn(t, kept) {
		if time.Now().After(deadline) {
			t.Fatal("rules not restored within 60s of the agent's start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("rules restored %v after the agent started", time.Since(start))
	recs := records(t, state)
	if len(recs) != 1 || recs[0].Attachment.ContainerID != "ctr-kept" {
		t.Fatalf("records after repair = %d, want only ctr-kept", len(recs))
	}
	if dp.liveCount() != 1 {
		t.Fatalf("dataplane after repair has %d pods, want 1", dp.liveCount())
	}
	if err := n.do(func(ctx context.Context) error {
		return n.cni.CheckNetworkList(ctx, n.list, podRT(kept, "ctr-kept", "mesh", "ctr-kept"))
	}); err != nil {
		t.Fatalf("CHECK after repair: %v", err)
	}
}

// TestPrivilegedCNIAddWaitsForRepair restarts the agent while a captured pod's record is on
// disk and holds that pod's repair in the dataplane: an ADD for a new pod that arrives meanwhile
// is not answered, and reaches the dataplane only after the repair has finished. STATUS answers
// not ready until then.
func TestPrivilegedCNIAddWaitsForRepair(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	state := t.TempDir()
	add := func(ns *testenv.Netns, cid, ip string) error {
		_, err := plugin.NewClient(sock).Add(context.Background(), cniv1.Request{Network: "aethertest", Attachment: cniv1.PodAttachment{
			ContainerID: cid, Namespace: "mesh", Name: cid, NetnsPath: ns.Path, Interface: "eth0",
			IPs: []netip.Addr{netip.MustParseAddr(ip)}}})
		return err
	}
	oldNS, newNS := testenv.NewNetns(t), testenv.NewNetns(t)
	first := startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, &recordingDataplane{})
	if err := add(oldNS, "ctr-old", "10.244.32.2"); err != nil {
		t.Fatal(err)
	}
	first.stop()

	release := make(chan struct{})
	dp := &recordingDataplane{hold: map[string]chan struct{}{"ctr-old": release}}
	srv := &Server{Config: ServerConfig{Socket: sock, StateDir: state, HostIP: netip.MustParseAddr(hostIP),
		ClusterDNS: []netip.Addr{netip.MustParseAddr(clusterDNS)}}, Lookup: &staticLookup{}, Dataplane: dp, Backend: capture.NFTables{},
		Log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	defer func() { cancel(); <-served }()
	releaseRepair := sync.OnceFunc(func() { close(release) })
	defer releaseRepair() // (before the Serve wait above, also when the test fails)
	events := func() []string {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return append([]string(nil), dp.events...)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(events(), "start ctr-old") {
		if time.Now().After(deadline) {
			t.Fatal("the restarted agent did not start repairing ctr-old within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := plugin.NewClient(sock).Status(context.Background()); err == nil {
		t.Error("STATUS during the repair: ready, want not ready")
	}
	done := make(chan error, 1)
	go func() { done <- add(newNS, "ctr-new", "10.244.32.3") }()
	select {
	case err := <-done:
		t.Fatalf("ADD answered while the repair was held: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	releaseRepair()
	if err := <-done; err != nil {
		t.Fatalf("ADD after the repair: %v", err)
	}
	want := []string{"start ctr-old", "end ctr-old", "start ctr-new", "end ctr-new"}
	if got := events(); !slices.Equal(got, want) {
		t.Fatalf("dataplane calls = %q, want %q (the new pod only after the repair)", got, want)
	}
	if err := plugin.NewClient(sock).Status(context.Background()); err != nil {
		t.Errorf("STATUS after the repair: %v", err)
	}
}

// ownNetns creates a netns the test may delete itself (testenv.NewNetns's cleanup would fail on
// a netns that is already gone).
func ownNetns(t *testing.T) *testenv.Netns {
	t.Helper()
	name := fmt.Sprintf("aet-gone-%d", time.Now().UnixNano()%1e9)
	if out, err := runIP("netns", "add", name); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t.Cleanup(func() { _, _ = runIP("netns", "delete", name) })
	return &testenv.Netns{Name: name, Path: "/var/run/netns/" + name}
}

// TestPrivilegedCNIPeriodicRepair deletes a pod's rules by hand while the agent runs with a
// repair interval: the next repair restores them.
func TestPrivilegedCNIPeriodicRepair(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	n := newNode(t, "1.1.0", "10.244.32.0/24", sock, nil)
	dp := &recordingDataplane{}
	startAgent(t, sock, t.TempDir(), ServerConfig{RepairInterval: 200 * time.Millisecond}, &staticLookup{}, dp)
	pod := testenv.NewNetns(t)
	if _, err := n.add(t, podRT(pod, "ctr-p", "mesh", "p")); err != nil {
		t.Fatal(err)
	}
	if out, err := pod.Command("nft", "delete", "table", "inet", "aether").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	start := time.Now()
	for deadline := time.Now().Add(30 * time.Second); !tableIn(t, pod); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rules not restored by periodic repair within 30s")
		}
	}
	t.Logf("rules restored %v after deletion (repair interval 200ms)", time.Since(start))
	// Periodic repairs fix rules; they do not re-announce the pod to the dataplane.
	dp.mu.Lock()
	added := dp.added
	dp.mu.Unlock()
	if added != 1 {
		t.Fatalf("dataplane PodAdded called %d times, want 1 (the ADD)", added)
	}
}

// TestPrivilegedCNIConcurrentChain runs 200 ADD/DEL pairs at once through the whole chain
// (libcni: bridge + host-local, then aether-cni) and checks that nothing is left: no rules, no
// records, no pods in the dataplane, no addresses held by host-local.
func TestPrivilegedCNIConcurrentChain(t *testing.T) {
	testenv.RequireRoot(t)
	const pairs = 200
	sock := filepath.Join(sockDir(t), "cni.sock")
	state := t.TempDir()
	dp := &recordingDataplane{}
	startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, dp)
	n := newNode(t, "1.1.0", "10.245.0.0/16", sock, nil)
	pods := make([]*testenv.Netns, pairs)
	for i := range pods {
		pods[i] = testenv.NewNetns(t)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2*pairs)
	for i := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rt := podRT(pods[i], fmt.Sprintf("ctr-%03d", i), "mesh", fmt.Sprintf("p%03d", i))
			if _, err := n.add(t, rt); err != nil {
				errs <- fmt.Errorf("ADD %d: %w", i, err)
			} else if !tableIn(t, pods[i]) {
				errs <- fmt.Errorf("ADD %d: no rules", i)
			}
			if err := n.do(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, n.list, rt) }); err != nil {
				errs <- fmt.Errorf("DEL %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d ADD/DEL pairs through the chain in %v", pairs, time.Since(start))
	for _, p := range pods {
		if tableIn(t, p) {
			t.Fatalf("rules left in %s", p.Name)
		}
	}
	if recs := records(t, state); len(recs) != 0 {
		t.Fatalf("%d records left", len(recs))
	}
	if dp.liveCount() != 0 || dp.added != pairs {
		t.Fatalf("dataplane: %d pods live, %d added; want 0 and %d", dp.liveCount(), dp.added, pairs)
	}
	// host-local keeps only its lock and last-reserved marker: every address was released.
	ents, err := os.ReadDir(filepath.Join(n.ipamDir, n.list.Name))
	if err != nil || len(ents) == 0 {
		t.Fatalf("host-local state: %v (%d entries)", err, len(ents))
	}
	for _, e := range ents {
		if e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip") {
			t.Errorf("host-local still holds %s", e.Name())
		}
	}
}

// TestPrivilegedInstalledConflistRuns installs aether-cni into a bridge + host-local conflist
// with the Installer, lets the watcher repair a rewrite, and runs the resulting file through
// libcni: the pod gets captured.
func TestPrivilegedInstalledConflistRuns(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	startAgent(t, sock, t.TempDir(), ServerConfig{}, &staticLookup{}, &recordingDataplane{})
	n := newNode(t, "0.3.1", "10.244.33.0/24", sock, nil)
	// The primary CNI's file: the node's conflist without aether-cni.
	var primary map[string]any
	_ = json.Unmarshal(n.raw, &primary)
	primary["plugins"] = primary["plugins"].([]any)[:1]
	raw, _ := json.MarshalIndent(primary, "", "  ")
	confDir := t.TempDir()
	path := filepath.Join(confDir, "10-flannel.conflist")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	in := &Installer{ConfDir: confDir, Plugin: map[string]any{"agentSocket": sock}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Watch(ctx) }()
	defer func() { cancel(); <-done }()
	// The primary CNI rewrites its file after aether-cni was added: the watcher puts it back.
	waitInstalled := func() {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if b, _ := os.ReadFile(path); strings.Contains(string(b), plugin.PluginName) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("aether-cni not in the conflist within 20s")
			}
		}
	}
	waitInstalled()
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	waitInstalled()

	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatalf("libcni cannot load the installed conflist: %v", err)
	}
	if len(list.Plugins) != 2 || list.Plugins[1].Network.Type != plugin.PluginName {
		t.Fatalf("installed conflist plugins = %d", len(list.Plugins))
	}
	n.list = list
	pod := testenv.NewNetns(t)
	rt := podRT(pod, "ctr-inst", "mesh", "inst")
	if _, err := n.add(t, rt); err != nil {
		t.Fatalf("ADD through the installed conflist: %v", err)
	}
	if !tableIn(t, pod) {
		t.Fatal("pod not captured through the installed conflist")
	}
	if err := n.do(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, n.list, rt) }); err != nil {
		t.Fatal(err)
	}
}

// TestPrivilegedCNIRepairAnnouncesNewestSandbox: a pod whose sandbox was recreated while the
// old one's DEL never reached the agent has two captured records of one pod UID, both netns
// still present (the old one leaked). The dataplane serves one attachment per pod UID, so the
// restarted agent's repair announces only the newest; before, it announced both in file-name
// order, and the stale one, announced last, took the live pod's listeners into the leaked netns.
func TestPrivilegedCNIRepairAnnouncesNewestSandbox(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	state := t.TempDir()
	add := func(ns *testenv.Netns, cid, ip string) {
		t.Helper()
		if _, err := plugin.NewClient(sock).Add(context.Background(), cniv1.Request{Network: "aethertest", Attachment: cniv1.PodAttachment{
			ContainerID: cid, PodUID: "uid-web", Namespace: "mesh", Name: "web", NetnsPath: ns.Path, Interface: "eth0",
			IPs: []netip.Addr{netip.MustParseAddr(ip)}}}); err != nil {
			t.Fatal(err)
		}
	}
	oldNS, newNS := testenv.NewNetns(t), testenv.NewNetns(t)
	first := startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, &recordingDataplane{})
	// The old sandbox's container ID sorts after the new one's, so file order announces it last.
	add(oldNS, "ctr-z-old", "10.244.33.2")
	add(newNS, "ctr-a-new", "10.244.33.3")
	first.stop()

	dp := &recordingDataplane{}
	startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, dp)
	dp.mu.Lock()
	events := slices.Clone(dp.events)
	dp.mu.Unlock()
	if want := []string{"start ctr-a-new", "end ctr-a-new"}; !slices.Equal(events, want) {
		t.Fatalf("repair announced %q, want %q (only the pod's newest sandbox)", events, want)
	}
	// The stale record is kept (its netns exists) and its rules repaired; DEL or GC removes it.
	if !tableIn(t, oldNS) || !tableIn(t, newNS) {
		t.Fatal("capture rules missing after repair")
	}
}

// TestPrivilegedCNIHeldAddDoesNotBlockOtherPods: while one pod's ADD waits for the dataplane
// (Envoy has not ACKed its listeners; the server waits up to DataplaneTimeout, then undoes for
// as long again), an ADD of another pod is served. Before, attachments shared 64 lock shards by
// hash, and "ctr-other-2" shares "ctr-held"'s shard: its ADD waited behind the held one until
// the kubelet's timeout failed it.
func TestPrivilegedCNIHeldAddDoesNotBlockOtherPods(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release()
	dp := &recordingDataplane{hold: map[string]chan struct{}{"ctr-held": gate}}
	a := startAgent(t, sock, t.TempDir(), ServerConfig{}, &staticLookup{}, dp)
	add := func(ctx context.Context, ns *testenv.Netns, cid, ip string) error {
		_, err := plugin.NewClient(sock).Add(ctx, cniv1.Request{Network: "aethertest", Attachment: cniv1.PodAttachment{
			ContainerID: cid, Namespace: "mesh", Name: cid, NetnsPath: ns.Path, Interface: "eth0",
			IPs: []netip.Addr{netip.MustParseAddr(ip)}}})
		return err
	}
	held := make(chan error, 1)
	go func() { held <- add(context.Background(), testenv.NewNetns(t), "ctr-held", "10.244.34.2") }()
	testenv.Eventually(t, 30*time.Second, "the held ADD reaches the dataplane", func() error {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		if !slices.Contains(dp.events, "start ctr-held") {
			return fmt.Errorf("dataplane events %q", dp.events)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := add(ctx, testenv.NewNetns(t), "ctr-other-2", "10.244.34.3"); err != nil {
		t.Fatalf("ADD of another pod while ctr-held's ADD waits for the dataplane: %v", err)
	}
	release()
	if err := <-held; err != nil {
		t.Fatalf("held ADD: %v", err)
	}
	// Locks live only while requested: nothing is left once no request is in flight.
	a.srv.locks.mu.Lock()
	defer a.srv.locks.mu.Unlock()
	if n := len(a.srv.locks.m); n != 0 {
		t.Fatalf("%d attachment locks left with no request in flight", n)
	}
}

// TestPrivilegedCNISocketSurvivesOldAgentShutdown: during a DaemonSet update with maxSurge (or
// any overlap of two agents on a node) the new agent takes over the CNI socket path; the old
// one, stopping afterwards, must not remove the new one's socket. Before, its shutdown removed
// the path (os.Remove, and Go's unlink-on-close), so every later ADD on the node failed with
// "agent unavailable" and STATUS said not ready until the new agent restarted.
func TestPrivilegedCNISocketSurvivesOldAgentShutdown(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	old := startAgent(t, sock, t.TempDir(), ServerConfig{}, &staticLookup{}, &recordingDataplane{})
	startAgent(t, sock, t.TempDir(), ServerConfig{}, &staticLookup{}, &recordingDataplane{})
	old.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := plugin.NewClient(sock).Status(ctx); err != nil {
		t.Fatalf("STATUS of the new agent after the old one stopped: %v", err)
	}
}

// TestPrivilegedCNIGCKeepsAttachmentAddedMeanwhile: a GC that arrives while an ADD is in flight
// (its record saved, Envoy not yet ACKed) cannot have that attachment in its list of valid ones;
// once the ADD succeeds, the GC must leave it alone. Before, GC listed the record, waited for
// the ADD's lock and then released it: the runtime saw the ADD succeed and the pod ran without
// capture rules or listeners.
func TestPrivilegedCNIGCKeepsAttachmentAddedMeanwhile(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	state := t.TempDir()
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release()
	dp := &recordingDataplane{hold: map[string]chan struct{}{"ctr-new": gate}}
	a := startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, dp)
	pod := testenv.NewNetns(t)
	added := make(chan error, 1)
	go func() {
		_, err := plugin.NewClient(sock).Add(context.Background(), cniv1.Request{Network: "aethertest", Attachment: cniv1.PodAttachment{
			ContainerID: "ctr-new", Namespace: "mesh", Name: "new", NetnsPath: pod.Path, Interface: "eth0",
			IPs: []netip.Addr{netip.MustParseAddr("10.244.35.2")}}})
		added <- err
	}()
	waiters := func() int {
		a.srv.locks.mu.Lock()
		defer a.srv.locks.mu.Unlock()
		if l := a.srv.locks.m["ctr-new_eth0"]; l != nil {
			return l.refs
		}
		return 0
	}
	testenv.Eventually(t, 30*time.Second, "the ADD holds its attachment", func() error {
		if waiters() != 1 || len(records(t, state)) != 1 {
			return fmt.Errorf("lock refs %d, records %d", waiters(), len(records(t, state)))
		}
		return nil
	})
	gcDone := make(chan error, 1)
	go func() {
		gcDone <- plugin.NewClient(sock).GC(context.Background(), cniv1.Request{Network: "aethertest", ValidAttachments: []cniv1.Attachment{}})
	}()
	testenv.Eventually(t, 30*time.Second, "the GC waits for the ADD's lock", func() error {
		if waiters() != 2 {
			return fmt.Errorf("lock refs %d", waiters())
		}
		return nil
	})
	release()
	if err := <-added; err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if err := <-gcDone; err != nil {
		t.Fatalf("GC: %v", err)
	}
	if recs := records(t, state); len(recs) != 1 || !tableIn(t, pod) || dp.liveCount() != 1 {
		t.Fatalf("after the GC: %d records, rules %v, %d pods in the dataplane; want the ADDed pod kept", len(recs), tableIn(t, pod), dp.liveCount())
	}
	// A later GC without it releases it.
	if err := plugin.NewClient(sock).GC(context.Background(), cniv1.Request{Network: "aethertest", ValidAttachments: []cniv1.Attachment{}}); err != nil {
		t.Fatal(err)
	}
	if recs := records(t, state); len(recs) != 0 || tableIn(t, pod) {
		t.Fatalf("after a later GC: %d records, rules %v; want none", len(recs), tableIn(t, pod))
	}
}

// TestPrivilegedCNISecondInterfaceRefused: aether-cni put into a second network's conflist too
// (Multus), so one container is ADDed twice, eth0 then net1. The dataplane serves one attachment
// per pod and the capture rules are one table per netns, so the second ADD would rebuild both
// for net1's addresses and take the pod's mesh traffic off eth0. It is refused with an error
// naming the interfaces, and eth0's capture is untouched. Before, it succeeded and replaced it.
func TestPrivilegedCNISecondInterfaceRefused(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	state := t.TempDir()
	dp := &recordingDataplane{}
	startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, dp)
	pod := testenv.NewNetns(t)
	add := func(ifname, ip string) error {
		_, err := plugin.NewClient(sock).Add(context.Background(), cniv1.Request{Network: "aethertest", Attachment: cniv1.PodAttachment{
			ContainerID: "ctr-multi", PodUID: "uid-multi", Namespace: "mesh", Name: "multi", NetnsPath: pod.Path, Interface: ifname,
			IPs: []netip.Addr{netip.MustParseAddr(ip)}}})
		return err
	}
	if err := add("eth0", "10.244.36.2"); err != nil {
		t.Fatal(err)
	}
	before, err := pod.Command("nft", "list", "table", "inet", capture.TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("%v %s", err, before)
	}
	err = add("net1", "192.168.36.2")
	if err == nil || !strings.Contains(err.Error(), "net1") || !strings.Contains(err.Error(), "eth0") {
		t.Fatalf("second ADD of one container on net1 = %v, want an error naming net1 and eth0", err)
	}
	after, err := pod.Command("nft", "list", "table", "inet", capture.TableName).CombinedOutput()
	if err != nil || string(after) != string(before) {
		t.Fatalf("eth0's capture rules changed by the refused ADD (%v):\nbefore %s\nafter %s", err, before, after)
	}
	dp.mu.Lock()
	live := dp.live["ctr-multi"]
	dp.mu.Unlock()
	if recs := records(t, state); len(recs) != 1 || recs[0].Attachment.Interface != "eth0" || len(live.IPs) != 1 || live.IPs[0].String() != "10.244.36.2" {
		t.Fatalf("after the refused ADD: records %d, dataplane pod %+v; want eth0's only", len(recs), live)
	}
	// DEL of the refused attachment (the runtime cleans up a failed ADD) leaves eth0's alone.
	if err := plugin.NewClient(sock).Del(context.Background(), cniv1.Request{Network: "aethertest", Attachment: cniv1.PodAttachment{
		ContainerID: "ctr-multi", NetnsPath: pod.Path, Interface: "net1"}}); err != nil {
		t.Fatal(err)
	}
	if recs := records(t, state); len(recs) != 1 || !tableIn(t, pod) || dp.liveCount() != 1 {
		t.Fatalf("DEL of net1 touched eth0's attachment: records %d, rules %v, dataplane %d", len(recs), tableIn(t, pod), dp.liveCount())
	}
}

// TestPrivilegedCNIRepairLearnsProbePorts: a record an older agent wrote has no probe ports, so
// its pod's strict capture keeps trusting the node on every port (the rules that agent
// installed) while the pod cannot be read; once a repair can read the pod, the record gets the
// pod's probe ports and the node is let in to those only.
func TestPrivilegedCNIRepairLearnsProbePorts(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	state := t.TempDir()
	n := newNode(t, "1.0.0", "10.244.33.0/24", sock, nil)
	first := startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, &recordingDataplane{})
	pod := testenv.NewNetns(t)
	if _, err := n.add(t, podRT(pod, "ctr-old", "mesh", "old")); err != nil {
		t.Fatal(err)
	}
	first.stop()
	ruleset := func() string {
		out, err := pod.Command("nft", "list", "table", "inet", capture.TableName).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v\n%s", err, out)
		}
		return string(out)
	}
	if rs := ruleset(); !strings.Contains(rs, "aether:in-probe-") || strings.Contains(rs, "aether:in-node-") {
		t.Fatalf("a new record's rules: want the node let in to probe ports only:\n%s", rs)
	}
	// What an older agent left: the record without probe ports.
	recs := records(t, state)
	if len(recs) != 1 || !recs[0].ProbesRecorded || !slices.Equal(recs[0].ProbePorts, []uint16{8081}) {
		t.Fatalf("records = %+v, want one with probe ports [8081]", recs)
	}
	old := recs[0]
	old.ProbePorts, old.ProbesRecorded = nil, false
	if err := (&Store{Dir: state}).Save(old); err != nil {
		t.Fatal(err)
	}

	lookup := &staticLookup{}
	lookup.set(nil, errors.New("API server unreachable"))
	second := startAgent(t, sock, state, ServerConfig{LookupTimeout: time.Second}, lookup, &recordingDataplane{})
	if rs := ruleset(); !strings.Contains(rs, "aether:in-node-") || strings.Contains(rs, "aether:in-probe-") {
		t.Fatalf("older record, pod unreadable: want the node trusted on every port, as before:\n%s", rs)
	}
	if recs := records(t, state); recs[0].ProbesRecorded {
		t.Fatalf("record marked with probe ports although the pod could not be read: %+v", recs[0])
	}
	second.stop()

	startAgent(t, sock, state, ServerConfig{}, &staticLookup{}, &recordingDataplane{})
	if rs := ruleset(); !strings.Contains(rs, "aether:in-probe-") || strings.Contains(rs, "aether:in-node-") {
		t.Fatalf("older record, pod read on repair: want the node let in to probe ports only:\n%s", rs)
	}
	if recs := records(t, state); !recs[0].ProbesRecorded || !slices.Equal(recs[0].ProbePorts, []uint16{8081}) {
		t.Fatalf("record after repair = %+v, want probe ports [8081]", recs[0])
	}
}

// racingNodePods is a NodePods fake (the API boundary; KubePods is tested against a real
// kube-apiserver in kube_test.go): once armed, its list runs the ADD of pod "racer" through the
// chain before it answers, as a sandbox that finishes its ADD while a repair pass runs.
type racingNodePods struct {
	mu      sync.Mutex
	armed   bool
	list    []PodRef
	during  func() error
	deleted []string
	listErr error
}

func (f *racingNodePods) MeshedPodsOnNode(context.Context, string) ([]PodRef, error) {
	f.mu.Lock()
	armed, during := f.armed, f.during
	f.armed = false
	f.mu.Unlock()
	if !armed {
		return nil, nil
	}
	err := during()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listErr = err
	return f.list, nil
}

func (f *racingNodePods) DeletePod(_ context.Context, p PodRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, p.Namespace+"/"+p.Name)
	return nil
}

// TestPrivilegedCNIRepairDeletesOnlyUnattachedPods: a repair pass deletes the meshed pod that
// has no attachment (its sandbox ran the primary CNI alone) and leaves the captured pods alone,
// including one whose ADD through aether-cni saved its record after the pass read the records
// and before it listed the node's pods (before, that captured pod was deleted as uncaptured).
func TestPrivilegedCNIRepairDeletesOnlyUnattachedPods(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	n := newNode(t, "1.1.0", "10.244.33.0/24", sock, nil)
	f := &racingNodePods{list: []PodRef{{"mesh", "racer", "uid-racer"}, {"mesh", "captured", "uid-captured"}, {"mesh", "bare", "uid-bare"}}}
	a := startAgentServer(t, sock, t.TempDir(), ServerConfig{NodeName: "node-a"}, &staticLookup{}, &recordingDataplane{},
		func(s *Server) { s.NodePods = f })
	if _, err := n.add(t, podRT(testenv.NewNetns(t), "ctr-captured", "mesh", "captured")); err != nil {
		t.Fatal(err)
	}
	racer := testenv.NewNetns(t)
	f.mu.Lock()
	f.armed = true
	f.during = func() error { _, err := n.add(t, podRT(racer, "ctr-racer", "mesh", "racer")); return err }
	f.mu.Unlock()
	a.srv.RequestRepair()
	testenv.Eventually(t, 30*time.Second, "the repair pass deleting mesh/bare", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !slices.Contains(f.deleted, "mesh/bare") {
			return fmt.Errorf("deleted %v", f.deleted)
		}
		return nil
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		t.Fatalf("ADD of mesh/racer during the pass: %v", f.listErr)
	}
	if !slices.Equal(f.deleted, []string{"mesh/bare"}) {
		t.Fatalf("repair deleted %v, want only mesh/bare (racer and captured have attachments)", f.deleted)
	}
}
