package scenarios

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/e2e/mesh"
	"github.com/aethermesh/aether/internal/testenv"
)

// The spire-trust-bundles scenario of the local SPIRE meshes (mesh.IdentitySPIREShared,
// mesh.IdentitySPIREFederated): what each node's Envoy was given.

// envoySecrets is the part of an Envoy /config_dump?resource=dynamic_active_secrets that
// matters here (with resource=, each config is one SecretsConfigDump.DynamicSecret): the SVID
// chains (private keys are redacted) and the SPIFFE validator's trust domains with their
// bundles.
type envoySecrets struct {
	Configs []struct {
		Name   string `json:"name"`
		Secret struct {
			TLSCertificate *struct {
				CertificateChain struct {
					InlineBytes []byte `json:"inline_bytes"`
				} `json:"certificate_chain"`
			} `json:"tls_certificate"`
			ValidationContext *struct {
				CustomValidatorConfig struct {
					TypedConfig struct {
						TrustDomains []struct {
							Name        string `json:"name"`
							TrustBundle struct {
								InlineBytes []byte `json:"inline_bytes"`
							} `json:"trust_bundle"`
						} `json:"trust_domains"`
					} `json:"typed_config"`
				} `json:"custom_validator_config"`
			} `json:"validation_context"`
		} `json:"secret"`
	} `json:"configs"`
}

// nodeSecrets is what node's Envoy holds: its SVID chains by secret name and its trust bundles
// by trust domain.
func nodeSecrets(ctx context.Context, p ClusterPair, cluster, node string) (svids map[string][]*x509.Certificate, bundles map[string][]*x509.Certificate, err error) {
	body, err := p.EnvoyAdmin(ctx, cluster, node, "/config_dump?resource=dynamic_active_secrets")
	if err != nil {
		return nil, nil, err
	}
	var d envoySecrets
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		return nil, nil, fmt.Errorf("decode %s's secrets: %w", node, err)
	}
	svids, bundles = map[string][]*x509.Certificate{}, map[string][]*x509.Certificate{}
	for _, s := range d.Configs {
		if tc := s.Secret.TLSCertificate; tc != nil {
			if svids[s.Name], err = pemCerts(tc.CertificateChain.InlineBytes); err != nil {
				return nil, nil, fmt.Errorf("%s's secret %s: %w", node, s.Name, err)
			}
		}
		if vc := s.Secret.ValidationContext; vc != nil {
			for _, td := range vc.CustomValidatorConfig.TypedConfig.TrustDomains {
				if bundles[td.Name], err = pemCerts(td.TrustBundle.InlineBytes); err != nil {
					return nil, nil, fmt.Errorf("%s's trust bundle of %s: %w", node, td.Name, err)
				}
			}
		}
	}
	return svids, bundles, nil
}

// pemCerts parses every CERTIFICATE block of b.
func pemCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return out, nil
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

// spireTrustBundles: every node's Envoy validates peers with the trust bundles its SPIRE agent
// gave the aether agent (SubscribeToX509Bundles of the Delegated Identity API), and presents
// SVIDs its cluster's SPIRE server signed.
//   - One trust domain (mesh.IdentitySPIREShared): the only bundle is aether.internal's, the
//     upstream root CA alone; every SVID chain is leaf, then an intermediate (the SPIRE server's
//     own signing CA) that the root signed; each cluster's intermediates are its own.
//   - Federation (mesh.IdentitySPIREFederated): each node holds the bundles of both clusters'
//     trust domains, each the very bundle that trust domain's SPIRE server serves; its SVIDs are
//     of its own cluster's trust domain and verify against its own bundle.
func (w *world) spireTrustBundles(t *testing.T, m *mesh.Mesh) {
	ctx := context.Background()
	serverBundle := map[string][]*x509.Certificate{} // by trust domain
	for _, c := range m.Clusters {
		b, err := m.SPIRE[c.Name].Bundle(ctx, "", "pem")
		if err != nil {
			t.Fatal(err)
		}
		certs, err := pemCerts(b)
		if err != nil || len(certs) == 0 {
			t.Fatalf("SPIRE server of %s: bundle %q: %v", c.Name, b, err)
		}
		serverBundle[m.TrustDomain(c.Name)] = certs
	}
	var upstream *x509.Certificate
	if m.Identity == mesh.IdentitySPIREShared {
		b, err := os.ReadFile(m.UpstreamCACert)
		if err != nil {
			t.Fatal(err)
		}
		certs, err := pemCerts(b)
		if err != nil || len(certs) != 1 {
			t.Fatalf("upstream CA %s: %v", m.UpstreamCACert, err)
		}
		upstream = certs[0]
	}
	intermediates := map[string]map[string]bool{} // cluster -> intermediate subject key IDs
	for _, c := range m.Clusters {
		td := m.TrustDomain(c.Name)
		intermediates[c.Name] = map[string]bool{}
		for _, n := range c.Nodes {
			var svids, bundles map[string][]*x509.Certificate
			testenv.Eventually(t, time.Minute, n.Name+"'s Envoy holds the trust bundles", func() error {
				var err error
				if svids, bundles, err = nodeSecrets(ctx, w.p, c.Name, n.Name); err != nil {
					return err
				}
				if got, want := slices.Sorted(maps.Keys(bundles)), slices.Sorted(maps.Keys(serverBundle)); !slices.Equal(got, want) {
					return fmt.Errorf("trust domains %v, want %v", got, want)
				}
				return nil
			})
			for btd, certs := range bundles {
				if !sameCerts(certs, serverBundle[btd]) {
					t.Errorf("%s: trust bundle of %s is not its SPIRE server's (%d certificates, the server's %d)", n.Name, btd, len(certs), len(serverBundle[btd]))
				}
				if upstream != nil && (len(certs) != 1 || !certs[0].Equal(upstream)) {
					t.Errorf("%s: trust bundle of %s is not the upstream root CA alone", n.Name, btd)
				}
			}
			ids := 0
			for name, chain := range svids {
				if len(chain) == 0 || len(chain[0].URIs) != 1 {
					t.Errorf("%s: secret %s: a chain of %d certificates without one URI SAN", n.Name, name, len(chain))
					continue
				}
				id := chain[0].URIs[0].String()
				if !strings.HasPrefix(id, "spiffe://"+td+"/") {
					t.Errorf("%s: secret %s holds an SVID of %s, not of trust domain %s", n.Name, name, id, td)
				}
				roots := x509.NewCertPool()
				for _, r := range bundles[td] {
					roots.AddCert(r)
				}
				inter := x509.NewCertPool()
				for _, ic := range chain[1:] {
					inter.AddCert(ic)
					intermediates[c.Name][fmt.Sprintf("%x", ic.SubjectKeyId)] = true
				}
				if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
					t.Errorf("%s: SVID %s does not verify against the bundle of %s: %v", n.Name, id, td, err)
				}
				if upstream != nil && len(chain) < 2 {
					t.Errorf("%s: SVID %s has no intermediate (its SPIRE server's CA under the upstream root)", n.Name, id)
				}
				ids++
			}
			if ids == 0 {
				t.Errorf("%s's Envoy holds no SVID", n.Name)
			}
			t.Logf("%s: %d SVIDs of %s (%v); trust bundles of %v", n.Name, ids, td, slices.Sorted(maps.Keys(svids)), slices.Sorted(maps.Keys(bundles)))
		}
	}
	if upstream != nil {
		a, b := m.Clusters[0].Name, m.Clusters[1].Name
		for k := range intermediates[a] {
			if intermediates[b][k] {
				t.Errorf("%s and %s sign with the same intermediate %s; want one per SPIRE server", a, b, k)
			}
		}
		t.Logf("intermediates under the upstream root: %s %d, %s %d", a, len(intermediates[a]), b, len(intermediates[b]))
	}
}

// sameCerts reports whether a and b hold the same certificates, in any order.
func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for _, c := range a {
		if !slices.ContainsFunc(b, c.Equal) {
			return false
		}
	}
	return true
}
