package model

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// selfSigned makes a self-signed server certificate for key with the SAN DNS names given, and
// returns it and the key in PEM (PKCS #8).
func selfSigned(t testing.TB, key crypto.Signer, dnsNames ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "aether test"}, DNSNames: dnsNames,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// testKeys are generated once per test binary: RSA keys take a while.
var testKeys = sync.OnceValue(func() map[string]crypto.Signer {
	must := func(k crypto.Signer, err error) crypto.Signer {
		if err != nil {
			panic(err)
		}
		return k
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	return map[string]crypto.Signer{
		"rsa1024": must(rsa.GenerateKey(rand.Reader, 1024)),
		"rsa2048": must(rsa.GenerateKey(rand.Reader, 2048)),
		"p224":    must(ecdsa.GenerateKey(elliptic.P224(), rand.Reader)),
		"p256":    must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader)),
		"p256b":   must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader)),
		"p384":    must(ecdsa.GenerateKey(elliptic.P384(), rand.Reader)),
		"ed25519": ed,
	}
})

func tlsSecret(crt, key []byte) map[string][]byte {
	return map[string][]byte{"tls.crt": crt, "tls.key": key}
}

// TestCheckCertificate: each problem names the Secret key and the failure; a good certificate
// gives its PEM and its SAN DNS names in lower case.
func TestCheckCertificate(t *testing.T) {
	k := testKeys()
	crt, key := selfSigned(t, k["p256"], "Shop.Example.com", "*.example.com")
	_, otherKey := selfSigned(t, k["p256b"], "x")
	small, smallKey := selfSigned(t, k["rsa1024"], "a")
	p224, p224Key := selfSigned(t, k["p224"], "a")
	for _, tc := range []struct {
		name, typ string
		data      map[string][]byte
		problem   string
	}{
		{"not a TLS secret", "Opaque", tlsSecret(crt, key), `type "Opaque": want kubernetes.io/tls`},
		{"no tls.crt", "kubernetes.io/tls", map[string][]byte{"tls.key": key}, "tls.crt: missing or empty"},
		{"empty tls.key", "kubernetes.io/tls", tlsSecret(crt, nil), "tls.key: missing or empty"},
		{"tls.crt not PEM", "kubernetes.io/tls", tlsSecret([]byte("Hello world\n"), key), "tls.crt: no PEM CERTIFICATE block"},
		{"tls.crt holds the key only", "kubernetes.io/tls", tlsSecret(key, key), "tls.crt: no PEM CERTIFICATE block"},
		{"certificate does not parse", "kubernetes.io/tls", tlsSecret(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}), key),
			"tls.crt: certificate 0 does not parse: x509: malformed certificate"},
		{"tls.key not PEM", "kubernetes.io/tls", tlsSecret(crt, []byte("Hello world\n")), "tls.key: no PEM block"},
		{"key of another certificate", "kubernetes.io/tls", tlsSecret(crt, otherKey), "tls.key: the private key does not match the certificate (the first of tls.crt)"},
		{"key is a certificate", "kubernetes.io/tls", tlsSecret(crt, crt), "tls.key: found a certificate rather than a key in the PEM for the private key"},
		{"RSA 1024", "kubernetes.io/tls", tlsSecret(small, smallKey), "tls.crt: an RSA key of 1024 bits: Envoy serves RSA keys of 2048 bits or more"},
		{"P-224", "kubernetes.io/tls", tlsSecret(p224, p224Key), "tls.crt: an ECDSA key on P-224: Envoy serves P-256, P-384 and P-521"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckCertificate(tc.typ, tc.data)
			if got.Problem != tc.problem {
				t.Errorf("Problem = %q\nwant      %q", got.Problem, tc.problem)
			}
		})
	}
	got := CheckCertificate("kubernetes.io/tls", tlsSecret(crt, key))
	if got.Problem != "" || !slices.Equal(got.Certificate.DNSNames, []string{"shop.example.com", "*.example.com"}) ||
		string(got.Certificate.CertPEM) != string(crt) || string(got.Certificate.KeyPEM) != string(key) {
		t.Errorf("good certificate: %+v, want no problem, the PEM, DNS names shop.example.com, *.example.com", got)
	}
	chain := append(slices.Clone(crt), crt...) // a leaf followed by an intermediate
	if got := CheckCertificate("kubernetes.io/tls", tlsSecret(chain, key)); got.Problem != "" {
		t.Errorf("chain of two: %q, want no problem", got.Problem)
	}
}

// TestCheckCertificateAgreesWithEnvoy: the real Envoy (--mode validate) serves exactly the key
// types CheckCertificate passes, on a Terminate listener built from the Secret's data.
func TestCheckCertificateAgreesWithEnvoy(t *testing.T) {
	for _, name := range []string{"rsa1024", "rsa2048", "p224", "p256", "p384", "ed25519"} {
		t.Run(name, func(t *testing.T) {
			crt, key := selfSigned(t, testKeys()[name], "shop.example.com")
			problem := CheckCertificate("kubernetes.io/tls", tlsSecret(crt, key)).Problem
			out, ok := testenv.ValidateEnvoy(t, tlsListenerConfig(t, crt, key), "error")
			if ok != (problem == "") {
				t.Errorf("CheckCertificate problem %q, but Envoy accepted the certificate: %t\n%s", problem, ok, testenv.Tail(out, 2000))
			}
			if !ok && !strings.Contains(out, "certificate") {
				t.Errorf("Envoy refused the config for another reason than the certificate:\n%s", testenv.Tail(out, 2000))
			}
		})
	}
}

// tlsListenerConfig is an Envoy bootstrap with one TLS-terminating listener presenting crt/key.
func tlsListenerConfig(t *testing.T, crt, key []byte) string {
	t.Helper()
	cfg := map[string]any{"static_resources": map[string]any{
		"listeners": []any{map[string]any{
			"name":    "edge",
			"address": map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": 0}},
			"filter_chains": []any{map[string]any{
				"filters": []any{map[string]any{"name": "tcp", "typed_config": map[string]any{
					"@type":       "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
					"stat_prefix": "edge", "cluster": "backend"}}},
				"transport_socket": map[string]any{"name": "tls", "typed_config": map[string]any{
					"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
					"common_tls_context": map[string]any{"tls_certificates": []any{map[string]any{
						"certificate_chain": map[string]any{"inline_bytes": crt},
						"private_key":       map[string]any{"inline_bytes": key},
					}}},
				}},
			}},
		}},
		"clusters": []any{map[string]any{"name": "backend", "load_assignment": map[string]any{"cluster_name": "backend",
			"endpoints": []any{map[string]any{"lb_endpoints": []any{map[string]any{"endpoint": map[string]any{
				"address": map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": 1}}}}}}}}}},
	}}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
