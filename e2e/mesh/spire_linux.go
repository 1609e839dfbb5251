package mesh

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/internal/testenv"
)

// Identity is where the mesh's workload identities come from (Options.Identity).
type Identity string

const (
	// IdentityDevCA: one development CA shared by every agent of both clusters (--ca-cert,
	// --ca-key), trust domain aether.internal. The default ("" is it too).
	IdentityDevCA Identity = "dev-ca"
	// IdentitySPIREShared: a SPIRE server per cluster, both under one upstream authority (a root
	// CA the mesh makes, SPIRE's UpstreamAuthority "disk"; each server signs with its own
	// intermediate), one trust domain, aether.internal, for both clusters.
	IdentitySPIREShared Identity = "spire-shared"
	// IdentitySPIREFederated: a SPIRE server and a trust domain per cluster
	// (<cluster>.aether.internal: alpha.aether.internal, beta.aether.internal), each server
	// federated with the other's (bundle endpoints, ClusterFederatedTrustDomain).
	IdentitySPIREFederated Identity = "spire-federated"
)

// SPIRE on the substrate: ports, names and timings.
const (
	// SPIREServerPort is where a cluster's nodes reach its SPIRE server: a forwarder on the
	// cluster's gateway address (the server itself is on the root namespace's loopback).
	SPIREServerPort = 8081
	// spireNodeDir is the node directory of the node's SPIRE agent (a substrate node directory,
	// so it is per node), and SPIREAdminSocket its admin socket (the Delegated Identity API) as
	// the node's processes see it: the aether agent's --spire-admin-socket.
	spireNodeDir     = "/run/spire"
	SPIREAdminSocket = spireNodeDir + "/admin/admin.sock"
	// spireSyncInterval is the SPIRE agents' sync_interval: a new pod's entry reaches its node's
	// agent within about this long after the Controller Manager wrote it.
	spireSyncInterval = time.Second
	// baseTrustDomain is the dev-ca and shared trust domain, and the parent of the federated
	// clusters' trust domains.
	baseTrustDomain = "aether.internal"
)

// DelegateID is the SPIFFE ID of the aether agents in trust domain td: the authorized delegate
// of the SPIRE agents' Delegated Identity API (the chart's: ns aether-system, sa aether-agent).
func DelegateID(td string) string { return "spiffe://" + td + "/ns/aether-system/sa/aether-agent" }

// spire reports whether the mesh's identities come from SPIRE.
func (m *Mesh) spire() bool { return m.Identity != IdentityDevCA }

// TrustDomain is the trust domain of cluster's workloads: <cluster>.aether.internal with
// IdentitySPIREFederated, aether.internal otherwise.
func (m *Mesh) TrustDomain(cluster string) string {
	if m.Identity == IdentitySPIREFederated {
		return cluster + "." + baseTrustDomain
	}
	return baseTrustDomain
}

// otherTrustDomains are the trust domains of every cluster of the plan but cluster's own: those its
// workloads federate with (none with one trust domain).
func (m *Mesh) otherTrustDomains(s *substrate.Substrate, cluster string) []string {
	var out []string
	for _, c := range s.Plan.Clusters {
		if td := m.TrustDomain(c.Name); td != m.TrustDomain(cluster) && !slices.Contains(out, td) {
			out = append(out, td)
		}
	}
	return out
}

// writeUpstreamCA makes the root CA of IdentitySPIREShared, the SPIRE servers' upstream
// authority, in the mesh's directory (outside every node): the SPIRE servers alone read its key.
func (m *Mesh) writeUpstreamCA() error {
	ca, err := testenv.NewCA("aether-e2e-spire-upstream")
	if err != nil {
		return err
	}
	dir := filepath.Join(m.Dir, "spire-upstream")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	m.UpstreamCACert, m.UpstreamCAKey = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := os.WriteFile(m.UpstreamCACert, ca.CertPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(m.UpstreamCAKey, ca.KeyPEM, 0o600)
}

// startSPIREServer starts cluster c's SPIRE server (on the root namespace's loopback, its
// directory <mesh dir>/spire-<cluster>) with its Controller Manager, forwards <gateway>:8081 to
// it for the nodes, and creates the ClusterSPIFFEIDs of the mesh's pods and of the edge
// Gateways' pods. With federation it then federates c with every cluster whose server runs
// already, both ways (ClusterFederatedTrustDomain in each, bootstrapped with the other's
// bundle), and waits until each server holds the other's bundle.
func (m *Mesh) startSPIREServer(ctx context.Context, c *substrate.Cluster) error {
	td := m.TrustDomain(c.Name)
	opts := testenv.SPIREOptions{TrustDomain: td, Cluster: c.Name, AgentSyncInterval: spireSyncInterval,
		Dir: filepath.Join(m.Dir, "spire-"+c.Name)}
	switch m.Identity {
	case IdentitySPIREShared:
		opts.UpstreamCACert, opts.UpstreamCAKey = m.UpstreamCACert, m.UpstreamCAKey
	case IdentitySPIREFederated:
		opts.BundleEndpoint = true
	}
	srv, err := testenv.StartSPIREServerContext(ctx, c.API, opts)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.SPIRE[c.Name] = srv
	m.mu.Unlock()
	if err := srv.StartControllerManager(ctx); err != nil {
		return err
	}
	if err := m.fwd.Listen(c.Substrate().Underlay, net.JoinHostPort(c.Plan.Gateway.String(), strconv.Itoa(SPIREServerPort)), "127.0.0.1:"+strconv.Itoa(srv.Port)); err != nil {
		return fmt.Errorf("forward SPIRE server of %s: %w", c.Name, err)
	}
	others := m.otherTrustDomains(c.Substrate(), c.Name)
	// The mesh's pods: every pod of a namespace labelled aether.io/mesh=enabled.
	mesh := map[string]any{
		"spiffeIDTemplate":  testenv.MeshSPIFFEIDTemplate,
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"aether.io/mesh": "enabled"}},
	}
	// Edge Gateways' pods, in any namespace, under their ServiceAccount <gateway>-aether-edge:
	// the labels the registrar gives them (registrar/gateway.Labels).
	edge := map[string]any{
		"spiffeIDTemplate": testenv.MeshSPIFFEIDTemplate,
		"podSelector": map[string]any{
			"matchLabels":      map[string]any{"aether.io/managed-by": "aether"},
			"matchExpressions": []any{map[string]any{"key": "gateway.networking.k8s.io/gateway-name", "operator": "Exists"}},
		},
	}
	for name, spec := range map[string]map[string]any{"aether-mesh": mesh, "aether-edge": edge} {
		if len(others) > 0 {
			spec["federatesWith"] = toAny(others)
		}
		if err := srv.CreateContext(ctx, "ClusterSPIFFEID", name, spec); err != nil {
			return err
		}
	}
	if m.Identity != IdentitySPIREFederated {
		return nil
	}
	m.mu.Lock()
	peers := make(map[string]*testenv.SPIREServer, len(m.SPIRE))
	for name, s := range m.SPIRE {
		if name != c.Name {
			peers[name] = s
		}
	}
	m.mu.Unlock()
	for _, peer := range peers {
		for _, pair := range [][2]*testenv.SPIREServer{{srv, peer}, {peer, srv}} {
			if err := federate(ctx, pair[0], pair[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// federate makes local federate with remote's trust domain: a ClusterFederatedTrustDomain in
// local's cluster naming remote's bundle endpoint (https_spiffe, remote's server ID),
// bootstrapped with remote's bundle, then waits until local's server holds that bundle.
func federate(ctx context.Context, local, remote *testenv.SPIREServer) error {
	td := remote.Opts.TrustDomain
	bundle, err := remote.Bundle(ctx, "", "spiffe")
	if err != nil {
		return err
	}
	if err := local.CreateContext(ctx, "ClusterFederatedTrustDomain", strings.ReplaceAll(td, ".", "-"), map[string]any{
		"trustDomain":           td,
		"bundleEndpointURL":     remote.BundleEndpointURL,
		"bundleEndpointProfile": map[string]any{"type": "https_spiffe", "endpointSPIFFEID": remote.ServerID()},
		"trustDomainBundle":     string(bundle),
	}); err != nil {
		return err
	}
	_, err = testenv.Poll(ctx, time.Minute, "SPIRE server of "+local.Opts.Cluster+" holds the bundle of "+td, func() error {
		_, err := local.Bundle(ctx, td, "pem")
		return err
	})
	return err
}

// startSPIREAgent starts node n's SPIRE agent as a node process (its directory the node's
// /run/spire: sockets, data, token, configuration, log), attested by k8s_psat with a token bound
// to its placeholder Pod spire/spire-agent-<node> (a host-network pod the kubelet stand-in runs:
// a sleeping client workload), reaching its server at <gateway>:8081. It then registers the
// node's aether agent as its authorized delegate (a ClusterStaticEntry with the selector
// unix:uid:0: there is no kubelet for the k8s workload attestor, and the aether agent runs as
// root on the node), federated like the pods, and waits until the SPIRE agent serves it.
func (m *Mesh) startSPIREAgent(ctx context.Context, n *substrate.Node) error {
	m.mu.Lock()
	srv := m.SPIRE[n.Cluster.Name]
	m.mu.Unlock()
	td := m.TrustDomain(n.Cluster.Name)
	a, err := srv.StartAgentContext(ctx, n.Name, testenv.SPIREAgentOptions{
		AuthorizedDelegates: []string{DelegateID(td)},
		Dir:                 n.HostPath(spireNodeDir),
		ServerAddress:       net.JoinHostPort(n.Cluster.Plan.Gateway.String(), strconv.Itoa(SPIREServerPort)),
		Wrap:                n.Wrap,
		PlaceholderCommand:  []string{m.Bins["client"], "sleep"},
	})
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.SPIREAgents[n.Name] = a
	m.mu.Unlock()
	entry := map[string]any{"spiffeID": DelegateID(td), "parentID": a.ID, "selectors": []any{"unix:uid:0"}}
	if others := m.otherTrustDomains(n.Cluster.Substrate(), n.Cluster.Name); len(others) > 0 {
		entry["federatesWith"] = toAny(others)
	}
	if err := srv.CreateContext(ctx, "ClusterStaticEntry", "aether-agent-"+n.Name, entry); err != nil {
		return err
	}
	_, err = testenv.Poll(ctx, time.Minute, "the SPIRE agent of "+n.Name+" serves "+DelegateID(td), func() error {
		out, err := a.FetchX509(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(out, DelegateID(td)) {
			return fmt.Errorf("it serves: %s", out)
		}
		return nil
	})
	return err
}

// stopSPIREAgent stops node's SPIRE agent, if it runs.
func (m *Mesh) stopSPIREAgent(node string) {
	m.mu.Lock()
	a := m.SPIREAgents[node]
	delete(m.SPIREAgents, node)
	m.mu.Unlock()
	if a != nil {
		a.Stop()
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
