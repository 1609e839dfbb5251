package gateway

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/aethermesh/aether/model"
)

// FieldOwner is the server-side apply field manager of the objects the controller writes.
const FieldOwner = "aether-registrar"

// AnnotationAppliedHash is set on every object the controller applies: the first 16 hex digits
// of the SHA-256 of the object as applied (without this annotation). An object whose annotation
// equals the hash of what the controller would apply is not applied again.
const AnnotationAppliedHash = "aether.io/applied-hash"

// DefaultPassDelay is how long a pass waits after the change that asks for it.
const DefaultPassDelay = 200 * time.Millisecond

// syncAll is the one request of the controller's queue: every change asks for the same pass.
var syncAll = reconcile.Request{}

// View is one consistent read of the cluster's Gateway API objects and what
// model.ResolveGateways found in it: what the route status controller (registrar/routestatus),
// which reads them and resolves the routes, hands the Controller after each of its passes. Every
// object is shared with an informer's cache and read only.
type View struct {
	// Classes and Gateways are every GatewayClass and every Gateway of the cluster.
	Classes  []*gwv1.GatewayClass
	Gateways []*gwv1.Gateway
	// Edges and Statuses are model.ResolveGateways's edge Gateways and Gateway statuses (none
	// when no Gateway is aether's).
	Edges    []*model.EdgeGateway
	Statuses []model.GatewayStatus
}

// Controller applies the Views it is handed (SetView): for every GatewayClass whose
// controllerName is aether's, its Accepted condition (ClassConditions); for every Gateway of a
// class aether accepts (Accepts), its edge data plane, a ServiceAccount, a Deployment and a
// Service (ServiceAccount, Deployment, Service; all named <gw>-aether-edge, owned by the Gateway,
// labelled Labels) and its status (Status, from the View's model.GatewayStatus, the Deployment's
// available replicas and the Service's addresses); and, in Namespace, a copy of every certificate
// the View's edge Gateways serve (CertificateCopy), for the agents.
//
// Each object is written by server-side apply (field manager FieldOwner, forcing ownership) when
// it is missing or its AnnotationAppliedHash differs from what would be applied, so a pass that
// changes nothing writes nothing; a hand edit of a field it sets (kubectl scale) therefore stays
// until the Gateway or the registrar's configuration changes, or the object is deleted. A Gateway
// whose name cannot name its edge objects (NameProblem) gets none, and Programmed=False, Invalid. A provisioned object of a Gateway that is gone or whose class is
// no longer aether's (labelled aether.io/managed-by: aether and gateway-name, named after the
// Gateway) is deleted, as is a certificate copy no edge Gateway serves any more. Statuses are
// written only when they differ, and only for the Gateway generation the View resolved.
//
// One pass covers everything; it runs PassDelay after a View arrives or one of the provisioned
// objects or certificate copies changes (their events asked for through the manager's cache),
// on the elected leader only. Before the first View it does nothing, so a starting registrar
// deletes nothing.
type Controller struct {
	// Client reads the provisioned objects and Secrets from the manager's cache and writes them.
	// Required.
	Client client.Client
	// Gateway writes GatewayClass and Gateway status. Required.
	Gateway gwclient.Interface
	// Namespace is the registrar's namespace, where the certificate copies live. Required.
	Namespace string
	// EnvoyImage is the edge Envoy's image (the agent DaemonSet's envoy container's). Required.
	EnvoyImage string
	// AddressCIDRs are the ranges a Gateway's spec.addresses may ask for (ExternalIPs); none by
	// default (--gateway-address-cidrs).
	AddressCIDRs []netip.Prefix
	// Log receives the controller's logs. Required.
	Log *slog.Logger
	// PassDelay is how long a pass waits after the first change that asks for it (default
	// DefaultPassDelay).
	PassDelay time.Duration
	// RateLimiter, when set, replaces the default back-off of a pass that failed.
	RateLimiter workqueue.TypedRateLimiter[reconcile.Request]
	// SkipNameValidation allows several controllers of this name in one process (tests).
	SkipNameValidation bool

	mu   sync.Mutex
	view *View
	kick func()
}

var _ reconcile.Reconciler = &Controller{}

// SetView hands the controller the View to apply; a pass follows. v's contents are not changed.
func (c *Controller) SetView(v View) {
	c.mu.Lock()
	c.view = &v
	kick := c.kick
	c.mu.Unlock()
	if kick != nil {
		kick()
	}
}

// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gatewayclasses/status;gateways/status,verbs=update;patch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gateways/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=aether-system,resources=secrets,verbs=create;update;patch;delete

// Reconcile makes one pass over the last View (the request is ignored: there is one). It returns
// the errors of what it could not write, joined (the pass is retried with back-off).
func (c *Controller) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	c.mu.Lock()
	v := c.view
	c.mu.Unlock()
	if v == nil {
		return reconcile.Result{}, nil
	}
	now := metav1.Now()
	var errs []error
	accepted := map[string]bool{}
	for _, gc := range v.Classes {
		if gc.Spec.ControllerName != model.GatewayControllerName {
			continue
		}
		accepted[gc.Name] = Accepts(gc)
		errs = append(errs, c.classStatus(ctx, gc, now))
	}
	statuses := map[model.GatewayKey]model.GatewayStatus{}
	for _, st := range v.Statuses {
		statuses[st.Key] = st
	}
	wanted := map[objectKey]bool{}
	for _, gw := range sortedGateways(v.Gateways) {
		if !accepted[string(gw.Spec.GatewayClassName)] {
			continue
		}
		problem := NameProblem(gw.Name)
		if problem == "" {
			errs = append(errs, c.provision(ctx, gw, wanted))
		}
		if st, ok := statuses[model.GatewayKey{Namespace: gw.Namespace, Name: gw.Name}]; ok {
			errs = append(errs, c.gatewayStatus(ctx, gw, st, problem, now))
		}
	}
	errs = append(errs, c.removeStale(ctx, wanted), c.certificates(ctx, v.Edges))
	return reconcile.Result{}, errors.Join(errs...)
}

func sortedGateways(gws []*gwv1.Gateway) []*gwv1.Gateway {
	out := slices.Clone(gws)
	slices.SortFunc(out, func(a, b *gwv1.Gateway) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// objectKey names one provisioned object.
type objectKey struct {
	kind, namespace, name string
}

// provision applies the ServiceAccount, Deployment and Service of gw and records them in wanted.
func (c *Controller) provision(ctx context.Context, gw *gwv1.Gateway, wanted map[objectKey]bool) error {
	dep, err := Deployment(gw, c.EnvoyImage)
	if err != nil {
		return err
	}
	objs := []client.Object{ServiceAccount(gw), dep}
	if svc := Service(gw, c.AddressCIDRs); svc != nil {
		objs = append(objs, svc)
	}
	var errs []error
	for _, o := range objs {
		wanted[objectKey{o.GetObjectKind().GroupVersionKind().Kind, o.GetNamespace(), o.GetName()}] = true
		errs = append(errs, c.apply(ctx, o))
	}
	return errors.Join(errs...)
}

// apply writes obj (with TypeMeta set) by server-side apply unless the cached object of that name
// carries the same AnnotationAppliedHash.
func (c *Controller) apply(ctx context.Context, obj client.Object) error {
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	delete(u, "status")
	unstructured.RemoveNestedField(u, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u, "spec", "template", "metadata", "creationTimestamp")
	b, err := json.Marshal(u)
	if err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	sum := sha256.Sum256(b)
	hash := hex.EncodeToString(sum[:])[:16]
	live := obj.DeepCopyObject().(client.Object)
	err = c.Client.Get(ctx, client.ObjectKeyFromObject(obj), live)
	switch {
	case err == nil && !provisioned(live):
		// Never adopt: an object of that name that is not this Gateway's edge object stays
		// as it is (the Gateway's status names it).
		return fmt.Errorf("%s %s/%s exists and is not aether's edge object (no controller ownerReference to its Gateway): not taken over", kind, obj.GetNamespace(), obj.GetName())
	case err == nil && live.GetAnnotations()[AnnotationAppliedHash] == hash:
		return nil
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("read %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	ann, _, _ := unstructured.NestedStringMap(u, "metadata", "annotations")
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationAppliedHash] = hash
	if err := unstructured.SetNestedStringMap(u, ann, "metadata", "annotations"); err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	ac := client.ApplyConfigurationFromUnstructured(&unstructured.Unstructured{Object: u})
	if err := c.Client.Apply(ctx, ac, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	c.Log.Info("gateway: applied", "kind", kind, "object", obj.GetNamespace()+"/"+obj.GetName(), "hash", hash)
	return nil
}

// edgeSelector selects the objects provisioned for Gateways: labelled aether.io/managed-by:
// aether and carrying the gateway-name label.
var edgeSelector = []client.ListOption{client.MatchingLabels{model.LabelManagedBy: model.ManagedByAether}, client.HasLabels{gwv1.GatewayNameLabelKey}}

// provisioned reports whether o is an object the controller provisions: labelled as Labels says,
// named after its Gateway (model.EdgeServiceAccountName) and controlled by that Gateway (its
// controller ownerReference). An object that only carries the labels is not aether's: it is
// neither deleted nor taken over.
func provisioned(o client.Object) bool {
	l := o.GetLabels()
	name, ok := l[gwv1.GatewayNameLabelKey]
	if !ok || l[model.LabelManagedBy] != model.ManagedByAether || o.GetName() != model.EdgeServiceAccountName(name) {
		return false
	}
	ref := metav1.GetControllerOf(o)
	return ref != nil && ref.Kind == "Gateway" && ref.Name == name && strings.HasPrefix(ref.APIVersion, gwv1.GroupName+"/")
}

// removeStale deletes every provisioned object (provisioned) not in wanted: those of Gateways that
// are gone or no longer of a class aether accepts, and a Service of a Gateway that opens no port.
func (c *Controller) removeStale(ctx context.Context, wanted map[objectKey]bool) error {
	var errs []error
	for _, l := range []struct {
		kind string
		list client.ObjectList
	}{{"ServiceAccount", &corev1.ServiceAccountList{}}, {"Deployment", &appsv1.DeploymentList{}}, {"Service", &corev1.ServiceList{}}} {
		if err := c.Client.List(ctx, l.list, edgeSelector...); err != nil {
			errs = append(errs, fmt.Errorf("list provisioned %ss: %w", l.kind, err))
			continue
		}
		errs = append(errs, meta.EachListItem(l.list, func(o runtime.Object) error {
			obj := o.(client.Object)
			if !provisioned(obj) || wanted[objectKey{l.kind, obj.GetNamespace(), obj.GetName()}] {
				return nil
			}
			return c.remove(ctx, l.kind, obj)
		}))
	}
	return errors.Join(errs...)
}

// remove deletes o (of kind) if it is still the object read (a UID precondition); a gone object is
// no error.
func (c *Controller) remove(ctx context.Context, kind string, o client.Object) error {
	uid := o.GetUID()
	err := c.Client.Delete(ctx, o, client.Preconditions{UID: &uid})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil // gone, or replaced since it was read: the next pass looks again
	case err != nil:
		return fmt.Errorf("delete %s %s/%s: %w", kind, o.GetNamespace(), o.GetName(), err)
	}
	c.Log.Info("gateway: deleted", "kind", kind, "object", o.GetNamespace()+"/"+o.GetName(),
		"gateway", o.GetLabels()[gwv1.GatewayNameLabelKey])
	return nil
}

// certificates applies a copy (CertificateCopy) of every certificate edges serve and deletes the
// copies in Namespace that none serves.
func (c *Controller) certificates(ctx context.Context, edges []*model.EdgeGateway) error {
	want := map[model.SecretKey]bool{}
	for _, e := range edges {
		for _, p := range e.Ports {
			for _, l := range p.Listeners {
				for _, crt := range l.Certificates {
					want[crt.Ref] = true
				}
			}
		}
	}
	var errs []error
	names := map[string]bool{}
	for _, ref := range slices.SortedFunc(func(yield func(model.SecretKey) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	}, func(a, b model.SecretKey) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	}) {
		names[model.EdgeCertificateSecretName(ref)] = true
		var src corev1.Secret
		if err := c.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &src); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("read certificate Secret %s: %w", ref, err))
			}
			continue // gone since it was resolved: the pass its deletion brings removes it
		}
		errs = append(errs, c.apply(ctx, CertificateCopy(c.Namespace, ref, &src)))
	}
	var copies corev1.SecretList
	if err := c.Client.List(ctx, &copies, client.InNamespace(c.Namespace),
		client.MatchingLabels{model.LabelManagedBy: model.ManagedByAether, model.LabelEdgeCertificate: "true"}); err != nil {
		return errors.Join(append(errs, fmt.Errorf("list certificate copies: %w", err))...)
	}
	for i := range copies.Items {
		if s := &copies.Items[i]; !names[s.Name] {
			errs = append(errs, c.remove(ctx, "Secret", s))
		}
	}
	return errors.Join(errs...)
}

// classStatus writes GatewayClass gc's conditions (ClassConditions) when they differ.
func (c *Controller) classStatus(ctx context.Context, gc *gwv1.GatewayClass, now metav1.Time) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		want := ClassConditions(gc, now)
		if equality.Semantic.DeepEqual(gc.Status.Conditions, want) {
			return nil
		}
		upd := gc.DeepCopy()
		upd.Status.Conditions = want
		_, err := c.Gateway.GatewayV1().GatewayClasses().UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := c.Gateway.GatewayV1().GatewayClasses().Get(ctx, gc.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			gc = fresh
		}
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("write status of GatewayClass %s: %w", gc.Name, err)
	}
	return nil
}

// gatewayStatus writes Gateway gw's status (Status, with problem: NameProblem's) when it differs,
// for generation st.Generation only (a Gateway changed since is left to the pass its change
// brings).
func (c *Controller) gatewayStatus(ctx context.Context, gw *gwv1.Gateway, st model.GatewayStatus, problem string, now metav1.Time) error {
	name := types.NamespacedName{Namespace: gw.Namespace, Name: model.EdgeServiceAccountName(gw.Name)}
	var dep *appsv1.Deployment
	var svc *corev1.Service
	var d appsv1.Deployment
	var s corev1.Service
	if err := c.Client.Get(ctx, name, &d); err == nil && provisioned(&d) {
		dep = &d
	} else if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("read edge Deployment %s: %w", name, err)
	}
	if err := c.Client.Get(ctx, name, &s); err == nil && provisioned(&s) {
		svc = &s
	} else if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("read edge Service %s: %w", name, err)
	}
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if gw.Generation != st.Generation {
			return nil
		}
		_, refused := ExternalIPs(gw, c.AddressCIDRs)
		want := Status(gw.Status, st, dep, svc, problem, refused, now)
		if equality.Semantic.DeepEqual(gw.Status, want) {
			return nil
		}
		upd := gw.DeepCopy()
		upd.Status = want
		_, err := c.Gateway.GatewayV1().Gateways(gw.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := c.Gateway.GatewayV1().Gateways(gw.Namespace).Get(ctx, gw.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			gw = fresh
		}
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("write status of Gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	return nil
}

// SetupWithManager registers the controller (leader only): a pass PassDelay after each View
// (SetView), and after each event of a provisioned Deployment, Service or ServiceAccount or of a
// certificate copy in Namespace, as the manager's cache sees them.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	if c.Client == nil || c.Gateway == nil || c.Namespace == "" || c.EnvoyImage == "" || c.Log == nil {
		return errors.New("set up gateway controller: Client, Gateway, Namespace, EnvoyImage and Log are required")
	}
	if c.PassDelay <= 0 {
		c.PassDelay = DefaultPassDelay
	}
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	later := func(q queue) { q.AddAfter(syncAll, c.PassDelay) }
	all := handler.Funcs{
		CreateFunc:  func(_ context.Context, _ event.CreateEvent, q queue) { later(q) },
		UpdateFunc:  func(_ context.Context, _ event.UpdateEvent, q queue) { later(q) },
		DeleteFunc:  func(_ context.Context, _ event.DeleteEvent, q queue) { later(q) },
		GenericFunc: func(_ context.Context, _ event.GenericEvent, q queue) { later(q) },
	}
	ours := builder.WithPredicates(predicate.NewPredicateFuncs(provisioned))
	copies := builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == c.Namespace && o.GetLabels()[model.LabelEdgeCertificate] == "true"
	}))
	opts := controller.Options{MaxConcurrentReconciles: 1, RateLimiter: c.RateLimiter}
	if c.SkipNameValidation {
		opts.SkipNameValidation = &c.SkipNameValidation
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("gateway").
		WatchesRawSource(source.Func(func(_ context.Context, q queue) error {
			c.mu.Lock()
			c.kick = func() { later(q) }
			have := c.view != nil
			c.mu.Unlock()
			if have {
				later(q)
			}
			return nil
		})).
		Watches(&appsv1.Deployment{}, all, ours).
		Watches(&corev1.Service{}, all, ours).
		Watches(&corev1.ServiceAccount{}, all, ours).
		Watches(&corev1.Secret{}, all, copies).
		WithOptions(opts).
		Complete(c)
	if err != nil {
		return fmt.Errorf("set up gateway controller: %w", err)
	}
	return nil
}

// CacheByObject is what the manager's cache must hold for the Controller (and, for Secrets, the
// route status controller's certificate checks), as cache.Options.ByObject: only Deployments and
// ServiceAccounts labelled aether.io/managed-by: aether, and only Secrets of type
// kubernetes.io/tls (certificateRefs name those; the route status controller reads a ref to a
// Secret of another type from the API server). Services are cached whole: other controllers read
// them all.
func CacheByObject() map[client.Object]cache.ByObject {
	managed := labels.SelectorFromSet(labels.Set{model.LabelManagedBy: model.ManagedByAether})
	return map[client.Object]cache.ByObject{
		&appsv1.Deployment{}:     {Label: managed},
		&corev1.ServiceAccount{}: {Label: managed},
		&corev1.Secret{}:         {Field: fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS))},
	}
}
