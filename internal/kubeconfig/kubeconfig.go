// Package kubeconfig loads the API server access of aether's binaries. It owns only that; each
// binary's --kubeconfig flag is its own.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig returns the client configuration from the kubeconfig file at path, or the
// in-cluster configuration (service account token and KUBERNETES_SERVICE_HOST) when path is
// empty. Errors name the --kubeconfig flag and the path.
func RESTConfig(path string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("load in-cluster kubernetes config (set --kubeconfig outside a cluster): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("load --kubeconfig %q: %w", path, err)
	}
	return c, nil
}
