//go:build linux

package xds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"maps"
	"math/big"
	"net/netip"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// federatedProvider is a Rotator's Provider with the bundles of other trust domains added (as
// SPIRE's agent sends those its server federates with).
type federatedProvider struct {
	identity.Provider
	mu    sync.Mutex
	extra map[string][]byte
}

func (p *federatedProvider) Bundles() map[string][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.Provider.Bundles()
	maps.Copy(out, p.extra)
	return out
}

// TestPrivilegedTrustDomains checks Envoy's SPIFFE validator on a pod's inbound listener with two
// admitted trust domains (the mesh's and the clusterset's beta.example, Options.PeerTrustDomains):
// a caller of each is admitted with an SVID of its own trust domain's CA; an ID of one trust
// domain signed by the other's CA is refused both ways (the validator picks the bundle by the
// ID's trust domain); a certificate of beta's CA that adds a mesh ID as a second URI SAN is
// refused (the trust domain guard; the validator checks the first SAN's trust domain only); a
// trust domain without a bundle, and a partner whose bundle the provider holds but that is not
// admitted, are refused; and once beta's bundle is gone its callers are refused.
func TestPrivilegedTrustDomains(t *testing.T) {
	f := newMeshFixture(t, time.Hour, true, Options{PeerTrustDomains: []string{"beta.example"}})
	beta, err := testenv.NewCA("beta CA")
	if err != nil {
		t.Fatal(err)
	}
	gamma, err := testenv.NewCA("gamma CA")
	if err != nil {
		t.Fatal(err)
	}
	partner, err := testenv.NewCA("partner CA")
	if err != nil {
		t.Fatal(err)
	}
	fed := &federatedProvider{Provider: f.rot.Provider(), extra: map[string][]byte{"beta.example": beta.CertPEM, "partner.example": partner.CertPEM}}
	f.stopAgent()
	f.idp = fed
	f.startAgent()

	vips := map[string]netip.Addr{"srv": netip.MustParseAddr("10.96.0.40")}
	f.addPod("alpha", false)
	srv, srvIP := f.addPod("srv", false)
	outside, _ := f.addPod("outside", false) // the caller: no capture
	serveEcho(srv.Listen(t, "0.0.0.0:9000"))
	f.set(podAddrMesh(f, 1, vips, "srv"))

	// issue signs id with the CA ca (cert and key PEM), whatever trust domain the ID names.
	issue := func(ca *testenv.CA, td, id string) tls.Certificate {
		t.Helper()
		dev, err := identity.NewDevCA(ca.CertPEM, ca.KeyPEM, td, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		s, err := dev.Issue(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(s.CertChainPEM, s.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// twoSANs signs a certificate with both URI SANs ids, by ca.
	twoSANs := func(ca *testenv.CA, ids ...string) tls.Certificate {
		t.Helper()
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}
		for _, id := range ids {
			u, _ := url.Parse(id)
			tmpl.URIs = append(tmpl.URIs, u)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	meshID := model.SPIFFEID(f.td, "web", "alpha")
	betaID := "spiffe://beta.example/ns/web/sa/alpha"
	gammaID := "spiffe://gamma.example/ns/web/sa/alpha"
	call := func(cert tls.Certificate) error {
		raw, err := outside.Dial(srvIP.String() + ":15008")
		if err != nil {
			return err
		}
		defer raw.Close()
		// Sent whatever CAs the server names as acceptable (crypto/tls would send none).
		tc := tls.Client(raw, &tls.Config{ServerName: "9000", InsecureSkipVerify: true,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }})
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		return testenv.EchoOnce(tc, "across trust domains")
	}
	cases := []struct {
		name   string
		cert   tls.Certificate
		admits bool
	}{
		{"the mesh's ID by the mesh's CA", issue(f.caPEM, f.td, meshID), true},
		{"beta's ID by beta's CA", issue(beta, "beta.example", betaID), true},
		{"the mesh's ID by beta's CA", issue(beta, f.td, meshID), false},
		{"beta's ID by the mesh's CA", issue(f.caPEM, "beta.example", betaID), false},
		{"gamma's ID by gamma's CA (no bundle)", issue(gamma, "gamma.example", gammaID), false},
		{"beta's CA: beta's ID, then a mesh ID", twoSANs(beta, betaID, meshID), false},
		{"beta's CA: a mesh ID, then beta's", twoSANs(beta, meshID, betaID), false},
		{"a partner's ID by its CA (bundle held, not admitted)", issue(partner, "partner.example", "spiffe://partner.example/ns/web/sa/alpha"), false},
	}
	for _, c := range cases {
		err := call(c.cert)
		t.Logf("%s: %v", c.name, err)
		if c.admits && err != nil {
			t.Errorf("%s: %v, want admitted", c.name, err)
		}
		if !c.admits && err == nil {
			t.Errorf("%s: admitted, want refused", c.name)
		}
	}

	// beta's bundle leaves (federation ended): beta's callers are refused.
	fed.mu.Lock()
	delete(fed.extra, "beta.example")
	fed.mu.Unlock()
	f.set(podAddrMesh(f, 2, vips, "srv"))
	testenv.Eventually(t, 30*time.Second, "beta's caller refused once its bundle left", func() error {
		if err := call(cases[1].cert); err == nil {
			return errAdmitted
		}
		return nil
	})
	if err := call(cases[0].cert); err != nil {
		t.Fatalf("the mesh's caller after beta's bundle left: %v", err)
	}
}

var errAdmitted = errorString("still admitted")

type errorString string

func (e errorString) Error() string { return string(e) }
