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
// Gateway's edge ServiceAccount) is issued from the agent's identity source and renewed at its
// half-life. A failed build keeps the last good configuration served.
type EdgeServer struct {
	key  model.GatewayKey
	id   string
	rot  *identity.Rotator
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

// NewEdgeServer returns an EdgeServer for gateway key whose edge runs as SPIFFE ID id, issuing
// its SVID from src. It serves nothing until the first Set.
func NewEdgeServer(key model.GatewayKey, id string, src identity.Source, opts Options, log *slog.Logger) (*EdgeServer, error) {
	if err := opts.check(); err != nil {
		return nil, fmt.Errorf("new edge server %s: %w", key, err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &EdgeServer{key: key, id: id, rot: identity.NewRotator(src), opts: opts, log: log.With("gateway", key.String()),
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
	svids, _, err := s.rot.SVIDs(ctx, []string{s.id})
	if err != nil {
		return "", fmt.Errorf("edge %s: %w", s.key, err)
	}
	r, err := BuildEdge(m, g, svids[0], s.rot.Source().BundlePEM(), s.opts)
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
	s.mesh, s.gw, s.last = m, g, version
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
	go s.renew(ctx)
	// A panic in a stream ends that stream, never the agent (recoverStream).
	if err := serveADS(ctx, l, s.cache, nil, recoverStream(s.log, func() {})); err != nil {
		return fmt.Errorf("serve edge xds %s: %w", s.key, err)
	}
	return nil
}

// renew rebuilds the configuration when the SVID reaches its half-life.
func (s *EdgeServer) renew(ctx context.Context) {
	for {
		fired, _, done := renewalWait(ctx, s.rot.Provider(), s.kick)
		if done {
			return
		}
		if !fired {
			continue
		}
		s.mu.Lock()
		if s.mesh != nil && !time.Now().Before(s.rot.NextRenewal()) {
			if _, err := s.setLocked(ctx, s.mesh, s.gw); err != nil {
				s.log.Error("renew edge SVID", "err", err)
			}
		}
		s.mu.Unlock()
	}
}
