package xds

import (
	"errors"
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	runtimev3 "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Resources is one built configuration: every resource for the node's Envoy, by kind, each list
// sorted by name.
type Resources struct {
	Listeners []*listenerv3.Listener
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Routes    []*routev3.RouteConfiguration
	Secrets   []*tlsv3.Secret
	// Extensions are the ECDS resources: HeadlessFilterName, which every capture listener uses
	// (none without local pods).
	Extensions []*core.TypedExtensionConfig
	// Runtimes are the RTDS layers: RuntimeLayerName with Options.PodMaxConnections (none
	// without it).
	Runtimes []*runtimev3.Runtime
	// Warnings say where the resources serve less than the model asks, one sentence each (a
	// frontend's route list Envoy would refuse, answered 500 instead; mirror clusters over the
	// node's bound); the Server logs them when they change.
	Warnings []string
	// Unserved are the local pods left out (no listener, no cluster), each once with its reason,
	// in the model's order: a pod whose SPIFFE ID has no SVID, or (built by a Server) one the
	// identity provider Lacks an SVID of its own for (servedPods).
	Unserved []UnservedPod

	// known holds resources (and shared capture matchers) a Builder carried over unchanged from
	// an earlier build whose ValidateAll passed: ValidateAll skips them.
	known map[any]struct{}
	// validated, when set, is called once ValidateAll passes (the Builder then marks what it
	// built as known to be valid).
	validated func()
}

// UnservedPod is a local pod the resources leave out, and why.
type UnservedPod struct {
	UID, Namespace, Name string
	Reason               string
}

func (r *Resources) isKnown(x any) bool {
	_, ok := r.known[x]
	return ok
}

// chainsKey identifies a list of filter chains by its backing array (the capture listeners share
// one), or is nil for an empty list.
func chainsKey(fcs []*listenerv3.FilterChain) any {
	if len(fcs) == 0 {
		return nil
	}
	return sharedChains{first: &fcs[0], n: len(fcs)}
}

type sharedChains struct {
	first **listenerv3.FilterChain
	n     int
}

// ValidateAll runs the PGV validation (ValidateAll) of every resource and returns every
// violation, naming the resource. Clusters and endpoint sets are validated in parallel (one
// goroutine per CPU); listeners first and alone, since the capture listeners share one
// filter-chain matcher (one entry per VIP and port) and one list of filter chains (one per TCP
// service port), each validated once, then each listener without them. Resources a Builder
// reused from an earlier build that passed ValidateAll are not validated again.
func (r *Resources) ValidateAll() error {
	var errs []error
	check := func(kind, name string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("validate %s %q: %w", kind, name, err))
		}
	}
	// The capture listeners share their matcher and filter chains: each shared part is validated
	// with the first listener that holds it (or not at all when a Builder knows it valid), and
	// the other listeners are validated without it.
	validated := map[any]bool{}
	for _, x := range r.Listeners {
		if r.isKnown(x) {
			continue
		}
		fcm, fcs := x.FilterChainMatcher, x.FilterChains
		mk, ck := any(fcm), chainsKey(fcs)
		skipM := fcm != nil && (validated[mk] || r.isKnown(mk))
		skipC := ck != nil && (validated[ck] || r.isKnown(ck))
		if skipM {
			x.FilterChainMatcher = nil
		}
		if skipC {
			x.FilterChains = nil
		}
		check("listener", x.GetName(), x.ValidateAll())
		x.FilterChainMatcher, x.FilterChains = fcm, fcs
		if fcm != nil {
			validated[mk] = true
		}
		if ck != nil {
			validated[ck] = true
		}
	}
	for _, x := range r.Routes {
		if !r.isKnown(x) {
			check("route", x.GetName(), x.ValidateAll())
		}
	}
	for _, x := range r.Secrets {
		check("secret", x.GetName(), x.ValidateAll())
	}
	for _, x := range r.Extensions {
		if !r.isKnown(x) {
			check("extension config", x.GetName(), validateExtension(x))
		}
	}
	for _, x := range r.Runtimes {
		check("runtime", x.GetName(), x.ValidateAll())
	}
	errs = append(errs, parallelValidate("cluster", r.Clusters, (*clusterv3.Cluster).GetName, r.isKnown)...)
	errs = append(errs, parallelValidate("endpoints", r.Endpoints, (*endpointv3.ClusterLoadAssignment).GetClusterName, r.isKnown)...)
	if len(errs) == 0 && r.validated != nil {
		r.validated()
	}
	return errors.Join(errs...)
}

// validateExtension validates an ECDS resource and the typed config it carries (the
// TypedExtensionConfig's own rules stop at the Any).
func validateExtension(x *core.TypedExtensionConfig) error {
	if err := x.ValidateAll(); err != nil {
		return err
	}
	cfg, err := x.GetTypedConfig().UnmarshalNew()
	if err != nil {
		return fmt.Errorf("unmarshal typed config: %w", err)
	}
	if v, ok := cfg.(interface{ ValidateAll() error }); ok {
		return v.ValidateAll()
	}
	return nil
}

// parallelValidate runs ValidateAll on the xs that skip does not name, in GOMAXPROCS goroutines,
// and returns the violations in input order.
func parallelValidate[T interface{ ValidateAll() error }](kind string, xs []T, name func(T) string, skip func(any) bool) []error {
	out := make([]error, len(xs))
	_ = parallel(len(xs), func(i int) error {
		if skip(xs[i]) {
			return nil
		}
		if err := xs[i].ValidateAll(); err != nil {
			out[i] = fmt.Errorf("validate %s %q: %w", kind, name(xs[i]), err)
		}
		return nil
	})
	var errs []error
	for _, err := range out {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// typed returns the resources by type for cache.NewSnapshot. Every type of snapshotTypes is
// present, empty or not: cache.NewSnapshot versions only the types it is given, and a delta
// response removing a type's last resource would otherwise carry no system version, so its ACK
// could not be told apart (a pod's DEL waited for it in vain).
func (r *Resources) typed() map[resource.Type][]types.Resource {
	return map[resource.Type][]types.Resource{
		resource.ListenerType:        asResources(r.Listeners),
		resource.ClusterType:         asResources(r.Clusters),
		resource.EndpointType:        asResources(r.Endpoints),
		resource.RouteType:           asResources(r.Routes),
		resource.SecretType:          asResources(r.Secrets),
		resource.ExtensionConfigType: asResources(r.Extensions),
		resource.RuntimeType:         asResources(r.Runtimes),
	}
}

// asResources returns xs as a list of types.Resource, empty (not nil) when xs is.
func asResources[T types.Resource](xs []T) []types.Resource {
	out := make([]types.Resource, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// snapshotTypes are the resource types every snapshot carries.
var snapshotTypes = []resource.Type{resource.ListenerType, resource.ClusterType, resource.EndpointType, resource.RouteType, resource.SecretType, resource.ExtensionConfigType, resource.RuntimeType}
