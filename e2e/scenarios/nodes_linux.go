package scenarios

import (
	"context"
	"fmt"

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
