package xds

import (
	"net/netip"
	"slices"
	"strconv"

	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// serviceEntry builds everything one service contributes to a snapshot: its outbound clusters
// and EDS resources (one per non-UDP port, when the service has a VIP), its floor chains, its
// entries in the capture filter-chain matcher and in the capture route table, and its virtual
// hosts in the lane route table. It reads only the service, its endpoints and mesh-wide values
// (svcEntry lists them), so it may run for many services at once. When old (the service's entry
// in the previous build, or nil) was built from the same service and short name, only the EDS
// resources are built again, and the clusters too unless the endpoints' SPIFFE IDs or their
// other target ports (otherTargetPorts) changed.
func (b *builder) serviceEntry(s *model.Service, old *svcEntry) (*svcEntry, error) {
	eps := b.m.Endpoints[s.Key]
	e := &svcEntry{svc: s, eps: eps, short: b.m.ShortName(s.Key), peers: peerIDs(eps)}
	for _, sp := range s.Ports {
		e.otherPorts = append(e.otherPorts, otherTargetPorts(b.m, s, sp, b.opts.viaWaypoint()))
	}
	// A headless service's capture entries and direct clusters follow its endpoints: rebuilt whole.
	if old != nil && !s.Headless && old.short == e.short && serviceEqual(old.svc, s) {
		e.floors, e.chains, e.routes, e.lane = old.floors, old.chains, old.routes, old.lane
		if slices.Equal(old.peers, e.peers) && slices.EqualFunc(old.otherPorts, e.otherPorts, otherPorts.equal) {
			e.clusters, e.clustersValid = old.clusters, old.valid || old.clustersValid
		} else if err := b.outboundClusters(e); err != nil {
			return nil, err
		}
		e.clas = b.loadAssignments(s)
		return e, nil
	}
	if err := b.outboundClusters(e); err != nil {
		return nil, err
	}
	e.clas = b.loadAssignments(s)
	vips := s.AllVIPs()
	for _, sp := range s.Ports {
		if sp.Protocol == model.ProtocolUDP {
			continue
		}
		cn := ClusterName(b.m, s.Key, sp.Port)
		if s.Headless {
			if err := b.directEntries(e, sp); err != nil {
				return nil, err
			}
		}
		// Capture: the chain this port's VIPs select (floor chains exist even without a VIP).
		chain := captureHTTPChain
		if !sp.Protocol.IsHTTP() {
			fc, err := newFloorChain(cn)
			if err != nil {
				return nil, err
			}
			e.floors, chain = append(e.floors, fc), fc.name
		}
		port := strconv.FormatUint(uint64(sp.Port), 10)
		for _, vip := range vips {
			e.chains = append(e.chains, vipChain{vip: vip.String(), port: port, action: chainAction(chain)})
		}
		if sp.Protocol.IsHTTP() {
			route, _ := anypb.New(routeTo(cn))
			for _, vip := range vips {
				e.routes = append(e.routes, vipRoute{dst: netip.AddrPortFrom(vip, uint16(sp.Port)).String(), action: routeAction(route)})
			}
		}
	}
	e.lane = laneVirtualHosts(b.m, s, e.short)
	return e, nil
}

// hasClusters reports whether a service gets outbound EDS clusters (and lane virtual hosts): when
// it has a local or clusterset VIP, or is headless (its lane virtual hosts balance over its
// pods). Any other service without a VIP (a Service of type ExternalName, an import whose VIP is
// not known yet) has no cluster and no virtual host: a lane request for its name gets 404, not a
// route to a missing cluster.
func hasClusters(s *model.Service) bool { return len(s.VIPs)+len(s.ClustersetVIPs) > 0 || s.Headless }

// hasLocalCluster reports whether service port sp of s gets a LocalClusterName cluster beside its
// ClusterName one: a port a route's Service backendRef can name (HTTP for GAMMA routes, TCP for
// TCPRoutes and TLSRoutes: any but UDP) of a service that is local and imported, so that its EDS
// cluster may hold other clusters' endpoints.
func hasLocalCluster(s *model.Service, sp model.ServicePort) bool {
	return s.Local && s.Imported && sp.Protocol != model.ProtocolUDP && hasClusters(s)
}

// outboundClusters builds e's outbound EDS clusters: one per non-UDP port when hasClusters, pinned
// to e.peers, with the sockets of e.otherPorts, and the port's local cluster where
// hasLocalCluster (the same cluster under another name, for its own EDS resource).
func (b *builder) outboundClusters(e *svcEntry) error {
	if !hasClusters(e.svc) {
		return nil
	}
	for i, sp := range e.svc.Ports {
		if sp.Protocol == model.ProtocolUDP {
			continue
		}
		names := []string{ClusterName(b.m, e.svc.Key, sp.Port)}
		if hasLocalCluster(e.svc, sp) {
			names = append(names, LocalClusterName(b.m, e.svc.Key, sp.Port))
		}
		for _, name := range names {
			c, err := b.outboundCluster(name, e.svc, sp, e.peers, e.otherPorts[i])
			if err != nil {
				return err
			}
			e.clusters = append(e.clusters, c)
		}
	}
	return nil
}

// loadAssignments are the EDS resources of s's outbound clusters (outboundClusters), in their
// order.
func (b *builder) loadAssignments(s *model.Service) []*endpointv3.ClusterLoadAssignment {
	if !hasClusters(s) {
		return nil
	}
	var out []*endpointv3.ClusterLoadAssignment
	for _, sp := range s.Ports {
		if sp.Protocol == model.ProtocolUDP {
			continue
		}
		out = append(out, loadAssignment(b.m, s, sp, b.opts.viaWaypoint(), false))
		if hasLocalCluster(s, sp) {
			out = append(out, loadAssignment(b.m, s, sp, false, true))
		}
	}
	return out
}

// floorChain is the tcp_proxy filter of one TCP service port.
type floorChain struct {
	name string
	tcp  *listenerv3.Filter
}

// newFloorChain is the floor chain floorChainName(cn) that passes connections to the cluster cn
// (tcp_proxy, stat prefix outbound_tcp).
func newFloorChain(cn string) (floorChain, error) {
	tp, err := xdsproto.TCPProxy("outbound_tcp", cn)
	return floorChain{name: floorChainName(cn), tcp: tp}, err
}

// floorChainName is the name of the floor chain of the cluster cn: "tcp|<cn>".
func floorChainName(cn string) string { return "tcp|" + cn }

// vipChain is one entry of the capture filter-chain matcher: port and VIP to a chain.
type vipChain struct {
	vip, port string
	action    *xdsmatcher.Matcher_OnMatch
}

// vipRoute is one entry of a capture route table: "VIP:port" (CaptureRouteName) or
// "<pod_ip>:<port>" (CaptureHeadlessRouteName) to a route.
type vipRoute struct {
	dst    string
	action *xdsmatcher.Matcher_OnMatch
}
