package scenarios

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/e2e/mesh"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/registry"
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

// registryWriter writes into the registry bypassing the registrars: what a misconfigured or
// compromised cluster can do.
type registryWriter interface {
	// PutRogueProjection writes a ServiceConfigProjection for namespace/service under cluster's
	// origin with one HTTPRoute named route (parentRef Service service:80, a response header
	// header=route): with cluster's registry certificate for a cluster of the pair, as root for
	// a cluster name no registrar owns (a cluster outside the pair). It returns a func that
	// deletes it.
	PutRogueProjection(ctx context.Context, cluster, namespace, service, route, header string) (func() error, error)
	// RegistryValue returns the bytes of cluster's ServiceConfigProjection record for
	// namespace/service.
	RegistryValue(ctx context.Context, cluster, namespace, service string) ([]byte, error)
}

func (p *nodesPair) RegistryValue(ctx context.Context, cluster, namespace, service string) ([]byte, error) {
	cli, err := p.registryClient(cluster)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	key := registry.Origin{Region: registry.DefaultRegion, Cluster: cluster}.ConfigKey(namespace, service)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("get %s: no such key", key)
	}
	return resp.Kvs[0].Value, nil
}

// registryClient is an etcd client of the registry with cluster's certificate, or root's for a
// cluster outside the pair.
func (p *nodesPair) registryClient(cluster string) (*clientv3.Client, error) {
	s := p.m.Substrate
	cert, key := s.RegistryRootCertFile, s.RegistryRootKeyFile
	if c := p.m.Cluster(cluster); c != nil {
		cert, key = c.RegistryCertFile, c.RegistryKeyFile
	}
	tlsCfg, err := registry.TLSFiles(cert, key, s.RegistryCAFile)
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: []string{s.RegistryEndpoint}, TLS: tlsCfg, DialTimeout: 5 * time.Second})
}

func (p *nodesPair) PutRogueProjection(ctx context.Context, cluster, namespace, service, route, header string) (func() error, error) {
	cli, err := p.registryClient(cluster)
	if err != nil {
		return nil, fmt.Errorf("put projection: %w", err)
	}
	defer cli.Close()
	svc := &registryv1.ServiceRef{Namespace: namespace, Name: service}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	rec := &registryv1.ServiceConfigProjection{Service: svc, Version: 1 << 40, ExportTime: now, ExportCreateTime: "2000-01-01T00:00:00Z",
		Routes: []*registryv1.Route{{Kind: registryv1.Route_KIND_HTTP, Namespace: namespace, Name: route,
			ParentRefs: []*registryv1.ParentRef{{Kind: registryv1.ParentRef_KIND_SERVICE, Service: svc, Port: 80}},
			Rules: []*registryv1.RouteRule{{
				Matches: []*registryv1.RouteMatch{{Path: &registryv1.PathMatch{Type: registryv1.PathMatch_TYPE_PATH_PREFIX, Value: "/"}}},
				Filters: []*registryv1.RouteFilter{{Filter: &registryv1.RouteFilter_ResponseHeaderModifier{ResponseHeaderModifier: &registryv1.HeaderModifier{
					Set: []*registryv1.Header{{Name: strings.ToLower(header), Value: route}}}}}},
				Backends: []*registryv1.BackendRef{{Kind: registryv1.BackendRef_KIND_SERVICE, Service: svc, Port: 80, Weight: 1}},
			}},
		}}}
	if err := registry.ValidateConfig(rec); err != nil {
		return nil, fmt.Errorf("put projection: %w", err)
	}
	b, err := proto.Marshal(rec)
	if err != nil {
		return nil, err
	}
	origin := registry.Origin{Region: registry.DefaultRegion, Cluster: cluster}
	key := origin.ConfigKey(namespace, service)
	if _, err := cli.Put(ctx, key, string(b)); err != nil {
		return nil, fmt.Errorf("put projection under %s: %w", origin, err)
	}
	return func() error {
		cli, err := p.registryClient(cluster)
		if err != nil {
			return err
		}
		defer cli.Close()
		_, err = cli.Delete(context.Background(), key)
		return err
	}, nil
}
