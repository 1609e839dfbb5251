package model

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// CheckCertificate checks a certificateRef's Secret, given its type and data, as a Terminate
// listener needs it: type kubernetes.io/tls (Gateway API v1.6.3, ListenerTLSConfig
// certificateRefs: "Core - A single reference to a Kubernetes Secret of type
// kubernetes.io/tls"), tls.crt and tls.key present, every CERTIFICATE block of tls.crt parsing as
// X.509, the first being the leaf, tls.key a PEM private key matching the leaf, and a leaf key
// Envoy serves (RSA of 2048 bits or more, ECDSA on P-256, P-384 or P-521, or Ed25519; Envoy
// refuses smaller RSA keys and other curves). The Problem names the data key and the failure; with
// none, Certificate holds the PEM data and the leaf's SAN DNS names in lower case (its Ref is the
// caller's to fill).
func CheckCertificate(secretType string, data map[string][]byte) CertificateState {
	problem := func(format string, args ...any) CertificateState {
		return CertificateState{Problem: fmt.Sprintf(format, args...)}
	}
	if secretType != string(corev1.SecretTypeTLS) {
		return problem("type %q: want %s", secretType, corev1.SecretTypeTLS)
	}
	crt, key := data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey]
	switch {
	case len(crt) == 0:
		return problem("%s: missing or empty", corev1.TLSCertKey)
	case len(key) == 0:
		return problem("%s: missing or empty", corev1.TLSPrivateKeyKey)
	}
	var chain []*x509.Certificate
	for rest := crt; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return problem("%s: certificate %d does not parse: %v", corev1.TLSCertKey, len(chain), err)
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return problem("%s: no PEM CERTIFICATE block", corev1.TLSCertKey)
	}
	if b, _ := pem.Decode(key); b == nil {
		return problem("%s: no PEM block", corev1.TLSPrivateKeyKey)
	}
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		if strings.Contains(err.Error(), "does not match") {
			return problem("%s: the private key does not match the certificate (the first of %s)", corev1.TLSPrivateKeyKey, corev1.TLSCertKey)
		}
		return problem("%s: %s", corev1.TLSPrivateKeyKey, strings.TrimPrefix(err.Error(), "tls: "))
	}
	leaf := chain[0]
	switch k := leaf.PublicKey.(type) {
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < 2048 {
			return problem("%s: an RSA key of %d bits: Envoy serves RSA keys of 2048 bits or more", corev1.TLSCertKey, n)
		}
	case *ecdsa.PublicKey:
		if c := k.Curve; c != elliptic.P256() && c != elliptic.P384() && c != elliptic.P521() {
			return problem("%s: an ECDSA key on %s: Envoy serves P-256, P-384 and P-521", corev1.TLSCertKey, c.Params().Name)
		}
	}
	out := CertificateState{Certificate: Certificate{CertPEM: crt, KeyPEM: key}}
	for _, n := range leaf.DNSNames {
		out.Certificate.DNSNames = append(out.Certificate.DNSNames, strings.ToLower(n))
	}
	return out
}
