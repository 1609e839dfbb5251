//go:build linux

package xds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"maps"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	beta := newCA(t, "beta CA")
	gamma := newCA(t, "gamma CA")
	partner := newCA(t, "partner CA")
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
		{"the mesh's ID by the mesh's CA", issueSVID(t, f.caPEM, f.td, meshID), true},
		{"beta's ID by beta's CA", issueSVID(t, beta, "beta.example", betaID), true},
		{"the mesh's ID by beta's CA", issueSVID(t, beta, f.td, meshID), false},
		{"beta's ID by the mesh's CA", issueSVID(t, f.caPEM, "beta.example", betaID), false},
		{"gamma's ID by gamma's CA (no bundle)", issueSVID(t, gamma, "gamma.example", gammaID), false},
		{"beta's CA: beta's ID, then a mesh ID", twoSANCert(t, beta, betaID, meshID), false},
		{"beta's CA: a mesh ID, then beta's", twoSANCert(t, beta, meshID, betaID), false},
		{"a partner's ID by its CA (bundle held, not admitted)", issueSVID(t, partner, "partner.example", "spiffe://partner.example/ns/web/sa/alpha"), false},
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

// TestPrivilegedTrustDomainsOutbound is TestPrivilegedTrustDomains' outbound side: a local pod
// calls a clusterset service whose one endpoint, a pod of beta.example's cluster, claims beta's
// ID spiffe://beta.example/ns/x/sa/y. The node's Envoy pins the outbound cluster to that ID and
// validates the server against beta's bundle alone (TrustDomainBundleSecret, pinSecret). The
// server is a Go TLS server in the endpoint's netns that presents, case by case: the pinned ID by
// beta's CA (served); another ID of beta by beta's CA (refused: the SAN pin); the pinned ID, a
// mesh ID, or both in either order, by the mesh's own CA (refused: the validator holds beta's
// bundle alone, which did not sign them); and by beta's CA a mesh ID then the pinned one
// (refused: the first SAN picks the mesh's trust domain, whose bundle the validator lacks). By beta's CA the pinned ID then a
// mesh ID is served: the validator checks the chain against the first URI SAN's trust domain
// (beta) and the pin is met by a SAN beta's CA may sign; the second SAN is a claim beta's CA has
// no authority for, but an outbound connection grants the server nothing by it (its inbound
// counterpart is refused by the trust domain guard, since there it would pass the caller as a
// mesh identity to RBAC and XFCC). Once beta's bundle is gone every certificate is refused,
// the mesh CA's naming a mesh ID first too (beta's secret then holds placeholderBundle). Every
// refusal is Envoy's (ssl.fail_verify_error or ssl.fail_verify_san of the cluster), before the
// handshake completes.
func TestPrivilegedTrustDomainsOutbound(t *testing.T) {
	f := newMeshFixture(t, time.Hour, false, Options{PeerTrustDomains: []string{"beta.example"}})
	beta := newCA(t, "beta CA")
	fed := &federatedProvider{Provider: f.rot.Provider(), extra: map[string][]byte{"beta.example": beta.CertPEM}}
	f.stopAgent()
	f.idp = fed
	f.startAgent()

	alpha, alphaIP := f.addPod("alpha", true)
	remote, remoteIP := f.addPod("remote", false) // beta's pod: not a pod of this node, nor of the model
	presented, handshakes := servePresented(t, remote)

	k := model.ServiceKey{Namespace: "x", Name: "y"}
	vip := netip.MustParseAddr("10.96.0.50")
	pinned := "spiffe://beta.example/ns/x/sa/y"
	meshID := model.SPIFFEID(f.td, "x", "y")
	m := model.New(1, "c1", "mesh", f.td, model.Node{Name: "node-1", IP: netip.MustParseAddr("10.44.0.1")},
		[]*model.Service{{Key: k, Imported: true, ClustersetVIPs: []netip.Addr{vip},
			Ports: []model.ServicePort{{Name: "tcp", Port: 9000, TargetPort: 9000, Protocol: model.ProtocolTCP}}}},
		map[model.ServiceKey][]model.Endpoint{k: {{Service: k, Cluster: "beta", PodName: "y-0", PodUID: "uid-y-0", IPs: []netip.Addr{remoteIP},
			NodeName: "beta-node-1", Ports: []model.EndpointPort{{Name: "tcp", Port: 9000, Protocol: model.ProtocolTCP}}, SPIFFEID: pinned, Healthy: true}}},
		[]*model.LocalPod{{UID: "uid-alpha", Namespace: "shop", Name: "alpha", ServiceAccount: "alpha",
			NetnsPath: alpha.Path, IPs: []netip.Addr{alphaIP}, Ready: true}})
	f.set(m)
	cluster := ClusterName(m, k, 9000)
	cds, err := f.admin("/config_dump?resource=dynamic_active_clusters&name_regex=" + regexp.QuoteMeta(cluster))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"exact": "` + pinned + `"`, `"name": "` + TrustDomainBundleSecret("beta.example") + `"`} {
		if !strings.Contains(cds, want) {
			t.Fatalf("Envoy's cluster %s has no %s:\n%s", cluster, want, cds)
		}
	}
	if strings.Contains(cds, `"exact": "`+meshID+`"`) || strings.Contains(cds, `"name": "`+TrustBundleSecret+`"`) {
		t.Fatalf("Envoy's cluster %s pins more than %s or validates against every bundle:\n%s", cluster, pinned, cds)
	}

	stat := func(s map[string]int, what string) int {
		return s["cluster."+strings.ReplaceAll(cluster, ":", "_")+".ssl."+what]
	}
	call := func(cert tls.Certificate) (int64, int, error) {
		presented.Store(&cert)
		before, statsBefore := handshakes.Load(), f.stats()
		c, err := alpha.Dial(vip.String() + ":9000")
		if err != nil {
			t.Fatal(err) // the capture listener accepts; the upstream leg is what fails
		}
		defer c.Close()
		err = testenv.EchoOnce(c, "to beta")
		statsAfter := f.stats()
		refusals := 0
		for _, what := range []string{"fail_verify_error", "fail_verify_san"} {
			refusals += stat(statsAfter, what) - stat(statsBefore, what)
		}
		return handshakes.Load() - before, refusals, err
	}
	cases := []struct {
		name   string
		cert   tls.Certificate
		served bool
	}{
		{"beta's CA: the pinned ID", issueSVID(t, beta, "beta.example", pinned), true},
		{"beta's CA: another ID of beta", issueSVID(t, beta, "beta.example", "spiffe://beta.example/ns/x/sa/other"), false},
		{"the mesh's CA: the pinned ID", issueSVID(t, f.caPEM, "beta.example", pinned), false},
		{"the mesh's CA: a mesh ID", issueSVID(t, f.caPEM, f.td, meshID), false},
		{"the mesh's CA: the pinned ID, then a mesh ID", twoSANCert(t, f.caPEM, pinned, meshID), false},
		{"the mesh's CA: a mesh ID, then the pinned ID", twoSANCert(t, f.caPEM, meshID, pinned), false},
		{"beta's CA: a mesh ID, then the pinned ID", twoSANCert(t, beta, meshID, pinned), false},
		{"beta's CA: the pinned ID, then a mesh ID", twoSANCert(t, beta, pinned, meshID), true},
		{"beta's CA: the pinned ID, again", issueSVID(t, beta, "beta.example", pinned), true},
	}
	for _, c := range cases {
		n, refusals, err := call(c.cert)
		t.Logf("%s: %v (handshakes completed %d, Envoy's verification failures %d)", c.name, err, n, refusals)
		switch {
		case c.served && (err != nil || n != 1):
			t.Errorf("%s: %v after %d handshakes, want served", c.name, err, n)
		case !c.served && err == nil:
			t.Errorf("%s: served, want refused", c.name)
		case !c.served && (n != 0 || refusals < 1):
			t.Errorf("%s: refused after %d completed handshakes and %d verification failures of Envoy, want Envoy's refusal", c.name, n, refusals)
		}
	}

	// beta's bundle leaves (federation ended): beta's secret holds a placeholder that signs
	// nothing, and no certificate is served, not even the mesh CA's naming a mesh ID first.
	fed.mu.Lock()
	delete(fed.extra, "beta.example")
	fed.mu.Unlock()
	f.set(model.New(2, m.Cluster, m.MeshDomain, m.TrustDomain, m.Node, m.Services, m.Endpoints, m.Pods))
	// The secret follows the clusters' ACK that set waits for.
	testenv.Eventually(t, 30*time.Second, "beta's server refused once its bundle left", func() error {
		if _, _, err := call(cases[0].cert); err == nil {
			return errAdmitted
		}
		return nil
	})
	for _, c := range []struct {
		name string
		cert tls.Certificate
	}{
		{"without beta's bundle, beta's CA: the pinned ID", cases[0].cert},
		{"without beta's bundle, the mesh's CA: a mesh ID, then the pinned ID", cases[5].cert},
		{"without beta's bundle, the mesh's CA: the pinned ID", cases[2].cert},
	} {
		n, refusals, err := call(c.cert)
		t.Logf("%s: %v (handshakes completed %d, Envoy's verification failures %d)", c.name, err, n, refusals)
		if err == nil || n != 0 || refusals < 1 {
			t.Errorf("%s: %v after %d completed handshakes and %d verification failures of Envoy, want Envoy's refusal", c.name, err, n, refusals)
		}
	}
	f.wantNoRejections(t)
}

// issueSVID signs id with the CA ca (an SVID of the development CA over ca's certificate and key),
// whatever trust domain td and id name.
func issueSVID(t testing.TB, ca *testenv.CA, td, id string) tls.Certificate {
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

// twoSANCert signs, by ca, a certificate with the URI SANs ids in that order (an X.509-SVID has
// exactly one: X.509-SVID, section 2), for client and server authentication.
func twoSANCert(t testing.TB, ca *testenv.CA, ids ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}
	for _, id := range ids {
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

var errAdmitted = errorString("still admitted")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestPrivilegedTrustDomainsOutboundMixed: a clusterset service whose endpoints are in two trust
// domains, the mesh's and beta's, on a node that admits a third, gamma. Envoy's cluster pins both
// endpoints' IDs and validates against the bundles of those two trust domains alone
// (TrustDomainBundleSecret of the set), so a certificate of gamma's CA naming a gamma ID first
// (the SPIFFE validator would pick gamma's bundle) and a pinned ID second (the pin matches any
// SAN) is refused; each endpoint's proper certificate is served. Both endpoints are addresses of
// one server, which presents the case's certificate.
func TestPrivilegedTrustDomainsOutboundMixed(t *testing.T) {
	f := newMeshFixture(t, time.Hour, false, Options{PeerTrustDomains: []string{"beta.example", "gamma.example"}})
	beta := newCA(t, "beta CA")
	gamma := newCA(t, "gamma CA")
	f.stopAgent()
	f.idp = &federatedProvider{Provider: f.rot.Provider(), extra: map[string][]byte{"beta.example": beta.CertPEM, "gamma.example": gamma.CertPEM}}
	f.startAgent()

	alpha, alphaIP := f.addPod("alpha", true)
	remote, remoteIP := f.addPod("remote", false)
	second := remoteIP.As4()
	second[3] = 250
	remoteIP2 := netip.AddrFrom4(second)
	if out, err := remote.Command("ip", "addr", "add", remoteIP2.String()+"/24", "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	presented, handshakes := servePresented(t, remote)

	k := model.ServiceKey{Namespace: "x", Name: "y"}
	vip := netip.MustParseAddr("10.96.0.51")
	betaID := "spiffe://beta.example/ns/x/sa/y"
	meshID := model.SPIFFEID(f.td, "x", "y")
	ep := func(cluster, pod string, ip netip.Addr, id string) model.Endpoint {
		return model.Endpoint{Service: k, Cluster: cluster, PodName: pod, PodUID: "uid-" + pod, IPs: []netip.Addr{ip}, NodeName: cluster + "-node-1",
			Ports: []model.EndpointPort{{Name: "tcp", Port: 9000, Protocol: model.ProtocolTCP}}, SPIFFEID: id, Healthy: true}
	}
	m := model.New(1, "c1", "mesh", f.td, model.Node{Name: "node-1", IP: netip.MustParseAddr("10.44.0.1")},
		[]*model.Service{{Key: k, Imported: true, ClustersetVIPs: []netip.Addr{vip},
			Ports: []model.ServicePort{{Name: "tcp", Port: 9000, TargetPort: 9000, Protocol: model.ProtocolTCP}}}},
		map[model.ServiceKey][]model.Endpoint{k: {ep("beta", "y-b", remoteIP, betaID), ep("c2", "y-m", remoteIP2, meshID)}},
		[]*model.LocalPod{{UID: "uid-alpha", Namespace: "shop", Name: "alpha", ServiceAccount: "alpha",
			NetnsPath: alpha.Path, IPs: []netip.Addr{alphaIP}, Ready: true}})
	f.set(m)
	cluster := ClusterName(m, k, 9000)
	set := []string{"beta.example", f.td}
	slices.Sort(set)
	cds, err := f.admin("/config_dump?resource=dynamic_active_clusters&name_regex=" + regexp.QuoteMeta(cluster))
	if err != nil {
		t.Fatal(err)
	}
	if want := `"name": "` + TrustDomainBundleSecret(set...) + `"`; !strings.Contains(cds, want) || !strings.Contains(cds, betaID) || !strings.Contains(cds, meshID) {
		t.Fatalf("Envoy's cluster %s: want both endpoints' IDs pinned and %s:\n%s", cluster, want, cds)
	}

	// Each case is called several times: the cluster balances over the two endpoints.
	call := func(cert tls.Certificate) (served, refused int) {
		presented.Store(&cert)
		for range 6 {
			before := handshakes.Load()
			c, err := alpha.Dial(vip.String() + ":9000")
			if err != nil {
				t.Fatal(err)
			}
			if err := testenv.EchoOnce(c, "mixed"); err == nil && handshakes.Load() > before {
				served++
			} else {
				refused++
			}
			c.Close()
		}
		return served, refused
	}
	for _, c := range []struct {
		name   string
		cert   tls.Certificate
		served bool
	}{
		{"beta's CA: beta's pinned ID", issueSVID(t, beta, "beta.example", betaID), true},
		{"the mesh's CA: the mesh's pinned ID", issueSVID(t, f.caPEM, f.td, meshID), true},
		{"gamma's CA: a gamma ID, then beta's pinned ID", twoSANCert(t, gamma, "spiffe://gamma.example/ns/x/sa/y", betaID), false},
		{"gamma's CA: a gamma ID, then the mesh's pinned ID", twoSANCert(t, gamma, "spiffe://gamma.example/ns/x/sa/y", meshID), false},
		{"gamma's CA: beta's pinned ID", issueSVID(t, gamma, "beta.example", betaID), false},
	} {
		served, refused := call(c.cert)
		t.Logf("%s: %d served, %d refused", c.name, served, refused)
		if c.served && refused > 0 || !c.served && served > 0 {
			t.Errorf("%s: %d served, %d refused; want all %s", c.name, served, refused, map[bool]string{true: "served", false: "refused"}[c.served])
		}
	}
	f.wantNoRejections(t)
}

// servePresented serves, on remote's inbound port (15008, every address), TLS echo with the
// certificate stored in presented (the test's case) and asks for the caller's (Envoy's upstream
// TLS sends the caller's SVID); handshakes counts the handshakes completed. No session tickets: a
// resumed session would skip the verification of the next case's certificate.
func servePresented(t *testing.T, remote *testenv.Netns) (presented *atomic.Pointer[tls.Certificate], handshakes *atomic.Int64) {
	presented, handshakes = new(atomic.Pointer[tls.Certificate]), new(atomic.Int64)
	serveEach(tls.NewListener(remote.Listen(t, "0.0.0.0:15008"), &tls.Config{
		GetCertificate:         func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return presented.Load(), nil },
		ClientAuth:             tls.RequireAnyClientCert,
		SessionTicketsDisabled: true,
	}), func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.(*tls.Conn).Handshake(); err != nil {
			return
		}
		handshakes.Add(1)
		_, _ = io.Copy(c, c)
	})
	return presented, handshakes
}

// newCA makes a CA named name for a test's trust domain (testenv.NewCA), failing t on error.
func newCA(t *testing.T, name string) *testenv.CA {
	t.Helper()
	ca, err := testenv.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}
