// Package authzsource watches the cluster's AuthorizationPolicies (security.aether.io/v1alpha1,
// every namespace) once their CRD is installed, for the agent (its model's sources) and the
// registrar (their status). There is no generated clientset for aether's API: the informer lists
// and watches through the dynamic client and converts each object into the typed
// *secv1alpha1.AuthorizationPolicy as it enters the store (a transform), so readers get typed,
// shared objects. It owns nothing else: no model, no status.
package authzsource

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	secv1alpha1 "github.com/aethermesh/aether/api/aether/security/v1alpha1"
)

// DefaultRecheck is how often a CRD that is not installed is looked for again.
const DefaultRecheck = 30 * time.Second

// Source watches AuthorizationPolicies while their CRD is installed. Set the exported fields,
// then call Start once.
type Source struct {
	// Dynamic lists and watches the policies. Required.
	Dynamic dynamic.Interface
	// Discovery tells whether the CRD is installed. Required.
	Discovery discovery.DiscoveryInterface
	// Log receives one line when the CRD is missing and one when it is watched. Required.
	Log *slog.Logger
	// OnChange is called on every add, update or delete of a policy and once the watch has
	// synced; it must not block (nil: not called).
	OnChange func()
	// Recheck is how often a missing CRD is looked for again (default DefaultRecheck).
	Recheck time.Duration

	mu       sync.Mutex
	informer cache.SharedIndexInformer // nil until watched
	known    bool                      // the CRD was found missing, or is watched and synced
}

// Installed reports whether discovery lists authorizationpolicies in security.aether.io/v1alpha1.
// A group version the API server does not serve is no error: the CRD is not installed.
func Installed(disc discovery.DiscoveryInterface) (bool, error) {
	rl, err := disc.ServerResourcesForGroupVersion(secv1alpha1.GroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s: %w", secv1alpha1.GroupVersion, err)
	}
	return slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == secv1alpha1.Resource.Resource }), nil
}

// Start watches the policies when their CRD is installed, waiting up to syncTimeout for the
// watch to sync, and otherwise looks for the CRD every Recheck until ctx ends (in a goroutine of
// its own), then watches it. It returns an error when the watch of an installed CRD does not sync
// in time, or when a field is missing. A discovery error at start counts as not installed (it is
// logged, and looked up again). The watch runs until ctx ends; a CRD deleted meanwhile leaves the
// last policies in place (the informer retries its list).
func (s *Source) Start(ctx context.Context, syncTimeout time.Duration) error {
	if s.Dynamic == nil || s.Discovery == nil || s.Log == nil {
		return fmt.Errorf("authorization policy source: Dynamic, Discovery and Log are required")
	}
	if s.Recheck <= 0 {
		s.Recheck = DefaultRecheck
	}
	ok, err := Installed(s.Discovery)
	if ok {
		return s.watch(ctx, syncTimeout)
	}
	if err != nil {
		s.Log.Warn("authorization policies: discovery failed; looking again", "recheck", s.Recheck, "err", err)
	}
	s.Log.Info("authorization policies: the CRD "+secv1alpha1.Resource.GroupResource().String()+" is not installed; no policy applies until it is", "recheck", s.Recheck)
	s.mu.Lock()
	s.known = true
	s.mu.Unlock()
	s.changed()
	go func() {
		t := time.NewTicker(s.Recheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if ok, _ := Installed(s.Discovery); !ok {
				continue
			}
			s.mu.Lock()
			s.known = false // installed, not synced yet
			s.mu.Unlock()
			if err := s.watch(ctx, syncTimeout); err != nil {
				s.Log.Error("authorization policies: watch", "err", err)
			}
			return
		}
	}()
	return nil
}

// watch starts the informer and waits up to syncTimeout for it to sync.
func (s *Source) watch(ctx context.Context, syncTimeout time.Duration) error {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.Dynamic, 0, metav1.NamespaceAll, nil)
	inf := f.ForResource(secv1alpha1.Resource).Informer()
	if err := inf.SetTransform(toTyped); err != nil {
		return fmt.Errorf("authorization policy source: %w", err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.changed() },
		UpdateFunc: func(any, any) { s.changed() },
		DeleteFunc: func(any) { s.changed() },
	}); err != nil {
		return fmt.Errorf("authorization policy source: %w", err)
	}
	f.Start(ctx.Done())
	wctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), inf.HasSynced) {
		return fmt.Errorf("authorization policy source: not synced within %s: %w", syncTimeout, context.Cause(wctx))
	}
	s.mu.Lock()
	s.informer, s.known = inf, true
	s.mu.Unlock()
	s.Log.Info("authorization policies: watching", "group_version", secv1alpha1.GroupVersion.String())
	s.changed()
	return nil
}

func (s *Source) changed() {
	if s.OnChange != nil {
		s.OnChange()
	}
}

// toTyped converts an unstructured AuthorizationPolicy into *secv1alpha1.AuthorizationPolicy
// (a tombstone's object too). An object that does not convert (a field of the wrong type, which
// the CRD's schema does not let through) is kept as it is and left out by Policies.
func toTyped(obj any) (any, error) {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		p := &secv1alpha1.AuthorizationPolicy{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, p); err != nil {
			return o, nil
		}
		return p, nil
	case cache.DeletedFinalStateUnknown:
		t, _ := toTyped(o.Obj)
		o.Obj = t
		return o, nil
	}
	return obj, nil
}

// Known reports whether the policies are known: the CRD was found missing (no policy), or it is
// watched and its watch has synced. A reader that must not act on a partial view (the registrar's
// status) waits for it.
func (s *Source) Known() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known
}

// Policies returns every watched policy, sorted by namespace, then name; none while the CRD is
// not watched. The objects are the store's, shared: callers must not change them.
func (s *Source) Policies() []*secv1alpha1.AuthorizationPolicy {
	s.mu.Lock()
	inf := s.informer
	s.mu.Unlock()
	if inf == nil {
		return nil
	}
	var out []*secv1alpha1.AuthorizationPolicy
	for _, o := range inf.GetStore().List() {
		if p, ok := o.(*secv1alpha1.AuthorizationPolicy); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *secv1alpha1.AuthorizationPolicy) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}
