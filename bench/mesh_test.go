package bench

import (
	"encoding/pem"
	"testing"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/xds"
)

// TestClusterMeshBuilds checks the benchmark's synthetic model builds into valid resources with
// both certificate-selection mechanisms, so that a benchmark run measures a real configuration.
func TestClusterMeshBuilds(t *testing.T) {
	pods := []*model.LocalPod{{UID: "u", Namespace: "bench", Name: "p", ServiceAccount: "sa", NetnsPath: "/var/run/netns/x"}}
	m := clusterMesh(50, pods)
	id := pods[0].SPIFFEID(m.TrustDomain)
	svids := map[string]*identity.SVID{id: {SPIFFEID: id, CertChainPEM: []byte("C"), KeyPEM: []byte("K")}}
	for _, sel := range []xds.CertSelection{xds.CertSelector, xds.CertMatcher} {
		r, err := xds.Build(m, svids, map[string][]byte{m.TrustDomain: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("B")})}, xds.Options{CertSelection: sel})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ValidateAll(); err != nil {
			t.Fatal(err)
		}
		if len(r.Clusters) != 51 || len(r.Endpoints) != 50 {
			t.Errorf("selection %d: %d clusters, %d endpoint sets, want 51 and 50", sel, len(r.Clusters), len(r.Endpoints))
		}
	}
}
