package xds

import (
	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	mutationv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlymutv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	fsmapperv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/cert_mappers/filter_state_override/v3"
	ondemandv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/cert_selectors/on_demand_secret/v3"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// Build turns one mesh model and the current SVIDs of the local pods' identities (keyed by
// SPIFFE ID) into Envoy resources. It is pure: same inputs, same output. It returns an error
// naming the option for options it does not implement (Options.check: EastWestWaypoint with
// CertMatcher), naming the pod when a local pod has no usable address, naming the trust domain
// when bundles (CA certificates, PEM, by trust domain name) lack the mesh's or hold a bad one,
// and any error from marshalling a typed config. A local pod whose SPIFFE ID has no SVID in
// svids is left out, named in Resources.Unserved. A caller that builds again and again (the
// agent, on every model change) should keep a Builder instead, which rebuilds only what changed.
func Build(m *model.Mesh, svids map[string]*identity.SVID, bundles map[string][]byte, opts Options) (*Resources, error) {
	return NewBuilder(opts).Build(m, svids, bundles)
}

// builder builds the resources of one model (a Builder's Build makes one per build): it holds the
// model, the options, the typed configs every build shares, and what the per-pod listeners read
// from the services' assembled routing and endpoints.
type builder struct {
	m    *model.Mesh
	opts Options
	*sharedConfigs
	// Built once per routing and shared by every pod's capture listener (the protos are only
	// read afterwards): the filter-chain matcher and the filter chains (the HTTP chain, then one
	// floor chain per TCP service port).
	captureMatcher *xdsmatcher.Matcher
	captureChains  []*listenerv3.FilterChain
	// captureTLS is the capture listeners' tls_inspector for the ports with TLSRoutes, nil
	// without them (tlsInspector).
	captureTLS *listenerv3.ListenerFilter
	// localEndpoints indexes this cluster's endpoints by pod UID, for the inbound listeners.
	localEndpoints map[string][]model.Endpoint
	// peerTrustDomains are the trust domains whose callers the inbound listeners admit: the
	// mesh's own and Options.PeerTrustDomains, sorted; tdGuard their inbound chains' guard
	// (trustDomainGuard).
	peerTrustDomains []string
	tdGuard          []*listenerv3.Filter
}

// sharedConfigs are the typed configs that every build of one Builder shares: they depend on no
// input of a build, so newSharedConfigs builds them once.
type sharedConfigs struct {
	// selector is the on-demand certificate selector every outbound cluster shares.
	selector *core.TypedExtensionConfig
	// captureHCM and headlessHCM are the HTTP connection managers of the capture HTTP chains
	// captureHTTPChain (RDS CaptureRouteName) and captureHeadlessChain (CaptureHeadlessRouteName).
	captureHCM, headlessHCM *listenerv3.Filter
	// headlessRef is the capture listeners' reference to the ECDS filter HeadlessFilterName.
	headlessRef *listenerv3.ListenerFilter
}

// newSharedConfigs builds the sharedConfigs: the certificate selector, the capture HTTP connection
// managers and the reference to the headless filter. Its only errors
// are from marshalling typed configs.
func newSharedConfigs() (*sharedConfigs, error) {
	mapper, err := xdsproto.ToAny(&fsmapperv3.Config{DefaultValue: "none"})
	if err != nil {
		return nil, err
	}
	sel, err := xdsproto.ToAny(&ondemandv3.Config{
		ConfigSource:      xdsproto.ADS(),
		CertificateMapper: &core.TypedExtensionConfig{Name: "envoy.tls.upstream_certificate_mappers.filter_state_override", TypedConfig: mapper},
	})
	if err != nil {
		return nil, err
	}
	sh := &sharedConfigs{
		selector:    &core.TypedExtensionConfig{Name: "envoy.tls.certificate_selectors.on_demand_secret", TypedConfig: sel},
		headlessRef: headlessRef(),
	}
	early, err := xdsproto.ToAny(&earlymutv3.HeaderMutation{Mutations: []*mutationv3.HeaderMutation{{
		Action: &mutationv3.HeaderMutation_Append{Append: &core.HeaderValueOption{
			Header:       &core.HeaderValue{Key: DstHeader, Value: "%DOWNSTREAM_LOCAL_ADDRESS%"},
			AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}},
	}}})
	if err != nil {
		return nil, err
	}
	cors, err := corsFilter()
	if err != nil {
		return nil, err
	}
	// The capture HTTP chains' connection managers differ only in their route configuration.
	captureHCM := func(route string) (*listenerv3.Filter, error) {
		return hcmFilter(&hcmv3.HttpConnectionManager{
			StatPrefix: "outbound_http",
			RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
				ConfigSource: xdsproto.ADS(), RouteConfigName: route,
			}},
			EarlyHeaderMutationExtensions: []*core.TypedExtensionConfig{{Name: "aether.original-destination", TypedConfig: early}},
		}, cors)
	}
	if sh.captureHCM, err = captureHCM(CaptureRouteName); err != nil {
		return nil, err
	}
	if sh.headlessHCM, err = captureHCM(CaptureHeadlessRouteName); err != nil {
		return nil, err
	}
	return sh, nil
}
