package model

import (
	"context"
	"errors"
	"testing"
	"time"
)

// nodeFiller is a KubeFiller that reports only a Node with topology labels.
type nodeFiller struct{ region, zone string }

func (f nodeFiller) Fill(s *Sources) error {
	s.Node = Node{Name: "n1", Region: f.region, Zone: f.zone}
	return nil
}

// TestAssemblerLocality: the Assembler's Region and Zone replace the Node's labels in the Mesh
// (the agent's registry origin region and --zone), and the labels stay when they are unset.
func TestAssemblerLocality(t *testing.T) {
	for _, c := range []struct {
		name                   string
		cfgRegion, cfgZone     string
		labelRegion, labelZone string
		wantRegion, wantZone   string
	}{
		{"labels only", "", "", "eu", "eu-1", "eu", "eu-1"},
		{"origin region over the label", "default", "", "eu", "eu-1", "default", "eu-1"},
		{"zone flag over the label", "", "z9", "eu", "eu-1", "eu", "z9"},
		{"no labels", "default", "z9", "", "", "default", "z9"},
	} {
		a := NewAssembler(AssemblerConfig{Cluster: "a", MeshDomain: "mesh", Region: c.cfgRegion, Zone: c.cfgZone},
			nodeFiller{c.labelRegion, c.labelZone}, nil, nil)
		if err := a.Rebuild(); err != nil {
			t.Fatal(err)
		}
		if n := a.Current().Node; n.Region != c.wantRegion || n.Zone != c.wantZone {
			t.Errorf("%s: node region %q zone %q, want %q %q", c.name, n.Region, n.Zone, c.wantRegion, c.wantZone)
		}
	}
}

// TestAssemblerWait: Wait returns at once when the current Mesh satisfies it, wakes on the build
// that makes it true (not before), and returns ctx's cause when no build does.
func TestAssemblerWait(t *testing.T) {
	a := NewAssembler(AssemblerConfig{Cluster: "a", MeshDomain: "mesh"}, nodeFiller{"eu", "eu-1"}, nil, nil)
	atLeast := func(v uint64) func(*Mesh) bool { return func(m *Mesh) bool { return m.Version >= v } }

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if m, err := a.Wait(ctx, atLeast(1)); m != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait before the first build = %v, %v; want nil and the deadline", m, err)
	}

	if err := a.Rebuild(); err != nil {
		t.Fatal(err)
	}
	if m, err := a.Wait(context.Background(), atLeast(1)); err != nil || m.Version != 1 {
		t.Fatalf("Wait for the current Mesh = %v, %v; want version 1", m, err)
	}

	got := make(chan *Mesh, 1)
	go func() {
		m, err := a.Wait(context.Background(), atLeast(3))
		if err != nil {
			t.Error(err)
		}
		got <- m
	}()
	if err := a.Rebuild(); err != nil { // version 2: not yet
		t.Fatal(err)
	}
	select {
	case m := <-got:
		t.Fatalf("Wait for version 3 returned %d after build 2", m.Version)
	case <-time.After(50 * time.Millisecond):
	}
	if err := a.Rebuild(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Version != 3 {
			t.Fatalf("Wait returned version %d, want 3", m.Version)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not wake on the build that satisfies it")
	}
}
