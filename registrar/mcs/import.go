package mcs

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
)

// Event reasons of the ImportGenerator (events.k8s.io/v1, reporting controller aether-registrar).
const (
	// ReasonNamespaceMissing: a service is exported but its namespace does not exist in this
	// cluster, so nothing is imported (regarding: the Namespace by name).
	ReasonNamespaceMissing = "NamespaceMissing"
	// ReasonImportBlocked: an object aether did not create holds the ServiceImport or
	// <svc>-clusterset name, or that name is not a valid Service name; nothing is imported.
	ReasonImportBlocked = "ImportBlocked"
)

// ImportGenerator materialises the clusterset-wide export view in this cluster: for every
// service that some cluster exports, a ServiceImport (type ClusterSetIP, the exports' ports merged
// per port, the oldest export's session affinity, exported labels and annotations,
// status.clusters the exporting clusters: DesiredImport) and a distinct selectorless <svc>-clusterset
// Service whose ClusterIP (the clusterset VIP, allocated by this cluster's API server) is copied
// into the ServiceImport's spec.ips. The Service carries label aether.io/managed-by: aether and
// annotations aether.io/mesh-service: <ns>/<svc> and aether.io/mesh-port. Both are removed when
// no cluster exports the service any more. The Service is created first, so the ServiceImport is
// created with its ips (three writes per new import: Service, ServiceImport, its status). The
// Service has no owner reference to the ServiceImport on purpose: a ServiceImport deleted by
// hand is recreated with the same VIP instead of the garbage collector taking the VIP with it.
//
// It never creates, changes or deletes an object without the aether.io/managed-by: aether label.
// When the namespace does not exist (or is terminating), nothing is created and the gap is
// reported by an event and the aether_registrar_imports_missing_namespace gauge (MCS namespace
// sameness). It decides only from a synced export view, which keeps its last state while the
// registry is unreachable, so an outage deletes nothing.
type ImportGenerator struct {
	Client   client.Client
	View     *ExportView
	Recorder events.EventRecorder
	Log      *slog.Logger
	Metrics  *Metrics
	// ControllerTuning sets parallelism, retry rate limiting and name validation.
	ControllerTuning

	queue queueRef
}

// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile converges the ServiceImport and clusterset Service of the service req names with
// the export view. It returns an error (and is retried) when the API server refuses a write; a
// write refused because the cache was behind (a resourceVersion conflict) is retried shortly
// without an error. It does nothing while Paused.
func (g *ImportGenerator) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if g.paused() {
		return reconcile.Result{}, nil
	}
	return quietConflict(g.reconcile(ctx, req))
}

// quietConflict turns a resourceVersion conflict (our cache was behind our own last write) into
// a short requeue instead of a logged error.
func quietConflict(r reconcile.Result, err error) (reconcile.Result, error) {
	if err != nil && apierrors.IsConflict(err) {
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	return r, err
}

func (g *ImportGenerator) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// Nothing is decided before the view holds the registry's first snapshot (a registry
	// unreachable at start must not look like "nothing is exported"): wait for it.
	if err := g.View.WaitSynced(ctx); err != nil {
		return reconcile.Result{}, nil
	}
	key := model.ServiceKey{Namespace: req.Namespace, Name: req.Name}
	res, exported := Resolve(g.View.Marks(key))

	si, err := getOpt(ctx, g.Client, req.NamespacedName, &mcsv1beta1.ServiceImport{})
	if err != nil {
		return reconcile.Result{}, err
	}
	csName, nameErr := ClustersetServiceName(req.Name)
	var cs *corev1.Service
	if nameErr == nil {
		if cs, err = getOpt(ctx, g.Client, types.NamespacedName{Namespace: req.Namespace, Name: csName}, &corev1.Service{}); err != nil {
			return reconcile.Result{}, err
		}
	}

	if !exported {
		g.Metrics.setMissingNS(key, false)
		g.Metrics.setBlocked(key, false)
		g.Metrics.setImported(key, false)
		if cs != nil {
			if err := g.deleteOurs(ctx, cs); err != nil {
				return reconcile.Result{}, err
			}
		}
		if si != nil {
			return reconcile.Result{}, g.deleteOurs(ctx, si)
		}
		return reconcile.Result{}, nil
	}

	ns, err := getOpt(ctx, g.Client, types.NamespacedName{Name: req.Namespace}, &corev1.Namespace{})
	if err != nil {
		return reconcile.Result{}, err
	}
	if ns == nil || !ns.DeletionTimestamp.IsZero() {
		g.Metrics.setImported(key, false)
		if g.Metrics.setMissingNS(key, true) {
			g.Log.Info("mcs: exported service not imported: namespace missing", "service", key.String(), "clusters", res.Clusters)
			g.event(&corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: req.Namespace}, ReasonNamespaceMissing,
				"service %s is exported by cluster(s) %s but namespace %s does not exist in this cluster; nothing is imported", key, strings.Join(res.Clusters, ","), req.Namespace)
		}
		return reconcile.Result{}, nil
	}
	g.Metrics.setMissingNS(key, false)

	var blockedBy client.Object
	var why string
	switch {
	case nameErr != nil:
		why = nameErr.Error()
	case si != nil && !managed(si):
		blockedBy, why = si, "ServiceImport "+key.String()+" was not created by aether"
	case cs != nil && !managed(cs):
		blockedBy, why = cs, "Service "+req.Namespace+"/"+csName+" was not created by aether"
	}
	if why != "" {
		g.Metrics.setImported(key, false)
		if g.Metrics.setBlocked(key, true) {
			g.Log.Warn("mcs: exported service not imported", "service", key.String(), "reason", why)
			var regarding = blockedBy
			if regarding == nil {
				regarding = ns
			}
			g.event(regarding, ReasonImportBlocked, "service %s is not imported: %s", key, why)
		}
		return reconcile.Result{}, nil
	}
	g.Metrics.setBlocked(key, false)

	wantCS, _ := DesiredClustersetService(req.Namespace, req.Name, res)
	if cs == nil {
		cs = wantCS
		if err := g.Client.Create(ctx, cs); err != nil {
			return requeueOnExists(fmt.Errorf("create Service %s/%s: %w", cs.Namespace, cs.Name, err))
		}
	} else if serviceDrift(cs, wantCS) {
		upd := cs.DeepCopy()
		maps.Copy(upd.Labels, wantCS.Labels)
		if upd.Annotations == nil {
			upd.Annotations = map[string]string{}
		}
		maps.Copy(upd.Annotations, wantCS.Annotations)
		upd.Spec.Ports, upd.Spec.Selector, upd.Spec.Type = wantCS.Spec.Ports, nil, corev1.ServiceTypeClusterIP
		if err := g.Client.Update(ctx, upd); err != nil {
			return reconcile.Result{}, fmt.Errorf("update Service %s/%s: %w", cs.Namespace, cs.Name, err)
		}
		cs = upd
	}

	ips := cs.Spec.ClusterIPs
	if len(ips) == 0 && cs.Spec.ClusterIP != "" {
		ips = []string{cs.Spec.ClusterIP}
	}
	want := DesiredImport(req.Namespace, req.Name, res, ips)
	if si == nil {
		si = want.DeepCopy()
		si.Status = mcsv1beta1.ServiceImportStatus{} // status is a subresource: written below
		if err := g.Client.Create(ctx, si); err != nil {
			return requeueOnExists(fmt.Errorf("create ServiceImport %s: %w", key, err))
		}
	} else if labels, annotations := ownedMetadata(si.Labels, want.Labels), ownedMetadata(si.Annotations, want.Annotations); !equality.Semantic.DeepEqual(si.Spec, want.Spec) ||
		!maps.Equal(si.Labels, labels) || !maps.Equal(si.Annotations, annotations) {
		upd := si.DeepCopy()
		upd.Spec, upd.Labels, upd.Annotations = want.Spec, labels, annotations
		if err := g.Client.Update(ctx, upd); err != nil {
			return reconcile.Result{}, fmt.Errorf("update ServiceImport %s: %w", key, err)
		}
		si = upd
	}
	if !equality.Semantic.DeepEqual(si.Status.Clusters, want.Status.Clusters) {
		upd := si.DeepCopy()
		upd.Status.Clusters = want.Status.Clusters
		if err := g.Client.Status().Update(ctx, upd); err != nil {
			return reconcile.Result{}, fmt.Errorf("update ServiceImport %s status: %w", key, err)
		}
	}
	g.Metrics.setImported(key, true)
	return reconcile.Result{}, nil
}

// getOpt reads one object from the cache; it returns nil, nil when there is none.
func getOpt[T client.Object](ctx context.Context, c client.Client, nn types.NamespacedName, obj T) (T, error) {
	var zero T
	if err := c.Get(ctx, nn, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return zero, nil
		}
		return zero, fmt.Errorf("get %T %s: %w", obj, nn, err)
	}
	return obj, nil
}

// ownedMetadata returns the labels (or annotations) an existing ServiceImport of aether's should
// carry: want (aether's own and the oldest export's exported ones), plus the keys of have under
// the aether.io domain that want does not set (other aether components may add some). Every
// other key is aether's to remove: the ServiceImport's labels and annotations outside aether.io
// mirror the exports (KEP-1645: the mcs-controller alone manages a ServiceImport). It returns nil
// for none.
func ownedMetadata(have, want map[string]string) map[string]string {
	out := maps.Clone(want)
	for k, v := range have {
		if _, set := want[k]; !set && reservedKey(k, false) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func managed(o client.Object) bool {
	return o.GetLabels()[model.LabelManagedBy] == model.ManagedByAether
}

// deleteOurs deletes o when it exists and carries aether's label (UID precondition, so an object
// recreated under the same name in between is left alone).
func (g *ImportGenerator) deleteOurs(ctx context.Context, o client.Object) error {
	if !managed(o) {
		return nil
	}
	uid := o.GetUID()
	if err := g.Client.Delete(ctx, o, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete %T %s/%s: %w", o, o.GetNamespace(), o.GetName(), err)
	}
	g.Log.Debug("mcs: removed import object", "kind", fmt.Sprintf("%T", o), "namespace", o.GetNamespace(), "name", o.GetName())
	return nil
}

// serviceDrift reports whether an existing clusterset Service differs from the desired one in
// what aether owns: ports, type, selector, its label and annotations.
func serviceDrift(have, want *corev1.Service) bool {
	if have.Spec.Type != corev1.ServiceTypeClusterIP || len(have.Spec.Selector) > 0 || len(have.Spec.Ports) != len(want.Spec.Ports) {
		return true
	}
	for i, p := range want.Spec.Ports {
		h := have.Spec.Ports[i]
		if h.Name != p.Name || h.Port != p.Port || h.Protocol != p.Protocol || !equality.Semantic.DeepEqual(h.AppProtocol, p.AppProtocol) {
			return true
		}
	}
	for k, v := range want.Labels {
		if have.Labels[k] != v {
			return true
		}
	}
	for k, v := range want.Annotations {
		if have.Annotations[k] != v {
			return true
		}
	}
	return false
}

func requeueOnExists(err error) (reconcile.Result, error) {
	if apierrors.IsAlreadyExists(err) {
		// The cache has not seen our own (or someone's) create yet: look again shortly.
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	return reconcile.Result{}, err
}

// event records a Warning event regarding obj (nothing without a Recorder).
func (g *ImportGenerator) event(regarding runtime.Object, reason, format string, args ...any) {
	if g.Recorder != nil {
		g.Recorder.Eventf(regarding, nil, corev1.EventTypeWarning, reason, "Import", format, args...)
	}
}

// Resync re-enqueues every service of the export view and every ServiceImport aether created;
// the registrar calls it when the registry becomes reachable again.
func (g *ImportGenerator) Resync(ctx context.Context) {
	q := g.queue.get()
	if q == nil {
		return
	}
	for _, k := range g.View.Services("") {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: k.Namespace, Name: k.Name}})
	}
	var list mcsv1beta1.ServiceImportList
	if err := g.Client.List(ctx, &list, client.MatchingLabels{model.LabelManagedBy: model.ManagedByAether}); err == nil {
		for _, si := range list.Items {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: si.Namespace, Name: si.Name}})
		}
	}
}

// SetupWithManager registers the generator: the export view (every service a registry change
// touched), ServiceImports, Services named <svc>-clusterset or carrying
// aether.io/mesh-service (mapped to their service), and Namespaces (a new namespace gets the
// imports that were waiting for it).
func (g *ImportGenerator) SetupWithManager(mgr ctrl.Manager) error {
	opts := g.options()
	req := func(ns, name string) reconcile.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("serviceimport").
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			g.queue.set(q)
			g.View.Subscribe(func(keys []model.ServiceKey) {
				for _, k := range keys {
					q.Add(req(k.Namespace, k.Name))
				}
			})
			return nil
		})).
		Watches(&mcsv1beta1.ServiceImport{}, &handler.EnqueueRequestForObject{}).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			var out []reconcile.Request
			if name, ok := strings.CutSuffix(o.GetName(), model.ClustersetServiceSuffix); ok && name != "" {
				out = append(out, req(o.GetNamespace(), name))
			}
			if ns, name, ok := strings.Cut(o.GetAnnotations()[model.AnnotationMeshService], "/"); ok && managed(o) {
				if r := req(ns, name); len(out) == 0 || out[0] != r {
					out = append(out, r)
				}
			}
			return out
		})).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			var out []reconcile.Request
			for _, k := range g.View.Services(o.GetName()) {
				out = append(out, req(k.Namespace, k.Name))
			}
			return out
		})).
		WithOptions(opts).
		Complete(g)
	if err != nil {
		return fmt.Errorf("set up ServiceImport generator: %w", err)
	}
	return nil
}
