package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/aethermesh/aether/model"
)

// routeCRDRecheck is how often RouteSource looks again for a route CRD that was not installed.
const routeCRDRecheck = 30 * time.Second

// RouteSource watches the cluster's Gateway API objects (gateway.networking.k8s.io/v1, every
// namespace) for the agent's model: the mesh routes (HTTPRoute, GRPCRoute) and what edge Gateways
// need (GatewayClass, Gateway, ReferenceGrant, TCPRoute, TLSRoute, UDPRoute). Each kind is watched
// once its CRD is installed: Start looks it up in discovery, and looks again every
// routeCRDRecheck until it is there (docs/routing.md: routes switch on with their CRD). Until
// then the model has no objects of that kind.
type RouteSource struct {
	log      *slog.Logger
	gw       gwclient.Interface
	disc     discovery.DiscoveryInterface
	onChange func()
	recheck  time.Duration

	mu        sync.Mutex
	informers map[string]cache.SharedIndexInformer // by resource name, once watched
}

// gatewayKind is one Gateway API kind RouteSource watches: its resource name, its informer and
// where its objects go in the model's sources.
type gatewayKind struct {
	res      string
	informer func(gwinformers.SharedInformerFactory) cache.SharedIndexInformer
	fill     func(objs []any, s *model.Sources)
}

// gatewayKinds are the kinds RouteSource watches.
var gatewayKinds = []gatewayKind{
	{"httproutes", func(f gwinformers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Gateway().V1().HTTPRoutes().Informer()
	},
		func(o []any, s *model.Sources) { s.HTTPRoutes = sortedObjects[*gwv1.HTTPRoute](o) }},
	{"grpcroutes", func(f gwinformers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Gateway().V1().GRPCRoutes().Informer()
	},
		func(o []any, s *model.Sources) { s.GRPCRoutes = sortedObjects[*gwv1.GRPCRoute](o) }},
	{"gatewayclasses", func(f gwinformers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Gateway().V1().GatewayClasses().Informer()
	},
		func(o []any, s *model.Sources) { s.Edge.GatewayClasses = sortedObjects[*gwv1.GatewayClass](o) }},
	{"gateways", func(f gwinformers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Gateway().V1().Gateways().Informer()
	},
		func(o []any, s *model.Sources) { s.Edge.Gateways = sortedObjects[*gwv1.Gateway](o) }},
	{"referencegrants", func(f gwinformers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Gateway().V1().ReferenceGrants().Informer()
	},
		func(o []any, s *model.Sources) { s.Edge.ReferenceGrants = sortedObjects[*gwv1.ReferenceGrant](o) }},
	{"tcproutes", func(f gwinformers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Gateway().V1().TCPRoutes().Informer()
	},
		func(o []any, s *model.Sources) { s.Edge.TCPRoutes = sortedObjects[*gwv1.TCPRoute](o) }},
	{"tlsroutes", func(f gwinformers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Gateway().V1().TLSRoutes().Informer()
	},
		func(o []any, s *model.Sources) { s.Edge.TLSRoutes = sortedObjects[*gwv1.TLSRoute](o) }},
	{"udproutes", func(f gwinformers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Gateway().V1().UDPRoutes().Informer()
	},
		func(o []any, s *model.Sources) { s.Edge.UDPRoutes = sortedObjects[*gwv1.UDPRoute](o) }},
}

// sortedObjects returns the objects of an informer's store as T, sorted by namespace and name
// (they are the store's shared objects: callers must not change them).
func sortedObjects[T interface {
	*E
	GetNamespace() string
	GetName() string
}, E any](objs []any) []T {
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b T) int {
		return model.ServiceKey{Namespace: a.GetNamespace(), Name: a.GetName()}.Compare(model.ServiceKey{Namespace: b.GetNamespace(), Name: b.GetName()})
	})
	return out
}

// NewRouteSource returns a RouteSource; onChange is called on every add, update or delete and
// when a kind starts being watched (it must not block).
func NewRouteSource(log *slog.Logger, gw gwclient.Interface, disc discovery.DiscoveryInterface, onChange func()) *RouteSource {
	return &RouteSource{log: log, gw: gw, disc: disc, onChange: onChange, recheck: routeCRDRecheck, informers: map[string]cache.SharedIndexInformer{}}
}

// Start watches the kinds whose CRDs are installed, waiting up to syncTimeout for their
// informers to sync, and keeps looking for the others until ctx is done. It fails only when an
// installed kind's informer does not sync in time.
func (r *RouteSource) Start(ctx context.Context, syncTimeout time.Duration) error {
	missing, err := r.startInstalled(ctx, syncTimeout)
	if err != nil {
		return err
	}
	if len(missing) == 0 {
		return nil
	}
	r.log.Info("Gateway API CRDs not installed: those kinds are not served until they are", "missing", missing, "recheck", r.recheck)
	go func() {
		t := time.NewTicker(r.recheck)
		defer t.Stop()
		for len(missing) > 0 {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var err error
			if missing, err = r.startInstalled(ctx, syncTimeout); err != nil {
				r.log.Error("watch Gateway API objects", "err", err)
			}
		}
	}()
	return nil
}

// installedKinds returns which resources of gateway.networking.k8s.io/v1 the API server serves.
// A group the API server does not know is no error: none is installed.
func installedKinds(disc discovery.DiscoveryInterface) (map[string]bool, error) {
	rl, err := disc.ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discover %s: %w", gwv1.GroupVersion, err)
	}
	out := map[string]bool{}
	for _, res := range rl.APIResources {
		out[res.Name] = true
	}
	return out, nil
}

// startInstalled starts the informers of the installed kinds not watched yet and returns the
// kinds still missing.
func (r *RouteSource) startInstalled(ctx context.Context, syncTimeout time.Duration) ([]string, error) {
	installed, err := installedKinds(r.disc)
	if err != nil {
		var all []string
		for _, k := range gatewayKinds {
			all = append(all, k.res)
		}
		return all, err
	}
	f := gwinformers.NewSharedInformerFactory(r.gw, 0)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.onChange() },
		UpdateFunc: func(any, any) { r.onChange() },
		DeleteFunc: func(any) { r.onChange() },
	}
	var synced []cache.InformerSynced
	started := map[string]cache.SharedIndexInformer{}
	var missing []string
	r.mu.Lock()
	for _, k := range gatewayKinds {
		switch {
		case r.informers[k.res] != nil:
		case !installed[k.res]:
			missing = append(missing, k.res)
		default:
			inf := k.informer(f)
			if _, err := inf.AddEventHandler(h); err != nil {
				r.mu.Unlock()
				return nil, fmt.Errorf("route source: %w", err)
			}
			started[k.res] = inf
			synced = append(synced, inf.HasSynced)
		}
	}
	r.mu.Unlock()
	if len(synced) > 0 {
		f.Start(ctx.Done())
		wctx, cancel := context.WithTimeout(ctx, syncTimeout)
		defer cancel()
		if !cache.WaitForCacheSync(wctx.Done(), synced...) {
			return nil, fmt.Errorf("route source: informers not synced within %s: %w", syncTimeout, context.Cause(wctx))
		}
		r.mu.Lock()
		maps.Copy(r.informers, started)
		r.mu.Unlock()
		r.onChange()
	}
	return missing, nil
}

// Fill sets the routes and edge objects of s from the watched kinds, each sorted by namespace
// and name (shared objects: callers must not change them); a kind not watched is left empty.
func (r *RouteSource) Fill(s *model.Sources) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	kept := model.EdgeSources{NamespaceLabels: s.Edge.NamespaceLabels, Certificates: s.Edge.Certificates,
		CrossNamespaceCertificates: s.Edge.CrossNamespaceCertificates} // the KubeSource's
	s.HTTPRoutes, s.GRPCRoutes, s.Edge = nil, nil, kept
	for _, k := range gatewayKinds {
		if inf := r.informers[k.res]; inf != nil {
			k.fill(inf.GetStore().List(), s)
		}
	}
	return nil
}

// fillers fills Sources from each of its parts in turn (model.KubeFiller).
type fillers []model.KubeFiller

// Fill calls each part's Fill, stopping at the first error.
func (fs fillers) Fill(s *model.Sources) error {
	for _, f := range fs {
		if err := f.Fill(s); err != nil {
			return err
		}
	}
	return nil
}
