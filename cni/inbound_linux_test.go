//go:build linux

package cni

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedCNIInboundPolicies drives per-pod inbound policies (SetInboundPolicies) through
// the real chain on a node whose default is permissive, with every backend: a permissive pod with
// one strict port refuses plaintext there and accepts it on another port and on 15008; a strict
// pod with one permissive port accepts plaintext there only; a pod not in the set keeps the node
// default; a set re-applies only the pods whose policy changed, without a new ADD, and cuts a
// plaintext connection when its pod turns strict (keeping those of other pods); a pod added after the set gets its policy
// at ADD; a change that failed is applied again by the same call; a restarted agent repairs
// with the persisted set (a pod it had closed stays closed even with its rules gone); a corrupt
// file is refused and the node default applies.
func TestPrivilegedCNIInboundPolicies(t *testing.T) {
	testenv.RequireRoot(t)
	for i, tc := range []struct {
		name    string
		backend capture.Backend
	}{
		{"nftables", capture.NFTables{}},
		{"iptables-nft", capture.IPTables{Mode: capture.IPTablesNFT}},
		{"iptables-legacy", capture.IPTables{Mode: capture.IPTablesLegacy}},
	} {
		t.Run(tc.name, func(t *testing.T) { inboundPolicies(t, tc.backend, 80+i) })
	}
}

func inboundPolicies(t *testing.T, backend capture.Backend, subnet int) {
	sock := filepath.Join(sockDir(t), "cni.sock")
	n := newNode(t, "1.1.0", fmt.Sprintf("10.244.%d.0/24", subnet), sock, map[string]any{"inboundMode": "permissive"})
	state := t.TempDir()
	cfg := ServerConfig{Mode: capture.ModePermissive}
	lookup := &staticLookup{notMesh: map[string]bool{"plain/x": true}}
	pb := &policyBackend{Backend: backend}
	start := func() *agent {
		return startAgentBackend(t, sock, state, cfg, lookup, &recordingDataplane{}, nil, pb)
	}
	ag := start()

	// Meshed pods a, b, c; x is outside the mesh (uncaptured) and dials the others in plaintext.
	pods := map[string]*testenv.Netns{}
	ips := map[string]string{}
	add := func(name string) {
		t.Helper()
		pods[name] = testenv.NewNetns(t)
		ns := "mesh"
		if name == "x" {
			ns = "plain"
		}
		res, err := n.add(t, podRT(pods[name], "ctr-"+name, ns, name))
		if err != nil {
			t.Fatalf("ADD %s: %v", name, err)
		}
		ips[name] = podIP(t, res)
		if name != "x" {
			for _, p := range []string{"8080", "9090", "15008"} {
				listenIn(t, pods[name], ips[name]+":"+p)
			}
		}
	}
	for _, name := range []string{"a", "b", "c", "x"} {
		add(name)
	}
	type dial struct {
		pod, port string
		ok        bool
	}
	expect := func(what string, ds ...dial) {
		t.Helper()
		for _, d := range ds {
			err := dialIn(pods["x"], "", ips[d.pod]+":"+d.port)
			switch {
			case d.ok && err != nil:
				t.Errorf("%s: plaintext x -> %s:%s: %v, want accepted", what, d.pod, d.port, err)
			case !d.ok && !errors.Is(err, syscall.ECONNREFUSED):
				t.Errorf("%s: plaintext x -> %s:%s = %v, want connection refused", what, d.pod, d.port, err)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	set := func(m map[string]PodInbound) {
		t.Helper()
		if err := ag.srv.SetInboundPolicies(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	expect("node default permissive", dial{"a", "8080", true}, dial{"b", "8080", true}, dial{"c", "8080", true})

	// a: permissive (the node default) with strict 8080; b: strict with permissive 9090; c: not
	// in the set. Only a's and b's rules change.
	pb.takeChanged()
	set(map[string]PodInbound{
		"uid-a": {StrictPorts: []uint16{8080}},
		"uid-b": {Mode: capture.ModeStrict, PermissivePorts: []uint16{9090}},
	})
	if got, want := pb.takeChanged(), []string{pods["a"].Path, pods["b"].Path}; !sameSet(got, want) {
		t.Fatalf("rules changed in %v, want only a's and b's %v", got, want)
	}
	expect("policies set",
		dial{"a", "8080", false}, dial{"a", "9090", true}, dial{"a", "15008", true},
		dial{"b", "9090", true}, dial{"b", "8080", false}, dial{"b", "15008", true},
		dial{"c", "8080", true}, dial{"c", "9090", true})
	if fi, err := os.Stat(filepath.Join(state, inboundStateFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("persisted inbound policies: %v, %v; want a 0600 file", fi, err)
	}
	// The same set again changes nothing.
	set(map[string]PodInbound{
		"uid-b": {Mode: capture.ModeStrict, PermissivePorts: []uint16{9090, 9090}},
		"uid-a": {StrictPorts: []uint16{8080}},
	})
	if got := pb.takeChanged(); len(got) != 0 {
		t.Fatalf("the same set changed rules in %v", got)
	}

	// Plaintext connections to a:9191 and c:9191, then a turns strict and b leaves the set
	// (back to the node default): re-applied without a new ADD; a's connection is cut at both
	// ends (the policy refuses it now), c's stands; new ones to a are refused.
	client, server := holdConn(t, pods["x"], pods["a"], ips["a"]+":9191")
	cClient, cServer := holdConn(t, pods["x"], pods["c"], ips["c"]+":9191")
	set(map[string]PodInbound{"uid-a": {Mode: capture.ModeStrict}, "uid-d": {Mode: capture.ModeStrict}})
	if got, want := pb.takeChanged(), []string{pods["a"].Path, pods["b"].Path}; !sameSet(got, want) {
		t.Fatalf("rules changed in %v, want only a's and b's %v", got, want)
	}
	expect("a strict, b back to the node default", dial{"a", "9090", false}, dial{"a", "15008", true}, dial{"b", "8080", true})
	testenv.ExpectClosed(t, server, "a's end of a plaintext connection accepted before a turned strict")
	testenv.ExpectClosed(t, client, "the caller's end of a plaintext connection to a after a turned strict")
	exchange(t, cClient, cServer, "a plaintext connection to c, whose policy did not change")

	// d, added after the set, gets its policy at ADD.
	add("d")
	expect("d added after the set", dial{"d", "8080", false}, dial{"d", "15008", true})

	// A change that did not reach every pod is applied again when the same set is given again.
	pb.fail.Store(true)
	relaxed := map[string]PodInbound{"uid-a": {Mode: capture.ModeStrict, PermissivePorts: []uint16{9090}}, "uid-d": {Mode: capture.ModeStrict}}
	if err := ag.srv.SetInboundPolicies(context.Background(), relaxed); err == nil || !strings.Contains(err.Error(), "mesh/a") {
		t.Fatalf("SetInboundPolicies with the pods' rules unwritable = %v, want an error naming mesh/a", err)
	}
	pb.fail.Store(false)
	set(relaxed)
	expect("the retried change", dial{"a", "9090", true}, dial{"a", "8080", false})
	set(map[string]PodInbound{"uid-a": {Mode: capture.ModeStrict}, "uid-d": {Mode: capture.ModeStrict}})

	// A restarted agent repairs with the persisted set: a and d lose their rules while it is
	// down and come back strict (a permissive node default would have opened them), before
	// any set is given.
	ag.stop()
	for _, name := range []string{"a", "d"} {
		if err := backend.Teardown(pods[name].Path); err != nil {
			t.Fatal(err)
		}
	}
	ag = start()
	expect("after a restart", dial{"a", "8080", false}, dial{"d", "8080", false}, dial{"b", "8080", true})
	exchange(t, cClient, cServer, "the kept connection to c after the restart")

	// An entry that cannot be taken (LoadInboundPolicies names it) fails closed: its pod is
	// strict; a pod the file does not name has the node default.
	ag.stop()
	path := filepath.Join(state, inboundStateFile)
	if err := os.WriteFile(path, []byte(`{"version":1,"pods":{"uid-a":{"mode":"permissive","strictPorts":[15008]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if m, err := LoadInboundPolicies(state, 0); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "strictPorts: 15008") || m["uid-a"].Mode != capture.ModeStrict {
		t.Fatalf("LoadInboundPolicies with a bad entry = %v, %v; want uid-a strict and an error naming %s and strictPorts: 15008", m, err, path)
	}
	ag = start()
	expect("bad entry fails closed", dial{"a", "8080", false}, dial{"d", "8080", true})
	// A file that cannot be read at all: every pod is strict until the policies are set (which
	// pods it had closed is unknown), new ones too.
	ag.stop()
	if err := os.WriteFile(path, []byte(`{"version":1,"pods":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if m, err := LoadInboundPolicies(state, 0); err == nil || m != nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("LoadInboundPolicies of a corrupt file = %v, %v; want an error naming %s and no policies", m, err, path)
	}
	ag = start()
	expect("corrupt file: every pod strict", dial{"a", "8080", false}, dial{"d", "8080", false})
	add("e")
	expect("ADD with a corrupt file", dial{"e", "8080", false})
	// Setting the policies again replaces the corrupt file.
	set(map[string]PodInbound{"uid-a": {Mode: capture.ModeStrict}})
	expect("set after a corrupt file", dial{"a", "8080", false})
	if m, err := LoadInboundPolicies(state, 0); err != nil || len(m) != 1 || m["uid-a"].Mode != capture.ModeStrict {
		t.Fatalf("persisted set after replacing a corrupt file = %v, %v", m, err)
	}
}

// holdConn opens a plaintext connection from client to addr, on a listener it starts in server,
// and returns both ends.
func holdConn(t *testing.T, client, server *testenv.Netns, addr string) (net.Conn, net.Conn) {
	t.Helper()
	l := listenIn(t, server, addr)
	var c net.Conn
	if err := client.Do(func() (err error) {
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("plaintext connection to %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	select {
	case s := <-l:
		t.Cleanup(func() { s.Close() })
		return c, s
	case <-time.After(10 * time.Second):
		t.Fatalf("no connection accepted on %s", addr)
	}
	return nil, nil
}

// exchange sends one byte each way over an established connection; it fails the test, naming
// what, when either does not arrive within 5 s.
func exchange(t *testing.T, client, server net.Conn, what string) {
	t.Helper()
	for _, p := range []struct {
		from, to net.Conn
		dir      string
	}{{client, server, "client to server"}, {server, client, "server to client"}} {
		if _, err := p.from.Write([]byte{7}); err != nil {
			t.Fatalf("%s: write %s: %v", what, p.dir, err)
		}
		_ = p.to.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(p.to, make([]byte, 1)); err != nil {
			t.Fatalf("%s: read %s: %v", what, p.dir, err)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// policyBackend is a capture backend that records the netns paths whose rules an Apply
// changed, and whose Apply fails while fail is set.
type policyBackend struct {
	capture.Backend
	fail    atomic.Bool
	mu      sync.Mutex
	changed []string
}

func (b *policyBackend) Apply(netnsPath string, rs capture.RuleSet) (bool, error) {
	if b.fail.Load() {
		return false, errors.New("rules unwritable (test)")
	}
	changed, err := b.Backend.Apply(netnsPath, rs)
	if changed {
		b.mu.Lock()
		b.changed = append(b.changed, netnsPath)
		b.mu.Unlock()
	}
	return changed, err
}

// takeChanged returns the netns paths changed since the last call.
func (b *policyBackend) takeChanged() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.changed
	b.changed = nil
	return out
}
