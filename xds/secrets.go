package xds

import (
	"encoding/pem"
	"fmt"
	"maps"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
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

// bundleSecret is the SDS validation context TrustBundleSecret: Envoy's SPIFFE certificate
// validator (SPIFFEValidatorName, SPIFFECertValidatorConfig.trust_domains) with one trust domain
// per bundle (name -> CA certificates, PEM), the mesh's own and the federated ones. The validator
// picks the bundle by the trust domain of the peer's SPIFFE ID, so no trust domain's CA can
// vouch for another's IDs (SPIFFE X.509-SVID, section 5). Its only error is from marshalling.
func bundleSecret(bundles map[string][]byte) (*tlsv3.Secret, error) {
	cfg := &tlsv3.SPIFFECertValidatorConfig{}
	for _, td := range slices.Sorted(maps.Keys(bundles)) {
		cfg.TrustDomains = append(cfg.TrustDomains, &tlsv3.SPIFFECertValidatorConfig_TrustDomain{
			Name: td, TrustBundle: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: bundles[td]}}})
	}
	a, err := xdsproto.ToAny(cfg)
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	return &tlsv3.Secret{Name: TrustBundleSecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		CustomValidatorConfig: &core.TypedExtensionConfig{Name: SPIFFEValidatorName, TypedConfig: a},
	}}}, nil
}

// checkBundles returns an error unless bundles holds a bundle of the mesh's trust domain td and
// every bundle is named by a trust domain and holds at least one PEM certificate: Envoy would
// refuse the whole secret, and every mTLS handshake of the node with it.
func checkBundles(td string, bundles map[string][]byte) error {
	if len(bundles[td]) == 0 {
		return fmt.Errorf("no trust bundle of the mesh's trust domain %q yet (the identity provider has %q)", td, slices.Sorted(maps.Keys(bundles)))
	}
	for name, b := range bundles {
		if _, err := spiffeid.TrustDomainFromString(name); err != nil {
			return fmt.Errorf("trust bundle %q: %w", name, err)
		}
		if blk, _ := pem.Decode(b); blk == nil || blk.Type != "CERTIFICATE" {
			return fmt.Errorf("trust bundle %q: no PEM CERTIFICATE block", name)
		}
	}
	return nil
}

// sdsRef names the SDS secret name, fetched over ADS.
func sdsRef(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: xdsproto.ADS()}
}

// peerValidation validates the peer's certificate against the trust bundle (TrustBundleSecret,
// over SDS) and requires a SAN that one of pin matches
// (CertificateValidationContext.match_typed_subject_alt_names; any SAN when pin is empty).
func peerValidation(pin []*tlsv3.SubjectAltNameMatcher) *tlsv3.CommonTlsContext_CombinedValidationContext {
	return &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
		DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: pin},
		ValidationContextSdsSecretConfig: sdsRef(TrustBundleSecret),
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
