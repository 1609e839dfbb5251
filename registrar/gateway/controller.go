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
// labelled Labels; the Service's external IPs those AssignAddresses gives the Gateway, decided
// for all Gateways at once in each pass) and its status (Status, from the View's model.GatewayStatus, the Deployment's
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
	// Replicas is the number of edge pods per Gateway (--edge-replicas; 0 means 1).
	Replicas int32
	// InfrastructureKeys are the Gateways' spec.infrastructure label and annotation keys the
	// provisioned objects get (model.InfrastructureKeyAllowed; --gateway-infrastructure-keys);
	// none by default.
	InfrastructureKeys []string
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
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=aether-system,resources=secrets,verbs=create;update;patch;delete

// Reconcile makes one pass over the last View (the request is ignored: there is one). It returns
// the errors of what it could not write, joined (the pass is retried with back-off). Nodes are
// read for their addresses (AssignAddresses: a node's address is never a Gateway's).
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
	var mine, provisionable []*gwv1.Gateway
	for _, gw := range sortedGateways(v.Gateways) {
		if !accepted[string(gw.Spec.GatewayClassName)] {
			continue
		}
		mine = append(mine, gw)
		if NameProblem(gw.Name) == "" {
			provisionable = append(provisionable, gw)
		}
	}
	assigned, live, err := c.assignAddresses(ctx, provisionable)
	if err != nil {
		// Never hand out an address from a partial read: nothing is applied, the pass is retried.
		return reconcile.Result{}, errors.Join(append(errs, err)...)
	}
	wanted := map[objectKey]bool{}
	errs = append(errs, c.provisionAll(ctx, provisionable, assigned, live, wanted))
	for _, gw := range mine {
		key := gatewayKey(gw)
		if st, ok := statuses[key]; ok {
			errs = append(errs, c.gatewayStatus(ctx, gw, st, NameProblem(gw.Name), assigned[key].Refused, now))
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

// assignAddresses is AssignAddresses for gws over the cluster's Services and Nodes (the manager's
// cache), and the external IPs the live edge Service of each of gws has. The Services and Nodes
// are read only when one of gws asks for an address inside AddressCIDRs; an error reading them
// is returned (an unread Service or Node must not make an address look free).
func (c *Controller) assignAddresses(ctx context.Context, gws []*gwv1.Gateway) (map[model.GatewayKey]AddressAssignment, map[model.GatewayKey][]string, error) {
	if !slices.ContainsFunc(gws, func(gw *gwv1.Gateway) bool { return asksForAllowedAddress(gw, c.AddressCIDRs) }) {
		return AssignAddresses(gws, c.AddressCIDRs, nil, nil), nil, nil
	}
	// Read only: the cached objects themselves, not copies (every Service of the cluster).
	var svcs corev1.ServiceList
	if err := c.Client.List(ctx, &svcs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("assign Gateway addresses: list Services: %w", err)
	}
	var nodes corev1.NodeList
	if err := c.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("assign Gateway addresses: list Nodes: %w", err)
	}
	live := map[model.GatewayKey][]string{}
	for i := range svcs.Items {
		if s := &svcs.Items[i]; provisioned(s) {
			live[model.GatewayKey{Namespace: s.Namespace, Name: s.Labels[gwv1.GatewayNameLabelKey]}] = s.Spec.ExternalIPs
		}
	}
	return AssignAddresses(gws, c.AddressCIDRs, svcs.Items, nodes.Items), live, nil
}

// provisionAll provisions gws (provision) with the external IPs assigned gives them, in two
// rounds so that no address is on two edge Services at once: first every Gateway that gains no
// address its live edge Service (live) lacks, and of one that gains and loses addresses the
// losses alone (its kept addresses); then every Gateway that gains one. An address whose
// Gateway losing it could not be written is not given in this pass (the error says so; the pass
// is retried).
func (c *Controller) provisionAll(ctx context.Context, gws []*gwv1.Gateway, assigned map[model.GatewayKey]AddressAssignment, live map[model.GatewayKey][]string, wanted map[objectKey]bool) error {
	var errs []error
	stuck := map[string]model.GatewayKey{} // address -> the Gateway that may still hold it
	var later []*gwv1.Gateway
	for _, gw := range gws {
		k := gatewayKey(gw)
		ips, had := assigned[k].ExternalIPs, live[k]
		kept := slices.DeleteFunc(slices.Clone(ips), func(ip string) bool { return !slices.Contains(had, ip) })
		loses := slices.ContainsFunc(had, func(ip string) bool { return !slices.Contains(ips, ip) })
		if len(kept) < len(ips) {
			later = append(later, gw)
			if !loses {
				continue
			}
			ips = kept
		}
		if err := c.provision(ctx, gw, ips, wanted); err != nil {
			errs = append(errs, err)
			for _, ip := range had {
				if !slices.Contains(ips, ip) {
					stuck[ip] = k
				}
			}
		}
	}
	for _, gw := range later {
		ips := slices.DeleteFunc(slices.Clone(assigned[gatewayKey(gw)].ExternalIPs), func(ip string) bool {
			h, ok := stuck[ip]
			if ok {
				errs = append(errs, fmt.Errorf("give Gateway %s/%s external IP %s: not in this pass: Gateway %s, which had it, could not be written", gw.Namespace, gw.Name, ip, h))
			}
			return ok
		})
		errs = append(errs, c.provision(ctx, gw, ips, wanted))
	}
	return errors.Join(errs...)
}

// objectKey names one provisioned object.
type objectKey struct {
	kind, namespace, name string
}

// provision applies the ServiceAccount, Deployment and Service (with externalIPs) of gw and
// records them in wanted.
func (c *Controller) provision(ctx context.Context, gw *gwv1.Gateway, externalIPs []string, wanted map[objectKey]bool) error {
	dep, err := Deployment(gw, c.EnvoyImage, c.Replicas, c.InfrastructureKeys)
	if err != nil {
		return err
	}
	objs := []client.Object{ServiceAccount(gw, c.InfrastructureKeys), dep}
	if svc := Service(gw, externalIPs, c.InfrastructureKeys); svc != nil {
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

// gatewayStatus writes Gateway gw's status (Status, with problem: NameProblem's, and refused:
// the AddressAssignment's) when it differs, for generation st.Generation only (a Gateway
// changed since is left to the pass its change brings).
func (c *Controller) gatewayStatus(ctx context.Context, gw *gwv1.Gateway, st model.GatewayStatus, problem string, refused []string, now metav1.Time) error {
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
// certificate copy in Namespace, of any Service using an address in AddressCIDRs, and (with
// AddressCIDRs set) of a Node whose address in them comes or goes, as the manager's cache sees
// them. The manager's cache holds every Service and, with AddressCIDRs set, every Node
// (CacheByObject).
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
	// Any Service, ours or one whose addresses (before or after the change) fall in AddressCIDRs:
	// it may hold an address a Gateway asks for, or free one.
	services := builder.WithPredicates(c.addressesChanged(func(o client.Object) ([]string, bool) {
		s, ok := o.(*corev1.Service)
		if !ok {
			return nil, false
		}
		return serviceAddresses(s), provisioned(s)
	}))
	copies := builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == c.Namespace && o.GetLabels()[model.LabelEdgeCertificate] == "true"
	}))
	opts := controller.Options{MaxConcurrentReconciles: 1, RateLimiter: c.RateLimiter}
	if c.SkipNameValidation {
		opts.SkipNameValidation = &c.SkipNameValidation
	}
	b := ctrl.NewControllerManagedBy(mgr).
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
		Watches(&corev1.Service{}, all, services).
		Watches(&corev1.ServiceAccount{}, all, ours).
		Watches(&corev1.Secret{}, all, copies).
		WithOptions(opts)
	if len(c.AddressCIDRs) > 0 {
		// Node addresses matter only when some address may be given (AssignAddresses).
		b = b.Watches(&corev1.Node{}, all, builder.WithPredicates(c.addressesChanged(func(o client.Object) ([]string, bool) {
			n, ok := o.(*corev1.Node)
			if !ok {
				return nil, false
			}
			return nodeAddresses(n), false
		})))
	}
	err := b.Complete(c)
	if err != nil {
		return fmt.Errorf("set up gateway controller: %w", err)
	}
	return nil
}

// addressesChanged is the predicate of an object whose addresses (addrs: the addresses and
// whether any change of it matters) may change what AssignAddresses gives: created or deleted
// with an address in AddressCIDRs, or updated with its addresses changed and one in
// AddressCIDRs before or after; every event of an object whose changes all matter.
func (c *Controller) addressesChanged(addrs func(client.Object) ([]string, bool)) predicate.Funcs {
	one := func(o client.Object) bool {
		ips, always := addrs(o)
		return always || usesAddressIn(ips, c.AddressCIDRs)
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return one(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return one(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return one(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			before, always := addrs(e.ObjectOld)
			after, alwaysNow := addrs(e.ObjectNew)
			if always || alwaysNow {
				return true
			}
			return !slices.Equal(before, after) && (usesAddressIn(before, c.AddressCIDRs) || usesAddressIn(after, c.AddressCIDRs))
		},
	}
}

// CacheByObject is what the manager's cache must hold for the Controller (and, for Secrets, the
// route status controller's certificate checks), as cache.Options.ByObject: only Deployments and
// ServiceAccounts labelled aether.io/managed-by: aether, only Secrets of type kubernetes.io/tls
// (certificateRefs name those; the route status controller reads a ref to a Secret of another
// type from the API server), and of Nodes only their name and status.addresses (what
// AssignAddresses reads; nothing else in the registrar reads Nodes). Services are cached whole:
// other controllers read them all, and AssignAddresses every one's addresses.
func CacheByObject() map[client.Object]cache.ByObject {
	managed := labels.SelectorFromSet(labels.Set{model.LabelManagedBy: model.ManagedByAether})
	return map[client.Object]cache.ByObject{
		&appsv1.Deployment{}:     {Label: managed},
		&corev1.ServiceAccount{}: {Label: managed},
		&corev1.Secret{}:         {Field: fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS))},
		&corev1.Node{}:           {Transform: nodeAddressesOnly},
	}
}

// nodeAddressesOnly is the cache's transform of a Node: its name, UID, resourceVersion and
// status.addresses (a Node's images and conditions are most of its size). Anything else (a
// tombstone) is kept as it is.
func nodeAddressesOnly(in any) (any, error) {
	n, ok := in.(*corev1.Node)
	if !ok {
		return in, nil
	}
	return &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}
