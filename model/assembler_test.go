package model

import "testing"

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
