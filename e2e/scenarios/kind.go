package scenarios

import (
	"errors"
	"fmt"
)

// errKindPair is returned for -pair=kind: the kind implementation of ClusterPair is not written
// yet (it needs kubectl exec through the API server, images for the workloads, and disruptions
// through the agent DaemonSet; see docs/e2e.md).
var errKindPair = errors.New("pair kind: not implemented yet: the scenario suite runs only on the local substrate (-pair=local)")

// newKindPair checks the kind flags and returns the kind pair.
func newKindPair(kubeconfigA, kubeconfigB string) (ClusterPair, error) {
	if kubeconfigA == "" || kubeconfigB == "" {
		return nil, fmt.Errorf("pair kind: -kubeconfig-a %q and -kubeconfig-b %q: both are required", kubeconfigA, kubeconfigB)
	}
	return nil, errKindPair
}
