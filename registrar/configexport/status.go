package configexport

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// Field managers of the conditions written here (server-side apply): each owns only its own
// condition types in status.conditions (a list map keyed by type in the MCS CRDs), so the MCS
// controllers' Valid, Ready and Conflict conditions and ServiceImport status.clusters stay
// theirs, and their status updates (which carry these conditions unchanged) leave ours alone.
const (
	ExportFieldManager = "aether-config-export"
	ImportFieldManager = "aether-config-import"
)

// applyConditions server-side applies conds as the whole set of status.conditions that manager
// owns on the MCS object kind namespace/name (kind ServiceExport or ServiceImport,
// multicluster.x-k8s.io/v1beta1), forcing ownership of those condition types. An object that is
// gone is no error.
func applyConditions(ctx context.Context, c client.Client, kind, namespace, name, manager string, conds ...metav1.Condition) error {
	list := make([]any, 0, len(conds))
	for i := range conds {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&conds[i])
		if err != nil {
			return fmt.Errorf("apply %s %s/%s conditions: %w", kind, namespace, name, err)
		}
		list = append(list, m)
	}
	return ApplyStatus(ctx, c, schema.GroupVersion{Group: mcsv1beta1.GroupVersion.Group, Version: mcsv1beta1.GroupVersion.Version}.WithKind(kind), namespace, name, manager, map[string]any{"conditions": list})
}

// ApplyStatus server-side applies status (the object's status as unstructured JSON: what manager
// owns in it, every other field left to its owners) to the object gvk namespace/name through its
// status subresource, as field manager manager, forcing ownership of those fields; a field manager
// held before and left out of status is released (removed when no other manager holds it). An
// object that is gone is no error; other errors name the object.
func ApplyStatus(ctx context.Context, c client.Client, gvk schema.GroupVersionKind, namespace, name, manager string, status map[string]any) error {
	u := &unstructured.Unstructured{Object: map[string]any{"status": status}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(namespace)
	u.SetName(name)
	err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("apply %s %s/%s status: %w", gvk.Kind, namespace, name, err)
	}
	return nil
}
