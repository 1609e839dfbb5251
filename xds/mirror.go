package xds

import (
	"fmt"
	"slices"

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

// maxMirrorClusters bounds the mirror clusters of one node: each is a copy of a backend's
// cluster and endpoints, and routes in any namespace may name up to 16 x 16 mirrors per route.
const maxMirrorClusters = 1024

// mirrorResources are the mirror clusters of a build: for each target (a backend cluster and the
// namespace whose callers mirror to it, "" for all) and each local identity of those callers
// (idsByNS: the local pods' SPIFFE IDs by namespace, sorted), the target's cluster and EDS
// resource (from entries) copied under mirrorClusterName with the identity's certificate
// (mirrorCluster), at most maxMirrorClusters in all, in target then identity order; omitted
// counts the ones over the bound. An entry of old whose source is the same value is kept. A
// target whose cluster has a transport_socket_matcher (CertMatcher) gets none: that mechanism
// picks the certificate from the filter state a mirrored copy does not have, and so cannot
// mirror.
func mirrorResources(idsByNS map[string][]string, targets []mirrorTarget, entries []*svcEntry, old map[string]*mirrorEntry) (out map[string]*mirrorEntry, omitted int, err error) {
	if len(idsByNS) == 0 || len(targets) == 0 {
		return nil, 0, nil
	}
	want := map[string]bool{}
	for _, t := range targets {
		want[t.cluster] = true
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
	var all []string
	for _, ids := range idsByNS {
		all = append(all, ids...)
	}
	slices.Sort(all)
	out = map[string]*mirrorEntry{}
	for _, t := range targets {
		src, srcCLA := srcs[t.cluster], clas[t.cluster]
		if src == nil || srcCLA == nil || src.TransportSocketMatcher != nil {
			continue
		}
		ids := idsByNS[t.ns]
		if t.ns == "" {
			ids = all
		}
		for _, id := range ids {
			name := mirrorClusterName(id, t.cluster)
			if out[name] != nil {
				continue // a producer and a consumer route of the same caller's namespace
			}
			if len(out) == maxMirrorClusters {
				omitted++
				continue
			}
			me := &mirrorEntry{src: src, srcCLA: srcCLA}
			if o := old[name]; o != nil && o.src == src {
				me.c, me.valid = o.c, o.valid
			} else {
				c, err := mirrorCluster(src, name, id)
				if err != nil {
					return nil, 0, err
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
	return out, omitted, nil
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
