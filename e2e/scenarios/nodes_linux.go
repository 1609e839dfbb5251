package scenarios

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/aethermesh/aether/e2e/mesh"
	"github.com/aethermesh/aether/e2e/substrate"
)

// substrateNodes is the nodeShell of the local substrate's real nodes: a command runs in the
// node's network and mount namespaces, kill is Node.Kill.
type substrateNodes struct{ s *substrate.Substrate }

func (n substrateNodes) node(name string) (*substrate.Node, error) {
	for _, c := range n.s.Clusters {
		if node := c.Node(name); node != nil {
			return node, nil
		}
	}
	return nil, fmt.Errorf("no node %q in the substrate", name)
}

func (n substrateNodes) exec(ctx context.Context, node string, argv ...string) ([]byte, error) {
	nd, err := n.node(node)
	if err != nil {
		return nil, err
	}
	return nd.Exec(ctx, argv...)
}

func (n substrateNodes) kill(_ context.Context, node string) error {
	nd, err := n.node(node)
	if err != nil {
		return err
	}
	return nd.Kill()
}

// startNodes starts a mesh on the local substrate's real nodes, aether installed from the Helm
// chart, and returns it as the same pair the kind clusters are (the scenarios reach it through
// its API servers and kubectl-like exec only); stopped when t ends.
func startNodes(t *testing.T, identical bool) ClusterPair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	m, err := mesh.StartMesh(ctx, mesh.Options{IdenticalPodCIDRs: identical, BinDir: sharedBins(t), RealNodes: true,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mesh on real nodes up in %s (substrate %s)", time.Since(start).Round(time.Millisecond), m.StartupTime.Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() && *holdFlag > 0 {
			t.Logf("holding the failed pair for %s: substrate %s, mesh %s", *holdFlag, m.Substrate.Dir, m.Dir)
			time.Sleep(*holdFlag)
		}
		m.Stop()
	})
	p, err := openRealPair(m.Clusters[0].Kubeconfig, m.Clusters[1].Kubeconfig, substrateNodes{m.Substrate})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
