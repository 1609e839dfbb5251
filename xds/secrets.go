package xds

import (
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

// bundleSecret is the SDS validation context TrustBundleSecret holding the trust domain's CA
// bundle pem.
func bundleSecret(pem []byte) *tlsv3.Secret {
	return &tlsv3.Secret{Name: TrustBundleSecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: pem}},
	}}}
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
