package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/aethermesh/aether/model"
)

// routeCRDRecheck is how often RouteSource looks again for a route CRD that was not installed.
const routeCRDRecheck = 30 * time.Second

// RouteSource watches the cluster's Gateway API mesh routes (HTTPRoute and GRPCRoute,
// gateway.networking.k8s.io/v1, every namespace) for the agent's model. Each kind is watched once
// its CRD is installed: Start looks it up in discovery, and looks again every routeCRDRecheck
// until it is there (docs/routing.md: routes switch on with their CRD). Until then the model has
// no routes of that kind.
type RouteSource struct {
	log      *slog.Logger
	gw       gwclient.Interface
	disc     discovery.DiscoveryInterface
	onChange func()
	recheck  time.Duration

	mu   sync.Mutex
	http gwlisters.HTTPRouteLister
	grpc gwlisters.GRPCRouteLister
}

// NewRouteSource returns a RouteSource; onChange is called on every route add, update or delete
// and when a kind starts being watched (it must not block).
func NewRouteSource(log *slog.Logger, gw gwclient.Interface, disc discovery.DiscoveryInterface, onChange func()) *RouteSource {
	return &RouteSource{log: log, gw: gw, disc: disc, onChange: onChange, recheck: routeCRDRecheck}
}

// Start watches the route kinds whose CRDs are installed, waiting up to syncTimeout for their
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
	r.log.Info("Gateway API route CRDs not installed: those routes are not served until they are", "missing", missing, "recheck", r.recheck)
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
				r.log.Error("watch Gateway API routes", "err", err)
			}
		}
	}()
	return nil
}

// installedRoutes returns which of httproutes and grpcroutes gateway.networking.k8s.io/v1
// serves. A group the API server does not know is no error: neither is installed.
func installedRoutes(disc discovery.DiscoveryInterface) (httpRoutes, grpcRoutes bool, err error) {
	rl, err := disc.ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("discover %s: %w", gwv1.GroupVersion, err)
	}
	for _, res := range rl.APIResources {
		switch res.Name {
		case "httproutes":
			httpRoutes = true
		case "grpcroutes":
			grpcRoutes = true
		}
	}
	return httpRoutes, grpcRoutes, nil
}

// startInstalled starts the informers of the installed kinds not watched yet and returns the
// kinds still missing.
func (r *RouteSource) startInstalled(ctx context.Context, syncTimeout time.Duration) ([]string, error) {
	hasHTTP, hasGRPC, err := installedRoutes(r.disc)
	if err != nil {
		return []string{"httproutes", "grpcroutes"}, err
	}
	r.mu.Lock()
	needHTTP, needGRPC := hasHTTP && r.http == nil, hasGRPC && r.grpc == nil
	r.mu.Unlock()
	f := gwinformers.NewSharedInformerFactory(r.gw, 0)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.onChange() },
		UpdateFunc: func(any, any) { r.onChange() },
		DeleteFunc: func(any) { r.onChange() },
	}
	var synced []cache.InformerSynced
	var hl gwlisters.HTTPRouteLister
	var gl gwlisters.GRPCRouteLister
	if needHTTP {
		inf := f.Gateway().V1().HTTPRoutes()
		if _, err := inf.Informer().AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("route source: %w", err)
		}
		synced, hl = append(synced, inf.Informer().HasSynced), inf.Lister()
	}
	if needGRPC {
		inf := f.Gateway().V1().GRPCRoutes()
		if _, err := inf.Informer().AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("route source: %w", err)
		}
		synced, gl = append(synced, inf.Informer().HasSynced), inf.Lister()
	}
	if len(synced) > 0 {
		f.Start(ctx.Done())
		wctx, cancel := context.WithTimeout(ctx, syncTimeout)
		defer cancel()
		if !cache.WaitForCacheSync(wctx.Done(), synced...) {
			return nil, fmt.Errorf("route source: informers not synced within %s: %w", syncTimeout, context.Cause(wctx))
		}
		r.mu.Lock()
		if hl != nil {
			r.http = hl
		}
		if gl != nil {
			r.grpc = gl
		}
		r.mu.Unlock()
		r.onChange()
	}
	var missing []string
	if !hasHTTP {
		missing = append(missing, "httproutes")
	}
	if !hasGRPC {
		missing = append(missing, "grpcroutes")
	}
	return missing, nil
}

// Fill sets s.HTTPRoutes and s.GRPCRoutes from the watched kinds, sorted by namespace and name
// (listers return shared objects: callers must not change them).
func (r *RouteSource) Fill(s *model.Sources) error {
	r.mu.Lock()
	hl, gl := r.http, r.grpc
	r.mu.Unlock()
	var err error
	s.HTTPRoutes, s.GRPCRoutes = nil, nil
	if hl != nil {
		if s.HTTPRoutes, err = hl.List(labels.Everything()); err != nil {
			return fmt.Errorf("list HTTPRoutes: %w", err)
		}
		slices.SortFunc(s.HTTPRoutes, func(a, b *gwv1.HTTPRoute) int {
			return model.ServiceKey{Namespace: a.Namespace, Name: a.Name}.Compare(model.ServiceKey{Namespace: b.Namespace, Name: b.Name})
		})
	}
	if gl != nil {
		if s.GRPCRoutes, err = gl.List(labels.Everything()); err != nil {
			return fmt.Errorf("list GRPCRoutes: %w", err)
		}
		slices.SortFunc(s.GRPCRoutes, func(a, b *gwv1.GRPCRoute) int {
			return model.ServiceKey{Namespace: a.Namespace, Name: a.Name}.Compare(model.ServiceKey{Namespace: b.Namespace, Name: b.Name})
		})
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
