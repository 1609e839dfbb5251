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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/e2e/mesh"
	"github.com/aethermesh/aether/internal/testenv"
)

// The no-ca-private-key scenario of the local SPIRE meshes: where private keys are.

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

// base64Runs returns the runs of base64 characters in b long enough to hold a PEM key (a
// kubeconfig's client-key-data, a Secret in YAML): 100 or more.
func base64Runs(b []byte) [][]byte {
	var out [][]byte
	start := -1
	for i := 0; i <= len(b); i++ {
		in := i < len(b) && (b[i] >= 'A' && b[i] <= 'Z' || b[i] >= 'a' && b[i] <= 'z' || b[i] >= '0' && b[i] <= '9' ||
			b[i] == '+' || b[i] == '/' || b[i] == '=')
		switch {
		case in && start < 0:
			start = i
		case !in && start >= 0:
			if i-start >= 100 {
				out = append(out, b[start:i])
			}
			start = -1
		}
	}
	return out
}

// add scans b, found at where: its PEM blocks, the same with JSON's escaped newlines undone, and
// the PEM blocks of every long base64 run it holds, decoded.
func (s *keyScan) add(where string, b []byte) {
	s.sources++
	s.addPEM(where, b)
	if bytes.Contains(b, []byte(`\n`)) {
		s.addPEM(where+" (unescaped)", bytes.ReplaceAll(b, []byte(`\n`), []byte("\n")))
	}
	for _, run := range base64Runs(b) {
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
				var pid int
				if _, err := fmt.Sscan(string(b), &pid); err == nil {
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
