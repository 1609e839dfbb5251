package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// snapshot is one configuration the Server serves, a go-control-plane cache.ResourceSnapshot:
// every resource type of snapshotTypes carries the snapshot's version. For delta xDS it computes
// the same per-resource versions as cache.Snapshot (the SHA-256 of the deterministic encoding,
// cache.MarshalResource and cache.HashResource) but once per resource value: a resource the
// Builder carried over unchanged from an earlier snapshot (the same value) keeps its hash
// through the shared hashMemo, without being marshalled again. Envoy then receives only the
// resources whose hash changed.
type snapshot struct {
	version string
	items   [types.UnknownType]map[string]types.ResourceWithTTL
	plain   [types.UnknownType]map[string]types.Resource
	memo    *hashMemo
	// edsVersion and edsHold, set only on the first step of a two-step push (holdEDS), make the
	// snapshot report the EDS type's version and some EDS resources' versions as Envoy already
	// holds them, so that nothing of those is sent before the clusters.
	edsVersion string
	edsHold    map[string]string

	mu       sync.Mutex
	versions map[string]map[string]string
}

var _ cache.ResourceSnapshot = (*snapshot)(nil)

// hashMemo maps resource values (and shared parts, sharedParts) to their delta version hash. Each ConstructVersionMap replaces
// its contents with the hashes of the snapshot it ran for, so it never holds more than two
// snapshots' resources.
type hashMemo struct {
	mu sync.Mutex
	// m is keyed by resource values and by shared parts (sharedParts keys).
	m map[any]string
}

// newSnapshot returns the snapshot of r under version, after checking that it is consistent
// (checkConsistent). memo may be nil (no reuse of hashes).
func newSnapshot(version string, r map[resource.Type][]types.Resource, memo *hashMemo) (*snapshot, error) {
	if memo == nil {
		memo = &hashMemo{}
	}
	s := &snapshot{version: version, memo: memo}
	for _, t := range snapshotTypes {
		i := cache.GetResponseType(t)
		xs := r[t]
		s.items[i] = make(map[string]types.ResourceWithTTL, len(xs))
		s.plain[i] = make(map[string]types.Resource, len(xs))
		for _, x := range xs {
			name := cache.GetResourceName(x)
			s.items[i][name] = types.ResourceWithTTL{Resource: x}
			s.plain[i][name] = x
		}
	}
	if err := s.consistent(); err != nil {
		return nil, err
	}
	return s, nil
}

// resources returns the snapshot's resources by type, to serve them again under a new version.
func (s *snapshot) resources() map[resource.Type][]types.Resource {
	out := map[resource.Type][]types.Resource{}
	for _, t := range snapshotTypes {
		out[t] = []types.Resource{}
		for _, x := range s.plain[cache.GetResponseType(t)] {
			out[t] = append(out[t], x)
		}
	}
	return out
}

// GetVersion implements cache.ResourceSnapshot.
func (s *snapshot) GetVersion(typeURL string) string {
	if i := cache.GetResponseType(typeURL); i != types.UnknownType && s.items[i] != nil {
		if typeURL == resource.EndpointType && s.edsVersion != "" {
			return s.edsVersion
		}
		return s.version
	}
	return ""
}

// changedEDSClusters returns the names of the EDS clusters that prev and s both hold with a
// ClusterLoadAssignment but whose Cluster resource differs.
func (s *snapshot) changedEDSClusters(prev *snapshot) []string {
	ci, ei := cache.GetResponseType(resource.ClusterType), cache.GetResponseType(resource.EndpointType)
	var out []string
	for name, c := range s.plain[ci] {
		old, ok := prev.plain[ci][name]
		if !ok || old == c || proto.Equal(old, c) {
			continue
		}
		if _, ok := s.plain[ei][name]; !ok {
			continue
		}
		if _, ok := prev.plain[ei][name]; ok {
			out = append(out, name)
		}
	}
	return out
}

// holdEDS returns the first step of pushing s after prev when clusters changed (names, from
// changedEDSClusters): s's resources, with the EDS type's version (state of the world) and the
// named ClusterLoadAssignments' versions (delta) as prev served them, so that the first step
// sends the changed clusters and not their endpoints. Serving s itself next then sends those
// endpoints after the clusters. Envoy replaces a changed cluster with a new one that stays
// warming until an EDS response arrives after it (xDS protocol, "Eventual consistency
// considerations": EDS after CDS); one that arrives before it goes to the old cluster, and the new
// one waits for its initial fetch timeout (15 s). Delta ADS sends the two steps' responses in
// order (one stream queue); state-of-the-world ADS queues them per type, so there the order is
// likely, not certain.
func (s *snapshot) holdEDS(prev *snapshot, names []string) *snapshot {
	first := &snapshot{version: s.version, items: s.items, plain: s.plain, memo: s.memo,
		edsVersion: prev.GetVersion(resource.EndpointType), edsHold: map[string]string{}}
	if vm := prev.GetVersionMap(resource.EndpointType); vm != nil {
		for _, n := range names {
			if v, ok := vm[n]; ok {
				first.edsHold[n] = v
			}
		}
	}
	return first
}

// GetResourcesAndTTL implements cache.ResourceSnapshot.
func (s *snapshot) GetResourcesAndTTL(typeURL string) map[string]types.ResourceWithTTL {
	if i := cache.GetResponseType(typeURL); i != types.UnknownType {
		return s.items[i]
	}
	return nil
}

// GetResources implements cache.ResourceSnapshot. The map is shared: callers only read it.
func (s *snapshot) GetResources(typeURL string) map[string]types.Resource {
	if i := cache.GetResponseType(typeURL); i != types.UnknownType {
		return s.plain[i]
	}
	return nil
}

// GetVersionMap implements cache.ResourceSnapshot.
func (s *snapshot) GetVersionMap(typeURL string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.versions[typeURL]
}

// ConstructVersionMap implements cache.ResourceSnapshot: the version of every resource
// (resourceVersion), taken from the memo when the same value was hashed for an earlier snapshot,
// else computed (in parallel).
func (s *snapshot) ConstructVersionMap() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.versions != nil {
		return nil
	}
	s.memo.mu.Lock()
	defer s.memo.mu.Unlock()
	next := map[any]string{}
	var todo []types.Resource
	queued := map[any]bool{}
	var parts []sharedPart
	for _, t := range snapshotTypes {
		for _, x := range s.plain[cache.GetResponseType(t)] {
			// A shared part's hash is kept while any listener holds it, hashed or not, so that
			// the next new listener holding it (a new pod) does not encode it again.
			for _, p := range sharedParts(x) {
				if queued[p.key] {
					continue
				}
				queued[p.key] = true
				if h, ok := s.memo.m[p.key]; ok {
					next[p.key] = h
				} else {
					parts = append(parts, p)
				}
			}
			if h, ok := s.memo.m[x]; ok {
				next[x] = h
				continue
			}
			if !queued[x] {
				queued[x] = true
				todo = append(todo, x)
			}
		}
	}
	// The shared parts first, each once; then the resources, which read their hashes.
	ph := make([]string, len(parts))
	if err := parallel(len(parts), func(i int) (err error) {
		ph[i], err = hashMessage(parts[i].msg, "")
		return err
	}); err != nil {
		return fmt.Errorf("construct version map: %w", err)
	}
	for i, p := range parts {
		next[p.key] = ph[i]
	}
	hs := make([]string, len(todo))
	if err := parallel(len(todo), func(i int) (err error) {
		hs[i], err = resourceVersion(todo[i], next)
		return err
	}); err != nil {
		return fmt.Errorf("construct version map: %w", err)
	}
	for i, x := range todo {
		next[x] = hs[i]
	}
	versions := map[string]map[string]string{}
	for _, t := range snapshotTypes {
		plain := s.plain[cache.GetResponseType(t)]
		vm := make(map[string]string, len(plain))
		for name, x := range plain {
			vm[name] = next[x]
		}
		versions[t] = vm
	}
	// An EDS resource's version also carries its cluster's, so a changed cluster is always
	// followed by its ClusterLoadAssignment (the server sends CDS before EDS): Envoy replaces a
	// changed cluster with a new one that stays warming until an EDS response arrives for it
	// (xDS protocol, "Eventual consistency considerations"), and without one it waits for the
	// initial fetch timeout (15 s).
	clusters := s.plain[cache.GetResponseType(resource.ClusterType)]
	eds := versions[resource.EndpointType]
	for name, v := range eds {
		if c, ok := clusters[name]; ok {
			eds[name] = v + "/" + next[c]
		}
	}
	for name, v := range s.edsHold {
		eds[name] = v
	}
	s.versions = versions
	s.memo.m = next
	return nil
}

// sharedPart is a part of a resource that other resources hold too, hashed once per snapshot:
// msg's encoding, under key.
type sharedPart struct {
	key any
	msg proto.Message
}

// sharedParts are the parts of x hashed apart: for a listener with a filter_chain_matcher (the
// capture listeners, which share it and their filter chains), the matcher and the filter chains.
func sharedParts(x types.Resource) []sharedPart {
	l, ok := x.(*listenerv3.Listener)
	if !ok || l.FilterChainMatcher == nil {
		return nil
	}
	parts := []sharedPart{{key: l.FilterChainMatcher, msg: l.FilterChainMatcher}}
	if k := chainsKey(l.FilterChains); k != nil {
		parts = append(parts, sharedPart{key: k, msg: &listenerv3.Listener{FilterChains: l.FilterChains}})
	}
	return parts
}

// resourceVersion is a resource's delta version: go-control-plane's (cache.HashResource of
// cache.MarshalResource), except for a listener with shared parts (sharedParts: the capture
// listeners' matcher, one entry per VIP and port, and filter chains, one per TCP service port:
// nearly all of each listener's bytes). Its version hashes the listener without them together
// with their own hashes (in shared), so that they are encoded once per snapshot, not once per
// pod. Versions are opaque to Envoy and to go-control-plane (compared for equality only); this
// one is as deterministic as the library's, so an unchanged listener keeps its version across
// builds and agent restarts.
func resourceVersion(x types.Resource, shared map[any]string) (string, error) {
	parts := sharedParts(x)
	if len(parts) == 0 {
		return hashMessage(x, "")
	}
	l := x.(*listenerv3.Listener)
	without := &listenerv3.Listener{}
	dst := without.ProtoReflect()
	l.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if n := fd.Number(); n != filterChainMatcherField && n != filterChainsField {
			dst.Set(fd, v) // shares the value; nothing here writes to it
		}
		return true
	})
	extra := "filter_chain_matcher:" + shared[parts[0].key]
	if len(parts) > 1 {
		extra += "\x00filter_chains:" + shared[parts[1].key]
	}
	return hashMessage(without, extra)
}

// Field numbers of Listener.filter_chain_matcher and Listener.filter_chains.
var (
	listenerFields          = (&listenerv3.Listener{}).ProtoReflect().Descriptor().Fields()
	filterChainMatcherField = listenerFields.ByName("filter_chain_matcher").Number()
	filterChainsField       = listenerFields.ByName("filter_chains").Number()
)

// hashMessage is cache.HashResource of the deterministic encoding of m (cache.MarshalResource),
// with a NUL and extra (named hashes of shared parts) appended to the encoding before hashing
// when extra is not empty.
func hashMessage(m proto.Message, extra string) (string, error) {
	b, err := cache.MarshalResource(m)
	if err != nil {
		return "", fmt.Errorf("marshal %T: %w", m, err)
	}
	if extra == "" {
		return cache.HashResource(b), nil
	}
	h := sha256.New()
	h.Write(b)
	h.Write([]byte("\x00" + extra))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// consistent is cache.Snapshot.Consistent's rule, computed the same way (each EDS cluster names
// its ClusterLoadAssignment, by EdsClusterConfig.service_name or its own name; each HTTP
// connection manager with RDS names its route configuration; the names referenced and the
// resources present must be the same sets) but without trying to unmarshal every network filter
// as an HTTP connection manager: the library does that for each filter of each filter chain and
// pays a formatted error for each one that is not (a capture listener has one floor chain per
// TCP service port). A filter is read as an HTTP connection manager when its type URL says so;
// each distinct typed config is decoded once. TestConsistentAgreesWithLibrary checks that both
// agree.
func (s *snapshot) consistent() error {
	eds := map[string]bool{}
	for _, x := range s.plain[types.Cluster] {
		c := x.(*clusterv3.Cluster)
		if c.GetType() != clusterv3.Cluster_EDS {
			continue
		}
		if n := c.GetEdsClusterConfig().GetServiceName(); n != "" {
			eds[n] = true
		} else {
			eds[c.GetName()] = true
		}
	}
	routes := map[string]bool{}
	decoded := map[*anypb.Any]*hcmv3.HttpConnectionManager{}
	chain := func(fc *listenerv3.FilterChain) {
		for _, f := range fc.GetFilters() {
			tc := f.GetTypedConfig()
			if tc == nil || !tc.MessageIs(hcmType) {
				continue
			}
			h, seen := decoded[tc]
			if !seen {
				h = &hcmv3.HttpConnectionManager{}
				if err := anypb.UnmarshalTo(tc, h, proto.UnmarshalOptions{}); err != nil {
					h = nil
				}
				decoded[tc] = h
			}
			if h == nil {
				continue
			}
			if n := h.GetRds().GetRouteConfigName(); n != "" {
				routes[n] = true
			}
			for _, sr := range h.GetScopedRoutes().GetScopedRouteConfigurationsList().GetScopedRouteConfigurations() {
				routes[sr.GetRouteConfigurationName()] = true
			}
		}
	}
	sharedChains := map[any]bool{} // the capture listeners' shared chains are read once
	for _, x := range s.plain[types.Listener] {
		l := x.(*listenerv3.Listener)
		if k := chainsKey(l.GetFilterChains()); k == nil || !sharedChains[k] {
			sharedChains[k] = true
			for _, fc := range l.GetFilterChains() {
				chain(fc)
			}
		}
		if fc := l.GetDefaultFilterChain(); fc != nil {
			chain(fc)
		}
	}
	return errors.Join(sameNames(resource.EndpointType, eds, s.plain[types.Endpoint]), sameNames(resource.RouteType, routes, s.plain[types.Route]))
}

var hcmType = &hcmv3.HttpConnectionManager{}

// sameNames is cache.Snapshot.Consistent's check of one type: as many references as resources,
// and every resource referenced.
func sameNames(typeURL string, refs map[string]bool, items map[string]types.Resource) error {
	if len(refs) != len(items) {
		return fmt.Errorf("mismatched %q reference and resource lengths: %d references, %d resources", typeURL, len(refs), len(items))
	}
	for name := range items {
		if !refs[name] {
			return fmt.Errorf("inconsistent %q reference: %q not listed", typeURL, name)
		}
	}
	return nil
}
