package scenarios

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/e2e/mesh"
	"github.com/aethermesh/aether/internal/testenv"
)

// The identity scenarios of the local SPIRE meshes (mesh.IdentitySPIREShared,
// mesh.IdentitySPIREFederated): what each node's Envoy was given, and where private keys are.

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

// keyFinding is a CA private key found where none may be.
type keyFinding struct{ where, ca string }

// keyScan collects the PEM private keys and CA certificates of what it is given.
type keyScan struct {
	keys    []scannedKey
	cas     []*x509.Certificate
	sources int
}

type scannedKey struct {
	where string
	pub   crypto.PublicKey
}

// base64Run finds base64 text long enough to hold a PEM key (a kubeconfig's client-key-data, a
// Secret in YAML).
var base64Run = regexp.MustCompile(`[A-Za-z0-9+/]{100,}={0,2}`)

// add scans b, found at where: its PEM blocks, the same with JSON's escaped newlines undone, and
// the PEM blocks of every long base64 run it holds, decoded.
func (s *keyScan) add(where string, b []byte) {
	s.sources++
	s.addPEM(where, b)
	if bytes.Contains(b, []byte(`\n`)) {
		s.addPEM(where+" (unescaped)", bytes.ReplaceAll(b, []byte(`\n`), []byte("\n")))
	}
	for _, run := range base64Run.FindAll(b, -1) {
		if d, err := base64.StdEncoding.DecodeString(string(run)); err == nil {
			s.addPEM(where+" (base64)", d)
		}
	}
}

func (s *keyScan) addPEM(where string, b []byte) {
	for {
		i := bytes.Index(b, []byte("-----BEGIN "))
		if i < 0 {
			return
		}
		var blk *pem.Block
		blk, rest := pem.Decode(b[i:])
		if blk == nil {
			b = b[i+len("-----BEGIN "):]
			continue
		}
		b = rest
		switch {
		case blk.Type == "CERTIFICATE":
			if c, err := x509.ParseCertificate(blk.Bytes); err == nil && c.IsCA {
				s.cas = append(s.cas, c)
			}
		case strings.HasSuffix(blk.Type, "PRIVATE KEY"):
			if pub := publicOf(blk.Bytes); pub != nil {
				s.keys = append(s.keys, scannedKey{where: where, pub: pub})
			}
		}
	}
}

// publicOf returns the public key of a PKCS #8, SEC 1 (EC) or PKCS #1 private key, nil when der
// is none of them.
func publicOf(der []byte) crypto.PublicKey {
	var k any
	var err error
	if k, err = x509.ParsePKCS8PrivateKey(der); err != nil {
		if k, err = x509.ParseECPrivateKey(der); err != nil {
			if k, err = x509.ParsePKCS1PrivateKey(der); err != nil {
				return nil
			}
		}
	}
	if s, ok := k.(crypto.Signer); ok {
		return s.Public()
	}
	return nil
}

// addFile scans the regular file at path (up to 16 MiB; larger files are binaries, not keys).
func (s *keyScan) addFile(path string) error {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() || st.Size() > 16<<20 {
		return err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s.add(path, b)
	return nil
}

// addTree scans every regular file under dir (links are not followed: /opt/cni/bin links to the
// machine's binaries; sockets and other special files are skipped).
func (s *keyScan) addTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // a file removed while walking (a pod's, a socket)
			}
			return err
		}
		if d.Type().IsRegular() {
			return s.addFile(p)
		}
		return nil
	})
}

// findings are the keys whose public key is a CA certificate's.
func (s *keyScan) findings() []keyFinding {
	var out []keyFinding
	for _, k := range s.keys {
		for _, ca := range s.cas {
			if pub, ok := k.pub.(interface{ Equal(crypto.PublicKey) bool }); ok && pub.Equal(ca.PublicKey) {
				out = append(out, keyFinding{where: k.where, ca: ca.Subject.String()})
				break
			}
		}
	}
	return out
}

// scanForCAKeys collects, from a local SPIRE mesh: the CA certificates (every SPIRE server's
// bundles, own and federated; the upstream root CA; the substrate's development CA, the API
// servers' and the registry's CAs; every CA certificate in any node Envoy's secrets, SVID
// chains' intermediates included; and every CA certificate the scan itself meets), and the
// private keys of every node's files (the node directories: etc/cni, run/aether, run/spire with
// the SPIRE agent's data, var/lib/aether with the agent's state and Envoy's, var/lib/cni,
// dev/shm), every pod's files, the Secrets of every namespace of both clusters, the command
// lines and environments of the aether agents, registrars and node Envoys, and every file those
// command lines name.
func scanForCAKeys(t *testing.T, w *world, m *mesh.Mesh) *keyScan {
	ctx := context.Background()
	s := &keyScan{}
	for _, c := range m.Clusters {
		tds := []string{""} // its own
		for _, o := range m.Clusters {
			if td := m.TrustDomain(o.Name); td != m.TrustDomain(c.Name) {
				tds = append(tds, td)
			}
		}
		for _, td := range tds {
			b, err := m.SPIRE[c.Name].Bundle(ctx, td, "pem")
			if err != nil {
				t.Fatal(err)
			}
			s.add("SPIRE server of "+c.Name+" bundle "+td, b)
		}
		s.add(c.Name+" API server CA", c.API.CA.CertPEM)
		for _, n := range c.Nodes {
			body, err := w.p.EnvoyAdmin(ctx, c.Name, n.Name, "/config_dump?resource=dynamic_active_secrets")
			if err != nil {
				t.Fatal(err)
			}
			var d envoySecrets
			if err := json.Unmarshal([]byte(body), &d); err != nil {
				t.Fatal(err)
			}
			for _, sec := range d.Configs {
				if tc := sec.Secret.TLSCertificate; tc != nil {
					s.add(n.Name+" Envoy secret "+sec.Name, tc.CertificateChain.InlineBytes)
				}
			}
			if err := s.addTree(n.Root); err != nil {
				t.Fatal(err)
			}
		}
		secrets, err := c.Client.CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, sec := range secrets.Items {
			for k, v := range sec.Data {
				s.add(fmt.Sprintf("%s Secret %s/%s %s", c.Name, sec.Namespace, sec.Name, k), v)
			}
		}
	}
	for _, f := range []string{m.UpstreamCACert, m.Substrate.CACertFile, m.Substrate.RegistryCAFile} {
		if f != "" {
			if err := s.addFile(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.addTree(filepath.Join(m.Substrate.Dir, "pods")); err != nil {
		t.Fatal(err)
	}
	// The aether processes: agents and registrars by their binaries, node Envoys by the pid
	// files their agents keep.
	envoys := map[int]bool{}
	for _, c := range m.Clusters {
		for _, n := range c.Nodes {
			if b, err := os.ReadFile(n.HostPath("/var/lib/aether/envoy/envoy.pid")); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					envoys[pid] = true
				}
			}
		}
	}
	kinds := map[string]int{}
	pids := testenv.ProcsWhere(t, "cmdline", func(pid int, b []byte) bool {
		argv0, _, _ := strings.Cut(string(b), "\x00")
		switch {
		case argv0 == m.Bins["aether-agent"]:
			kinds["aether-agent"]++
		case argv0 == m.Bins["aether-registrar"]:
			kinds["aether-registrar"]++
		case envoys[pid]:
			kinds["envoy"]++
		default:
			return false
		}
		return true
	})
	nodes := len(m.Clusters[0].Nodes) + len(m.Clusters[1].Nodes)
	if kinds["aether-agent"] != nodes || kinds["aether-registrar"] != len(m.Clusters) || kinds["envoy"] != nodes {
		t.Fatalf("found the aether processes %v; want %d agents, %d registrars, %d Envoys", kinds, nodes, len(m.Clusters), nodes)
	}
	for _, pid := range pids {
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
			if err != nil {
				t.Fatal(err)
			}
			s.add(fmt.Sprintf("pid %d %s", pid, f), b)
			if f != "cmdline" {
				continue
			}
			args := strings.Split(string(b), "\x00")
			for _, flag := range []string{"--ca-cert", "--ca-key"} {
				if slices.Contains(args, flag) {
					t.Errorf("pid %d runs with %s: %q", pid, flag, args)
				}
			}
			for _, a := range args[1:] {
				if _, v, ok := strings.Cut(a, "="); ok {
					a = v
				}
				if filepath.IsAbs(a) {
					if err := s.addFile(a); err != nil && !os.IsNotExist(err) {
						t.Fatal(err)
					}
				}
			}
		}
	}
	return s
}

// noCAPrivateKey: on a SPIRE mesh, no CA private key is in any node's files, pod's files,
// Secret, or aether process's command line, environment or the files it names. Every PEM private
// key found (raw, JSON-escaped, or base64 in a kubeconfig or Secret) is compared with every CA
// certificate known (scanForCAKeys). Allowed, because they are outside every node and no aether
// process is given them: the SPIRE servers' own files (<mesh dir>/spire-<cluster>: their
// datastore; their signing keys are in the memory KeyManager), the upstream root CA's key of
// the shared trust domain (<mesh dir>/spire-upstream/ca.key, read by the SPIRE servers' disk
// UpstreamAuthority alone), the substrate's development CA (<run dir>/ca, made by every
// substrate and unused here), the API servers' CAs (<run dir>/<cluster>/apiserver) and the
// registry's. The control: a CA key planted in a node's /var/lib/aether (its certificate in a
// Secret of that cluster) is found, and nothing else.
func (w *world) noCAPrivateKey(t *testing.T, m *mesh.Mesh) {
	ctx := context.Background()
	s := scanForCAKeys(t, w, m)
	for _, f := range s.findings() {
		t.Errorf("CA private key of %q in %s", f.ca, f.where)
	}
	t.Logf("scanned %d sources: %d private keys, %d CA certificates, no CA's key", s.sources, len(s.keys), len(s.cas))

	// The control: a CA key in a node file, the CA's certificate in a Secret.
	ca, err := testenv.NewCA("aether-e2e-planted-ca")
	if err != nil {
		t.Fatal(err)
	}
	n := m.Clusters[0].Nodes[0]
	planted := n.HostPath("/var/lib/aether/planted.key")
	if err := os.WriteFile(planted, ca.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(planted)
	secrets := m.Clusters[0].Client.CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "planted-ca"},
		Data: map[string][]byte{"ca.crt": ca.CertPEM}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = secrets.Delete(ctx, "planted-ca", metav1.DeleteOptions{}) }()
	got := scanForCAKeys(t, w, m).findings()
	if len(got) != 1 || got[0].where != planted {
		t.Fatalf("control: findings %v, want the planted key %s alone", got, planted)
	}
}
