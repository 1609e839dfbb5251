package xds

import (
	"strings"
	"testing"

	"github.com/aethermesh/aether/identity"
)

// TestOptionsRefused shows that Build and NewServer refuse option values the builders do not
// implement with an error naming the option and the value (the east-west waypoint's transport
// socket exists only for CertSelector), and accept every supported combination.
func TestOptionsRefused(t *testing.T) {
	m := goldenMesh()
	for _, c := range []struct {
		name string
		opts Options
		want []string // substrings of the error; nil: accepted
	}{
		{"selector", Options{}, nil},
		{"matcher", Options{CertSelection: CertMatcher}, nil},
		{"waypoint with selector", Options{EastWestWaypoint: true}, nil},
		{"waypoint with matcher", Options{EastWestWaypoint: true, CertSelection: CertMatcher}, []string{"EastWestWaypoint", "CertSelection", "CertMatcher"}},
		{"unknown mechanism", Options{CertSelection: 7}, []string{"CertSelection", "CertSelection(7)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := Build(m, fakeSVIDs(m), fakeBundles(m), c.opts)
			_, serr := NewServer(ServerOptions{NodeID: "n", Identity: (&identity.Rotator{}).Provider(), Build: c.opts})
			if c.want == nil {
				if err != nil || r == nil || serr != nil {
					t.Fatalf("Build: %v; NewServer: %v; want both accepted", err, serr)
				}
				return
			}
			for what, e := range map[string]error{"Build": err, "NewServer": serr} {
				if e == nil {
					t.Errorf("%s accepted %+v", what, c.opts)
					continue
				}
				for _, w := range c.want {
					if !strings.Contains(e.Error(), w) {
						t.Errorf("%s error %q does not name %q", what, e, w)
					}
				}
			}
		})
	}
}
