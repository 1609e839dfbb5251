package cni

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aethermesh/aether/capture"
)

// TestSetInboundPoliciesFailsClosedPerPod: an entry that cannot be taken is named (pod UID,
// field, value) and fails closed alone: its pod is strict (an invalid pod UID is left out), and
// every other entry is taken and persisted, so one pod's bad policy never stops the others'.
func TestSetInboundPoliciesFailsClosedPerPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		pol  PodInbound
		uid  string
		want string
	}{
		{"bad mode", PodInbound{Mode: "open"}, "uid-a", `pod UID uid-a (made strict): validate capture config: mode "open"`},
		{"port 0", PodInbound{StrictPorts: []uint16{8080, 0}}, "uid-a", "pod UID uid-a (made strict): validate capture config: strictPorts: port 0"},
		{"strict inbound port", PodInbound{Mode: capture.ModePermissive, StrictPorts: []uint16{15008}}, "uid-a", "strictPorts: 15008 is the inboundPort"},
		{"permissive capture port", PodInbound{PermissivePorts: []uint16{15001}}, "uid-a", "permissivePorts: 15001 is the capturePort"},
		{"the node's dns port", PodInbound{PermissivePorts: []uint16{15053}}, "uid-a", "permissivePorts: 15053 is the dnsPort"},
		{"both lists", PodInbound{StrictPorts: []uint16{9090}, PermissivePorts: []uint16{9090}}, "uid-a", "strictPorts and permissivePorts both hold 9090"},
		{"empty uid", PodInbound{Mode: capture.ModeStrict}, "", `pod UID ""`},
		{"uid with a slash", PodInbound{Mode: capture.ModeStrict}, "a/b", `pod UID "a/b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := map[string]PodInbound{tc.uid: tc.pol, "uid-ok": {Mode: capture.ModePermissive, StrictPorts: []uint16{8080}}}
			if _, err := validInbound(set, 15053); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validInbound = %v, want an error with %q", err, tc.want)
			}
			dir := t.TempDir()
			s := &Server{Config: ServerConfig{StateDir: dir, DNSPort: 15053}}
			if err := s.SetInboundPolicies(context.Background(), set); err != nil {
				t.Fatalf("SetInboundPolicies = %v, want the set taken with the bad entry failed closed", err)
			}
			if got := s.inboundOf("uid-ok"); got.Mode != capture.ModePermissive || len(got.StrictPorts) != 1 {
				t.Errorf("the valid entry was not taken: uid-ok has %+v", got)
			}
			got := s.inboundOf(tc.uid)
			if validKeyPart("pod UID", tc.uid) == nil && (got.Mode != capture.ModeStrict || len(got.PermissivePorts) > 0) {
				t.Errorf("the bad entry did not fail closed: %s has %+v, want strict", tc.uid, got)
			}
			m, err := LoadInboundPolicies(dir, 15053)
			if err != nil || m["uid-ok"].Mode != capture.ModePermissive {
				t.Errorf("persisted set = %v, %v; want uid-ok's policy", m, err)
			}
		})
	}
}

// TestInboundPoliciesPersisted: a set is persisted 0600, normalized (ports sorted and
// de-duplicated, entries that change nothing dropped) and loaded back; a fresh server compares
// a set with the persisted one; a missing file is no
// policy; a file that does not parse, of another version, or with a policy the capture refuses
// is an error naming the file.
func TestInboundPoliciesPersisted(t *testing.T) {
	dir := t.TempDir()
	s := &Server{Config: ServerConfig{StateDir: dir}}
	if m, err := LoadInboundPolicies(dir, 0); err != nil || m != nil {
		t.Fatalf("LoadInboundPolicies without a file = %v, %v", m, err)
	}
	if err := s.SetInboundPolicies(context.Background(), map[string]PodInbound{
		"uid-a": {Mode: capture.ModePermissive, StrictPorts: []uint16{9090, 8080, 9090}},
		"uid-b": {},
	}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, inboundStateFile)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file %v, %v; want mode 0600", fi, err)
	}
	m, err := LoadInboundPolicies(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := (PodInbound{Mode: capture.ModePermissive, StrictPorts: []uint16{8080, 9090}}); len(m) != 1 || !m["uid-a"].equal(want) {
		t.Fatalf("loaded %+v, want only uid-a %+v", m, want)
	}
	// A server that has not served yet compares a set with the persisted one: an empty set
	// drops uid-a's policy (and would update its pod), so it is written.
	s2 := &Server{Config: ServerConfig{StateDir: dir}}
	if err := s2.SetInboundPolicies(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if m, err := LoadInboundPolicies(dir, 0); err != nil || len(m) != 0 {
		t.Fatalf("persisted set after an empty set on a fresh server = %v, %v; want none", m, err)
	}
	for _, tc := range []struct{ name, content, want string }{
		{"not JSON", "{", "unexpected end of JSON input"},
		{"another version", `{"version":2,"pods":{}}`, "version 2: want 1"},
		{"refused policy (that pod made strict)", `{"version":1,"pods":{"uid-a":{"permissivePorts":[0]}}}`, "pod UID uid-a (made strict): validate capture config: permissivePorts: port 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := LoadInboundPolicies(dir, 0)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadInboundPolicies = %v, want an error naming %s and %q", err, path, tc.want)
			}
		})
	}
}
