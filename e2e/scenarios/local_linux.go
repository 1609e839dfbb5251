package scenarios

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/aethermesh/aether/e2e/mesh"
)

// localPair is the ClusterPair of a mesh on the local substrate (clusters "alpha" and "beta").
type localPair struct{ m *mesh.Mesh }

func (p *localPair) Clusters() (string, string) { return p.m.Clusters[0].Name, p.m.Clusters[1].Name }

func (p *localPair) Kube(cluster string) kubernetes.Interface { return p.m.Cluster(cluster).Client }

func (p *localPair) Dynamic(cluster string) dynamic.Interface {
	return dynamic.NewForConfigOrDie(p.m.Cluster(cluster).Config)
}

func (p *localPair) Gateway(cluster string) gwclient.Interface {
	return gwclient.NewForConfigOrDie(p.m.Cluster(cluster).Config)
}

func (p *localPair) Nodes(cluster string) []string {
	var out []string
	for _, n := range p.m.Cluster(cluster).Nodes {
		out = append(out, n.Name)
	}
	return out
}

func (p *localPair) Command(workload string) (string, string) {
	return p.m.Bins[workload], "aether.local/" + workload
}

func (p *localPair) Exec(ctx context.Context, cluster, ns, pod string, argv ...string) ([]byte, error) {
	if len(argv) > 0 {
		if bin, ok := p.m.Bins[argv[0]]; ok {
			argv = append([]string{bin}, argv[1:]...)
		}
	}
	return p.m.Cluster(cluster).ExecInPod(ctx, ns, pod, argv...)
}

func (p *localPair) Dial(ctx context.Context, cluster, ns, pod, addr string) (net.Conn, error) {
	sb, _, ok := p.m.Cluster(cluster).Sandbox(ns, pod)
	if !ok || sb.Netns == nil {
		return nil, fmt.Errorf("dial from %s/%s in %s: no pod network namespace", ns, pod, cluster)
	}
	var conn net.Conn
	err := sb.Netns.Do(func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		conn = c
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s/%s: %w", addr, ns, pod, err)
	}
	return conn, nil
}

func (p *localPair) RestartAgent(ctx context.Context, _, node string) error {
	return p.m.RestartAgent(ctx, node)
}

func (p *localPair) StopNode(ctx context.Context, _, node string) error {
	return p.m.StopNode(ctx, node)
}

func (p *localPair) CutRegistry(_ context.Context, clusters ...string) error {
	return p.m.CutRegistry(clusters...)
}

func (p *localPair) RestoreRegistry(context.Context) error { return p.m.RestoreRegistry() }

func (p *localPair) EnvoyAdmin(ctx context.Context, _, node, path string) (string, error) {
	return p.m.EnvoyAdmin(ctx, node, path)
}

func (p *localPair) LeaseTTL() int { return 5 }

func (p *localPair) TrustDomain(cluster string) string { return p.m.TrustDomain(cluster) }

func (p *localPair) Debug() string {
	var b strings.Builder
	fmt.Fprintf(&b, "substrate run directory: %s (logs under logs/)\n", p.m.Substrate.Dir)
	for _, c := range p.m.Clusters {
		for _, n := range c.Nodes {
			log := p.m.AgentLog(n.Name)
			data, _ := os.ReadFile(log)
			s := string(data)
			if len(s) > 6000 {
				s = s[len(s)-6000:]
			}
			fmt.Fprintf(&b, "--- agent %s (%s), tail:\n%s\n", n.Name, log, s)
		}
	}
	return b.String()
}
