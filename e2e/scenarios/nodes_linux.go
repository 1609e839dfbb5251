package scenarios

import (
	"context"
	"fmt"
	"net"
	"net/netip"

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

// nodeLifecycle is what a pair of real nodes adds for the scenarios only they can run: a node
// rebooted, aether upgraded with Helm.
type nodeLifecycle interface {
	// RebootNode restarts node as a reboot does (substrate.Node.Reboot).
	RebootNode(ctx context.Context, cluster, node string) error
	// UpgradeAether runs helm upgrade --reuse-values with set ("key=value") in cluster.
	UpgradeAether(ctx context.Context, cluster string, set ...string) error
}

// nodesPair is the pair of the substrate's real nodes: the kind pair's code over the API
// servers, plus the node lifecycle.
type nodesPair struct {
	*kindPair
	m *mesh.Mesh
}

func (p *nodesPair) RebootNode(ctx context.Context, cluster, node string) error {
	c := p.m.Cluster(cluster)
	if c == nil || c.Node(node) == nil {
		return fmt.Errorf("reboot: no node %s in cluster %s", node, cluster)
	}
	return c.Node(node).Reboot(ctx)
}

func (p *nodesPair) UpgradeAether(ctx context.Context, cluster string, set ...string) error {
	return p.m.HelmUpgrade(ctx, cluster, set...)
}

// GatewayAddressPool is the range cluster's Gateways take spec.addresses from
// (substrate.ClusterPlan.GatewayAddressPool, the registrar's --gateway-address-cidrs).
func (p *nodesPair) GatewayAddressPool(cluster string) (netip.Prefix, error) {
	c := p.m.Cluster(cluster)
	if c == nil {
		return netip.Prefix{}, fmt.Errorf("no cluster %q", cluster)
	}
	return c.Plan.GatewayAddressPool, nil
}

// DialOutside opens a TCP connection to addr from the underlay namespace: outside every cluster,
// where the Gateway address pools are routed to their cluster's first node.
func (p *nodesPair) DialOutside(ctx context.Context, addr string) (net.Conn, error) {
	var conn net.Conn
	err := p.m.Substrate.Underlay.Do(func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		conn = c
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s from the underlay: %w", addr, err)
	}
	return conn, nil
}
