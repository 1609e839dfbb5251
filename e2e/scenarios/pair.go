package scenarios

import (
	"context"
	"flag"
	"net"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
)

// Flags of the suite (go test ./e2e/scenarios/ -args -pair=kind -kubeconfig-a=A -kubeconfig-b=B).
var (
	pairFlag        = flag.String("pair", "local", "cluster pair to run on: local (the substrate: kubelet stand-in and real nodes; needs root) or kind")
	kubeconfigAFlag = flag.String("kubeconfig-a", "", "kubeconfig of cluster A (with -pair=kind)")
	kubeconfigBFlag = flag.String("kubeconfig-b", "", "kubeconfig of cluster B (with -pair=kind)")
	holdFlag        = flag.Duration("hold", 0, "on failure, keep the local pair running this long before tearing it down (to look inside)")
)

// ClusterPair is what the scenarios need from two clusters running aether: cluster A holds the
// client, cluster B the exported service. Cluster arguments are the names Clusters returns.
type ClusterPair interface {
	// Clusters returns the names of cluster A and cluster B (also their registry names).
	Clusters() (a, b string)
	// Kube returns a client of cluster's API server.
	Kube(cluster string) kubernetes.Interface
	// Dynamic returns a dynamic client of cluster's API server (for the MCS resources).
	Dynamic(cluster string) dynamic.Interface
	// Gateway returns a Gateway API client (sigs.k8s.io/gateway-api, the version go.mod pins)
	// of cluster's API server: the GAMMA scenarios' HTTPRoutes and their status.
	Gateway(cluster string) gwclient.Interface
	// Nodes returns the names of cluster's worker nodes, sorted.
	Nodes(cluster string) []string
	// Command returns the command (and the image, for real clusters) that runs the test
	// workload name ("echo", "client", "serverfirst") in a container.
	Command(workload string) (command, image string)
	// Exec runs argv in pod's container (like kubectl exec) and returns its stdout; a non-zero
	// exit returns an error holding stderr.
	Exec(ctx context.Context, cluster, ns, pod string, argv ...string) ([]byte, error)
	// Dial opens a TCP connection to addr from inside pod's network namespace, so the pod's
	// capture applies to it; the connection outlives the call.
	Dial(ctx context.Context, cluster, ns, pod, addr string) (net.Conn, error)
	// RestartAgent restarts the aether agent on node (its Envoy keeps running).
	RestartAgent(ctx context.Context, cluster, node string) error
	// StopNode takes node out of the mesh as a dead node (its agent and Envoy stop).
	StopNode(ctx context.Context, cluster, node string) error
	// CutRegistry cuts every node of the given clusters (every cluster when none is given) off
	// the registry, agents and registrar alike; RestoreRegistry undoes every cut.
	CutRegistry(ctx context.Context, clusters ...string) error
	RestoreRegistry(ctx context.Context) error
	// EnvoyAdmin GETs path (with its query, e.g. "/stats?filter=^tcp.waypoint") from the Envoy
	// admin API of node in cluster and returns the body; a status other than 200 is an error.
	EnvoyAdmin(ctx context.Context, cluster, node, path string) (string, error)
	// TrustDomain is the trust domain of cluster's workloads (their SPIFFE IDs'
	// spiffe://<trust domain>/ns/<ns>/sa/<sa>): one for both clusters, or each its own with
	// SPIRE federation.
	TrustDomain(cluster string) string
	// LeaseTTL is how long a dead node's endpoints stay in the registry.
	LeaseTTL() (seconds int)
	// Debug returns text that helps explain a failure (log paths, log tails).
	Debug() string
}
