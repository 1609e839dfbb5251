package configexport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/routestatus"
)

// ImportStatus writes the import status of aether's ServiceImports (label aether.io/managed-by:
// aether): conditions ConditionConfigImported and ConditionConfigDrift, as the last route status
// pass found them (Hook, ImportConditions), with server-side apply under field manager
// ImportFieldManager, so the ServiceImport's status.clusters and other conditions stay the
// import generator's. A condition is written only when its status, reason or message changes
// (ConfigImported's age alone is no change), once per ServiceImport and change, retried with
// back-off when the write fails. It runs on the leader only and writes nothing into the
// registry (it is not paused by a partition claim conflict).
type ImportStatus struct {
	// Client reads ServiceImports (the manager's cache) and writes their status. Required.
	Client client.Client
	// Log receives the controller's logs. Required.
	Log *slog.Logger
	// Metrics (nil: not recorded).
	Metrics *Metrics
	// Workers bounds parallel writes (default 4).
	Workers int
	// RateLimiter, when set, replaces the default back-off of a write that failed.
	RateLimiter workqueue.TypedRateLimiter[reconcile.Request]
	// SkipNameValidation allows several controllers of this name in one process (tests).
	SkipNameValidation bool

	mu   sync.Mutex
	want map[model.ServiceKey]importWant
	q    workqueue.TypedRateLimitingInterface[reconcile.Request]
}

var _ reconcile.Reconciler = &ImportStatus{}

// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports,verbs=get;list;watch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports/status,verbs=get;update;patch

// set replaces the import status to write and asks for the write of each ServiceImport whose
// status changed.
func (s *ImportStatus) set(want map[model.ServiceKey]importWant) {
	s.mu.Lock()
	old := s.want
	s.want = want
	q := s.q
	drift := 0
	for _, w := range want {
		if w.drift.Status == metav1.ConditionTrue {
			drift++
		}
	}
	s.mu.Unlock()
	s.Metrics.setDrift(drift)
	if q == nil {
		return // the queue's start enqueues every ServiceImport
	}
	for k, w := range want {
		if o, ok := old[k]; !ok || o.importedBase != w.importedBase || o.imported.Reason != w.imported.Reason ||
			o.imported.Status != w.imported.Status || o.drift != w.drift {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: k.Namespace, Name: k.Name}})
		}
	}
}

// Reconcile writes the import status of the ServiceImport req names when it differs from what
// the last pass found. A ServiceImport that is gone, not aether's, or that no pass has seen yet
// is left alone.
func (s *ImportStatus) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	s.mu.Lock()
	w, ok := s.want[model.ServiceKey{Namespace: req.Namespace, Name: req.Name}]
	s.mu.Unlock()
	if !ok {
		return reconcile.Result{}, nil
	}
	var si mcsv1beta1.ServiceImport
	if err := s.Client.Get(ctx, req.NamespacedName, &si); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("config import status: get ServiceImport %s: %w", req.NamespacedName, err)
	}
	if si.Labels[model.LabelManagedBy] != model.ManagedByAether || !si.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	now := metav1.Now()
	imp, c1 := MergeCondition(si.Status.Conditions, w.imported, w.importedBase, si.Generation, now)
	drift, c2 := MergeCondition(si.Status.Conditions, w.drift, "", si.Generation, now)
	if !c1 && !c2 {
		return reconcile.Result{}, nil
	}
	if err := applyConditions(ctx, s.Client, "ServiceImport", si.Namespace, si.Name, ImportFieldManager, imp, drift); err != nil {
		return reconcile.Result{}, fmt.Errorf("config import status: %w", err)
	}
	s.Log.Debug("config import status written", "service", req.NamespacedName.String(), "imported", imp.Reason, "drift", drift.Reason)
	return reconcile.Result{}, nil
}

// SetupWithManager registers the controller (leader only): every ServiceImport event, and every
// pass's changes (set), ask for the write of that ServiceImport's status.
func (s *ImportStatus) SetupWithManager(mgr ctrl.Manager) error {
	if s.Client == nil || s.Log == nil {
		return errors.New("set up config import status controller: Client and Log are required")
	}
	workers := s.Workers
	if workers <= 0 {
		workers = 4
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("configimportstatus").
		For(&mcsv1beta1.ServiceImport{}).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			s.mu.Lock()
			s.q = q
			keys := slices.Collect(maps.Keys(s.want))
			s.mu.Unlock()
			for _, k := range keys {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: k.Namespace, Name: k.Name}})
			}
			return nil
		})).
		WithOptions(options(workers, s.RateLimiter, s.SkipNameValidation)).
		Complete(s)
	if err != nil {
		return fmt.Errorf("set up config import status controller: %w", err)
	}
	return nil
}

// Hook is the route status pass's ConfigHook (routestatus.Controller.Config): each pass
// assembles the model with every origin's projections (View) under ControlCluster, hands the
// Exporter this cluster's routes, hands ImportStatus every aether ServiceImport's import status
// (once the View holds the registry's projections), and, while this cluster exports config,
// returns the aether.io/BackendsExported conditions of the projected routes (BackendConditions).
type Hook struct {
	Exporter *Exporter
	View     *ConfigView
	Imports  *ImportStatus
	// Cluster is this cluster's name.
	Cluster string
}

var _ routestatus.ConfigHook = &Hook{}

// Projections returns every origin's projections and the control cluster.
func (h *Hook) Projections() ([]model.Projection, string) {
	return h.View.Projections(), h.View.ControlCluster()
}

// Subscribe asks for a pass (fn) whenever the projections change.
func (h *Hook) Subscribe(fn func()) { h.View.Subscribe(func(ConfigEvents) { fn() }) }

// Pass takes one route status pass's findings.
func (h *Hook) Pass(p routestatus.Pass) map[model.RouteRef][]routestatus.ParentCondition {
	h.Exporter.SetRoutes(p.Routes)
	if h.View.Synced() {
		var keys []model.ServiceKey
		for _, si := range p.Imports {
			if si.Labels[model.LabelManagedBy] == model.ManagedByAether {
				keys = append(keys, model.ServiceKey{Namespace: si.Namespace, Name: si.Name})
			}
		}
		h.Imports.set(ImportConditions(keys, p.Mesh.ConfigImports(), p.Routes, h.View.ControlCluster(), time.Now()))
	}
	if !h.Exporter.Enabled() {
		return nil
	}
	return BackendConditions(p.Routes, p.ExportedHere, h.Cluster)
}
