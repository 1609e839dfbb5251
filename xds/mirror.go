package xds

import (
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/internal/xdsproto"
)

// mirrorEntry is one mirror cluster (mirrorClusterName) and its EDS resource, with the outbound
// cluster and EDS resource they copy (the same values while those are kept).
type mirrorEntry struct {
	src    *clusterv3.Cluster
	srcCLA *endpointv3.ClusterLoadAssignment
	c      *clusterv3.Cluster
	cla    *endpointv3.ClusterLoadAssignment
	// valid is set once a build that served c passed ValidateAll; claValid likewise for cla.
	valid, claValid bool
}

// mirrorResources are the mirror clusters of a build: for each local identity of ids and each
// cluster of targets, target's cluster and EDS resource (from entries) copied under
// mirrorClusterName with the identity's certificate (mirrorCluster). An entry of old whose
// source is the same value is kept. A target whose cluster has a transport_socket_matcher
// (CertMatcher) gets none: that mechanism picks the certificate from the filter state a mirrored
// copy does not have, and so cannot mirror.
func mirrorResources(ids, targets []string, entries []*svcEntry, old map[string]*mirrorEntry) (map[string]*mirrorEntry, error) {
	if len(ids) == 0 || len(targets) == 0 {
		return nil, nil
	}
	want := map[string]bool{}
	for _, t := range targets {
		want[t] = true
	}
	srcs := map[string]*clusterv3.Cluster{}
	clas := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, e := range entries {
		for _, c := range e.clusters {
			if want[c.Name] {
				srcs[c.Name] = c
			}
		}
		for _, cla := range e.clas {
			if want[cla.ClusterName] {
				clas[cla.ClusterName] = cla
			}
		}
	}
	out := map[string]*mirrorEntry{}
	for _, t := range targets {
		src, srcCLA := srcs[t], clas[t]
		if src == nil || srcCLA == nil || src.TransportSocketMatcher != nil {
			continue
		}
		for _, id := range ids {
			name := mirrorClusterName(id, t)
			me := &mirrorEntry{src: src, srcCLA: srcCLA}
			if o := old[name]; o != nil && o.src == src {
				me.c, me.valid = o.c, o.valid
			} else {
				c, err := mirrorCluster(src, name, id)
				if err != nil {
					return nil, err
				}
				me.c = c
			}
			if o := old[name]; o != nil && o.srcCLA == srcCLA {
				me.cla, me.claValid = o.cla, o.claValid
			} else {
				me.cla = proto.Clone(srcCLA).(*endpointv3.ClusterLoadAssignment)
				me.cla.ClusterName = name
			}
			out[name] = me
		}
	}
	return out, nil
}

// mirrorCluster is src under name with every transport socket presenting the SVID of identity id
// (a SPIFFE ID) instead of the on-demand certificate selector's choice; the SNI, the peer pin and
// the endpoints' socket matches stay those of src. The SVID is read from the static SDS secret
// InboundSecretName(id): a static subscription to the secret named id, which the selector
// subscribes to on demand, would leave the selector's subscription warming (InboundSecretName).
func mirrorCluster(src *clusterv3.Cluster, name, id string) (*clusterv3.Cluster, error) {
	c := proto.Clone(src).(*clusterv3.Cluster)
	c.Name = name
	sockets := []*core.TransportSocket{c.TransportSocket}
	for _, m := range c.TransportSocketMatches {
		sockets = append(sockets, m.TransportSocket)
	}
	for _, ts := range sockets {
		ctx := &tlsv3.UpstreamTlsContext{}
		if err := ts.GetTypedConfig().UnmarshalTo(ctx); err != nil {
			return nil, fmt.Errorf("build mirror cluster %s: %w", name, err)
		}
		ctx.CommonTlsContext.CustomTlsCertificateSelector = nil
		ctx.CommonTlsContext.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsRef(InboundSecretName(id))}
		a, err := xdsproto.ToAny(ctx)
		if err != nil {
			return nil, fmt.Errorf("build mirror cluster %s: %w", name, err)
		}
		ts.ConfigType = &core.TransportSocket_TypedConfig{TypedConfig: a}
	}
	return c, nil
}
