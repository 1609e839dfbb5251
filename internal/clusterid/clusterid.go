// Package clusterid reads the identity of a real Kubernetes cluster, the UID of its kube-system
// Namespace, which the registry's partition claim (registry, EnsureClaim) records. It
// owns only that read; it writes nothing to the API server or the registry.
package clusterid

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Namespace is the Namespace whose UID identifies a cluster.
const Namespace = "kube-system"

// Get returns the cluster's ID: the UID of its kube-system Namespace. The API server creates
// kube-system when it starts (its system-namespaces controller) and refuses to delete it
// (NamespaceLifecycle admission), so the UID stays for the cluster's life and differs between
// clusters, including two clusters built from the same configuration; a rebuilt cluster gets a
// new one. KEP-2149 (ClusterProperty cluster.clusterset.k8s.io) recommends it as the cluster ID,
// and multi-cluster tools (Submariner, Cilium, Istio) use it the same way.
//
// While the API server answers NotFound (just started, the Namespace not created yet) or does
// not answer, Get retries every 500 ms until ctx ends; Forbidden (the caller's RBAC lacks get
// on namespaces) is returned at once. Errors name the Namespace.
func Get(ctx context.Context, c kubernetes.Interface) (string, error) {
	for {
		ns, err := c.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{})
		switch {
		case err == nil && ns.UID != "":
			return string(ns.UID), nil
		case err == nil:
			err = fmt.Errorf("namespace has no UID")
		case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			return "", fmt.Errorf("read cluster ID (UID of Namespace %s): %w", Namespace, err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("read cluster ID (UID of Namespace %s): %w (last error: %w)", Namespace, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
