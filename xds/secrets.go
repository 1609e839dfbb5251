package xds

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/xdsproto"
)

// InboundSecretName names the copy of a pod's SVID that its inbound listener presents. The
// outbound on-demand certificate selector subscribes to the SVID under its SPIFFE ID; when the
// inbound listener's static SDS subscription already held that same name, Envoy 1.40 (delta ADS)
// never completed the selector's own subscription (the secret stayed warming, upstream TLS
// handshakes timed out). Two names, one certificate.
func InboundSecretName(spiffeID string) string { return "inbound|" + spiffeID }

// svidSecret is the SDS secret name holding the SVID s (certificate chain and private key, inline).
func svidSecret(name string, s *identity.SVID) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: s.CertChainPEM}},
		PrivateKey:       &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: s.KeyPEM}},
	}}}
}

// SPIFFEValidatorName is the certificate validator every peer certificate is checked with
// (CertificateValidationContext.custom_validator_config).
const SPIFFEValidatorName = "envoy.tls.cert_validator.spiffe"

// bundleSecret is the SDS validation context name: Envoy's SPIFFE certificate validator
// (SPIFFEValidatorName, SPIFFECertValidatorConfig.trust_domains) with one trust domain per bundle
// (name -> CA certificates, PEM). The validator picks the bundle by the trust domain of the
// peer's first URI SAN, so one trust domain's CA cannot sign for another's IDs in a certificate
// with one URI SAN (X.509-SVID, section 2); inbound chains refuse certificates naming two trust
// domains (trustDomainGuard), and outbound clusters pinned to one trust domain validate against
// that trust domain's bundle alone (pinSecret). Its only error is from marshalling.
func bundleSecret(name string, bundles map[string][]byte) (*tlsv3.Secret, error) {
	cfg := &tlsv3.SPIFFECertValidatorConfig{}
	for _, td := range slices.Sorted(maps.Keys(bundles)) {
		cfg.TrustDomains = append(cfg.TrustDomains, &tlsv3.SPIFFECertValidatorConfig_TrustDomain{
			Name: td, TrustBundle: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: bundles[td]}}})
	}
	a, err := xdsproto.ToAny(cfg)
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		CustomValidatorConfig: &core.TypedExtensionConfig{Name: SPIFFEValidatorName, TypedConfig: a},
	}}}, nil
}

// TrustDomainBundleSecret names the SDS validation context holding the bundles of the trust
// domains tds alone (one, or a sorted set of several), which outbound clusters pinned to IDs of
// exactly those trust domains validate against: "trust-bundle|<td>[,<td>...]" (a trust domain
// name holds no comma).
func TrustDomainBundleSecret(tds ...string) string {
	return TrustBundleSecret + "|" + strings.Join(tds, ",")
}

// trustSecrets are the validation contexts of a node (or an edge) whose admitted trust domains
// are tds (the mesh's own and the clusterset's others): TrustBundleSecret with the bundles of tds
// (others the provider holds are left out: not trusted); per trust domain of tds
// TrustDomainBundleSecret with its bundle alone; and per set of sets (pinSets: the trust domains
// of each cluster's endpoints' IDs) not made yet TrustDomainBundleSecret of the set with the
// bundles of its trust domains alone, so that a third trust domain's CA, whose certificate names
// one of its own IDs first (the validator picks the bundle by the first URI SAN) and a pinned
// ID second (the pin matches any), is refused. A trust domain without a bundle yet, or not
// admitted, gets placeholderBundle under its name, which admits no certificate at all (the
// mesh's own bundle there would admit a certificate of the mesh's CA naming a mesh ID first and
// an ID of that trust domain second).
func trustSecrets(tds []string, bundles map[string][]byte, sets [][]string) ([]*tlsv3.Secret, error) {
	all := map[string][]byte{}
	for _, td := range tds {
		if b := bundles[td]; len(b) > 0 {
			all[td] = b
		}
	}
	sec, err := bundleSecret(TrustBundleSecret, all)
	if err != nil {
		return nil, err
	}
	out := []*tlsv3.Secret{sec}
	made := map[string]bool{}
	for _, set := range append(sliceOfOne(tds), sets...) {
		name := TrustDomainBundleSecret(set...)
		if made[name] {
			continue
		}
		made[name] = true
		some := map[string][]byte{}
		for _, td := range set {
			if some[td] = all[td]; len(some[td]) == 0 {
				some[td] = placeholderBundle
			}
		}
		sec, err := bundleSecret(name, some)
		if err != nil {
			return nil, err
		}
		out = append(out, sec)
	}
	return out, nil
}

// sliceOfOne returns each of tds as a set of one.
func sliceOfOne(tds []string) [][]string {
	out := make([][]string, len(tds))
	for i, td := range tds {
		out[i] = []string{td}
	}
	return out
}

// pinSets collects, into sets (by TrustDomainBundleSecret name), the trust domains of peers
// (SPIFFE IDs), sorted: the validation context pinSecret names for a cluster pinned to them (an
// admitted trust domain alone has its own already; one not admitted gets the placeholder, so that
// its endpoints are refused by a validation context that exists, not by one Envoy waits for).
func pinSets(sets map[string][]string, peers []string) {
	var tds []string
	for _, id := range peers {
		if td, ok := idTrustDomain(id); ok && !slices.Contains(tds, td) {
			tds = append(tds, td)
		}
	}
	if len(tds) > 0 {
		slices.Sort(tds)
		sets[TrustDomainBundleSecret(tds...)] = tds
	}
}

// idTrustDomain returns the trust domain of the SPIFFE ID (or ID prefix) id, false when id is not
// one.
func idTrustDomain(id string) (string, bool) {
	rest, ok := strings.CutPrefix(id, "spiffe://")
	if !ok {
		return "", false
	}
	td, _, _ := strings.Cut(rest, "/")
	return td, td != ""
}

// sortedSets returns the sets of pinSets in the order of their names.
func sortedSets(sets map[string][]string) [][]string {
	var out [][]string
	for _, k := range slices.Sorted(maps.Keys(sets)) {
		out = append(out, sets[k])
	}
	return out
}

// placeholderBundle is the trust bundle of an admitted trust domain whose bundle the identity
// provider does not hold (yet, or any more): a self-signed CA certificate (PEM) made when the
// process starts, whose private key is dropped as soon as it signed the certificate, so that it
// signs nothing else. The SPIFFE validator needs at least one trust domain
// (SPIFFECertValidatorConfig.trust_domains, min_items 1).
var placeholderBundle = newPlaceholderBundle()

func newPlaceholderBundle() []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic("xds: placeholder trust bundle: " + err.Error())
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "aether placeholder trust bundle (no key)"},
		NotBefore:             time.Unix(0, 0),
		NotAfter:              time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic("xds: placeholder trust bundle: " + err.Error())
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// pinSecret is the validation context an outbound TLS context pinned to pin checks the peer
// against: the bundles of the pin's trust domains alone (TrustDomainBundleSecret of the one, or
// of the sorted set, which trustSecrets makes from pinSets) when every matcher names a SPIFFE ID
// or ID prefix, else TrustBundleSecret.
func pinSecret(pin []*tlsv3.SubjectAltNameMatcher) string {
	var tds []string
	for _, m := range pin {
		v := m.GetMatcher().GetExact()
		if v == "" {
			v = m.GetMatcher().GetPrefix()
		}
		td, ok := idTrustDomain(v)
		if !ok {
			return TrustBundleSecret
		}
		if !slices.Contains(tds, td) {
			tds = append(tds, td)
		}
	}
	if len(tds) == 0 {
		return TrustBundleSecret
	}
	slices.Sort(tds)
	return TrustDomainBundleSecret(tds...)
}

// checkBundles returns an error unless bundles holds a bundle of the mesh's trust domain own,
// and each bundle of the admitted trust domains tds holds a PEM certificate: Envoy would refuse
// the whole secret, and every mTLS handshake of the node with it. Bundles of other trust domains
// are not used, and not checked.
func checkBundles(own string, tds []string, bundles map[string][]byte) error {
	if len(bundles[own]) == 0 {
		return fmt.Errorf("no trust bundle of the mesh's trust domain %q yet (the identity provider has %q)", own, slices.Sorted(maps.Keys(bundles)))
	}
	for _, td := range tds {
		b, ok := bundles[td]
		if !ok {
			continue
		}
		if blk, _ := pem.Decode(b); blk == nil || blk.Type != "CERTIFICATE" {
			return fmt.Errorf("trust bundle %q: no PEM CERTIFICATE block", td)
		}
	}
	return nil
}

// sdsRef names the SDS secret name, fetched over ADS.
func sdsRef(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: xdsproto.ADS()}
}

// peerValidation validates the peer's certificate against the trust bundles of the validation
// context secret (over SDS) and requires a SAN that one of pin matches
// (CertificateValidationContext.match_typed_subject_alt_names; any SAN when pin is empty).
func peerValidation(pin []*tlsv3.SubjectAltNameMatcher, secret string) *tlsv3.CommonTlsContext_CombinedValidationContext {
	return &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
		DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: pin},
		ValidationContextSdsSecretConfig: sdsRef(secret),
	}}
}

// tlsSocket is the transport socket envoy.transport_sockets.tls with the TLS context ctx (an
// UpstreamTlsContext or a DownstreamTlsContext). Its only error is from marshalling ctx.
func tlsSocket(ctx proto.Message) (*core.TransportSocket, error) {
	a, err := xdsproto.ToAny(ctx)
	if err != nil {
		return nil, err
	}
	return &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: a}}, nil
}
