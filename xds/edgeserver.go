package xds

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
)

// EdgeServer serves one edge Envoy of a Gateway (BuildEdge) over ADS, state-of-the-world and
// delta: the agent runs one per edge pod on its node, on a listener inside that pod's network
// namespace, so that only that pod's processes reach it. Whatever node id the Envoy presents, it
// gets this Gateway's configuration and nothing else. The edge's SVID (the SPIFFE ID of the
// Gateway's edge ServiceAccount) comes from the agent's identity provider (the development CA's
// Rotator, or SPIRE for the edge pod), renewed as the provider says. A failed build (no SVID yet)
// keeps the last good configuration served.
type EdgeServer struct {
	key  model.GatewayKey
	pod  identity.Workload
	idp  identity.Provider
	opts Options
	log  *slog.Logger

	cache  cache.SnapshotCache
	hashes *hashMemo
	epoch  string

	mu   sync.Mutex
	seq  uint64
	mesh *model.Mesh
	gw   *model.EdgeGateway
	last string // version of the snapshot served
	kick chan struct{}
}

// NewEdgeServer returns an EdgeServer for gateway key whose edge pod is pod (its UID and the
// SPIFFE ID it runs as), with its SVID from idp, which serves this edge pod only. It serves
// nothing until the first Set.
func NewEdgeServer(key model.GatewayKey, pod identity.Workload, idp identity.Provider, opts Options, log *slog.Logger) (*EdgeServer, error) {
	if err := opts.check(); err != nil {
		return nil, fmt.Errorf("new edge server %s: %w", key, err)
	}
	if idp == nil {
		return nil, fmt.Errorf("new edge server %s: nil identity provider", key)
	}
	if log == nil {
		log = slog.Default()
	}
	return &EdgeServer{key: key, pod: pod, idp: idp, opts: opts, log: log.With("gateway", key.String()),
		cache: cache.NewSnapshotCache(false, anyNode{}, nil), hashes: &hashMemo{},
		epoch: strconv.FormatInt(time.Now().UnixNano(), 36), kick: make(chan struct{}, 1)}, nil
}

// anyNode hashes every Envoy to one key: the listener, not the node id an Envoy claims, decides
// which Gateway it is.
type anyNode struct{}

func (anyNode) ID(*core.Node) string { return "edge" }

// Set builds the edge configuration of g from m and serves it; it returns the snapshot version.
// On error (a build or consistency failure) the previous configuration stays served.
func (s *EdgeServer) Set(ctx context.Context, m *model.Mesh, g *model.EdgeGateway) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setLocked(ctx, m, g)
}

func (s *EdgeServer) setLocked(ctx context.Context, m *model.Mesh, g *model.EdgeGateway) (string, error) {
	// What renew builds again, served or not (a first build without an SVID yet is built again
	// when the provider has it).
	s.mesh, s.gw = m, g
	svids, _, err := s.idp.SVIDs(ctx, []identity.Workload{s.pod})
	if err != nil {
		return "", fmt.Errorf("edge %s: %w", s.key, err)
	}
	svid := svids[s.pod.SPIFFEID]
	if svid == nil {
		return "", fmt.Errorf("edge %s: no SVID for %s from the identity provider yet", s.key, s.pod.SPIFFEID)
	}
	r, err := BuildEdge(m, g, svid, s.idp.Bundles(), s.opts)
	if err != nil {
		return "", err
	}
	if err := r.ValidateAll(); err != nil {
		return "", fmt.Errorf("edge %s: %w", s.key, err)
	}
	s.seq++
	version := s.epoch + "." + strconv.FormatUint(s.seq, 10)
	snap, err := newSnapshot(version, r.typed(), s.hashes)
	if err != nil {
		s.seq--
		return "", fmt.Errorf("edge %s: check snapshot: %w", s.key, err)
	}
	if err := s.cache.SetSnapshot(ctx, "edge", snap); err != nil {
		s.seq--
		return "", fmt.Errorf("edge %s: set snapshot: %w", s.key, err)
	}
	s.last = version
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return version, nil
}

// Version returns the version of the configuration served ("" before the first Set).
func (s *EdgeServer) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Serve serves ADS on l until ctx ends, renewing the SVID at its half-life. It returns nil when
// ctx ends.
func (s *EdgeServer) Serve(ctx context.Context, l net.Listener) error {
	// The renewal ends with Serve: after it returns nothing asks the identity provider for this
	// edge's SVID (its owner's subscription is released then).
	ctx, cancel := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() { defer close(renewed); s.renew(ctx) }()
	defer func() { cancel(); <-renewed }()
	// A panic in a stream ends that stream, never the agent (recoverStream).
	if err := serveADS(ctx, l, s.cache, nil, recoverStream(s.log, func() {})); err != nil {
		return fmt.Errorf("serve edge xds %s: %w", s.key, err)
	}
	return nil
}

// renew rebuilds the configuration when the SVID reaches its half-life, and when the provider
// has a new SVID or bundle of its own (SPIRE's rotations; the first SVID of a new edge pod).
func (s *EdgeServer) renew(ctx context.Context) {
	for {
		due, fired, changed, done := renewalWait(ctx, s.idp, s.kick)
		if done {
			return
		}
		if !changed && (!fired || due.IsZero() || time.Now().Before(due)) {
			continue
		}
		s.mu.Lock()
		if s.mesh != nil {
			if _, err := s.setLocked(ctx, s.mesh, s.gw); err != nil {
				s.log.Error("renew edge SVID", "err", err)
			}
		}
		s.mu.Unlock()
	}
}
