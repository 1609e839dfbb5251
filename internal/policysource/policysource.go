// Package policysource watches one kind of aether's security policies (security.aether.io/v1alpha1,
// every namespace: AuthorizationPolicy, PeerAuthentication) once its CRD is installed, for the
// agent (its model's sources) and the registrar (their status). There is no generated clientset
// for aether's API: the informer lists and watches through the dynamic client and converts each
// object into its typed form (*secv1alpha1.AuthorizationPolicy, ...) as it enters the store (a
// transform), so readers get typed, shared objects. It owns nothing else: no model, no status.
package policysource

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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	secv1alpha1 "github.com/aethermesh/aether/api/aether/security/v1alpha1"
)

// DefaultRecheck is how often a CRD that is not installed is looked for again.
const DefaultRecheck = 30 * time.Second

// Object is the pointer type of a typed kind of security.aether.io (*T).
type Object[T any] interface {
	*T
	metav1.Object
}

// Source watches the objects of one kind (T, at Resource) while their CRD is installed. Set the
// exported fields, then call Start once.
type Source[T any, P Object[T]] struct {
	// Resource is the kind's resource (secv1alpha1.Resource, ...PeerAuthenticationResource);
	// its objects must convert into T. Required.
	Resource schema.GroupVersionResource
	// Dynamic lists and watches the objects. Required.
	Dynamic dynamic.Interface
	// Discovery tells whether the CRD is installed. Required.
	Discovery discovery.DiscoveryInterface
	// Log receives one line when the CRD is missing and one when it is watched. Required.
	Log *slog.Logger
	// OnChange is called on every add, update or delete of an object and once the watch has
	// synced; it must not block (nil: not called).
	OnChange func()
	// Recheck is how often a missing CRD is looked for again (default DefaultRecheck).
	Recheck time.Duration

	mu       sync.Mutex
	informer cache.SharedIndexInformer // nil until watched
	known    bool                      // the CRD was found missing, or is watched and synced
}

// AuthorizationPolicies watches AuthorizationPolicies (Resource secv1alpha1.Resource).
type AuthorizationPolicies = Source[secv1alpha1.AuthorizationPolicy, *secv1alpha1.AuthorizationPolicy]

// PeerAuthentications watches PeerAuthentications (Resource
// secv1alpha1.PeerAuthenticationResource).
type PeerAuthentications = Source[secv1alpha1.PeerAuthentication, *secv1alpha1.PeerAuthentication]

// Installed reports whether discovery lists resource r in its group version. A group version
// the API server does not serve is no error: the CRD is not installed.
func Installed(disc discovery.DiscoveryInterface, r schema.GroupVersionResource) (bool, error) {
	rl, err := disc.ServerResourcesForGroupVersion(r.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s: %w", r.GroupVersion(), err)
	}
	return slices.ContainsFunc(rl.APIResources, func(a metav1.APIResource) bool { return a.Name == r.Resource }), nil
}

// Start watches the policies when their CRD is installed, waiting up to syncTimeout for the
// watch to sync, and otherwise looks for the CRD every Recheck until ctx ends (in a goroutine of
// its own), then watches it. It returns an error when the watch of an installed CRD does not sync
// in time, or when a field is missing. A discovery error leaves the source not Known (callers
// keep what they had, never act as if there were no policies) and is looked up again every
// Recheck; so is a watch that did not sync in time after a late install. The watch runs until
// ctx ends; a CRD deleted meanwhile leaves the last policies in place (the informer retries its
// list).
func (s *Source[T, P]) Start(ctx context.Context, syncTimeout time.Duration) error {
	if s.Resource.Resource == "" || s.Dynamic == nil || s.Discovery == nil || s.Log == nil {
		return fmt.Errorf("policy source %s: Resource, Dynamic, Discovery and Log are required", s.Resource.Resource)
	}
	if s.Recheck <= 0 {
		s.Recheck = DefaultRecheck
	}
	ok, err := Installed(s.Discovery, s.Resource)
	if ok {
		return s.watch(ctx, syncTimeout)
	}
	if err != nil {
		s.Log.Warn(s.Resource.Resource+": discovery failed; not known until it answers, looking again", "recheck", s.Recheck, "err", err)
	} else {
		s.Log.Info(s.Resource.Resource+": the CRD "+s.Resource.GroupResource().String()+" is not installed; no policy applies until it is", "recheck", s.Recheck)
		s.mu.Lock()
		s.known = true
		s.mu.Unlock()
		s.changed()
	}
	go func() {
		t := time.NewTicker(s.Recheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ok, err := Installed(s.Discovery, s.Resource)
			if err != nil {
				continue // not known either way: keep what we know
			}
			if !ok {
				s.mu.Lock()
				first := !s.known
				s.known = true
				s.mu.Unlock()
				if first {
					s.Log.Info(s.Resource.Resource + ": the CRD is not installed; no policy applies until it is")
					s.changed()
				}
				continue
			}
			s.mu.Lock()
			s.known = false // installed, not synced yet
			s.mu.Unlock()
			if err := s.watch(ctx, syncTimeout); err != nil {
				s.Log.Error(s.Resource.Resource+": watch not synced; trying again", "recheck", s.Recheck, "err", err)
				continue
			}
			return
		}
	}()
	return nil
}

// watch starts the informer and waits up to syncTimeout for it to sync.
func (s *Source[T, P]) watch(ctx context.Context, syncTimeout time.Duration) error {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.Dynamic, 0, metav1.NamespaceAll, nil)
	inf := f.ForResource(s.Resource).Informer()
	if err := inf.SetTransform(toTyped[T, P]); err != nil {
		return fmt.Errorf("policy source %s: %w", s.Resource.Resource, err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.changed() },
		UpdateFunc: func(any, any) { s.changed() },
		DeleteFunc: func(any) { s.changed() },
	}); err != nil {
		return fmt.Errorf("policy source %s: %w", s.Resource.Resource, err)
	}
	// The informer runs until ctx ends, or stops here if it does not sync (a retry starts another).
	ictx, stop := context.WithCancel(ctx)
	f.Start(ictx.Done())
	wctx, cancel := context.WithTimeout(ictx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), inf.HasSynced) {
		stop()
		return fmt.Errorf("policy source %s: not synced within %s: %w", s.Resource.Resource, syncTimeout, context.Cause(wctx))
	}
	context.AfterFunc(ctx, stop) // the watch runs until ctx ends
	s.mu.Lock()
	s.informer, s.known = inf, true
	s.mu.Unlock()
	s.Log.Info(s.Resource.Resource+": watching", "group_version", s.Resource.GroupVersion().String())
	s.changed()
	return nil
}

func (s *Source[T, P]) changed() {
	if s.OnChange != nil {
		s.OnChange()
	}
}

// toTyped converts an unstructured object into P (a tombstone's object too). An object that
// does not convert (a field of the wrong type, which the CRD's schema does not let through) is
// kept as it is and left out by Policies.
func toTyped[T any, P Object[T]](obj any) (any, error) {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		p := P(new(T))
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, p); err != nil {
			return o, nil
		}
		return p, nil
	case cache.DeletedFinalStateUnknown:
		t, _ := toTyped[T, P](o.Obj)
		o.Obj = t
		return o, nil
	}
	return obj, nil
}

// Known reports whether the objects are known: the CRD was found missing (none), or it is
// watched and its watch has synced. A reader that must not act on a partial view (the registrar's
// status) waits for it.
func (s *Source[T, P]) Known() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known
}

// Policies returns every watched object, sorted by namespace, then name; none while the CRD is
// not watched. The objects are the store's, shared: callers must not change them.
func (s *Source[T, P]) Policies() []P {
	s.mu.Lock()
	inf := s.informer
	s.mu.Unlock()
	if inf == nil {
		return nil
	}
	var out []P
	for _, o := range inf.GetStore().List() {
		if p, ok := o.(P); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b P) int {
		return cmp.Or(strings.Compare(a.GetNamespace(), b.GetNamespace()), strings.Compare(a.GetName(), b.GetName()))
	})
	return out
}
