package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/xds"
)

// pusher hands every new model to the xDS server from one goroutine (SetMesh builds and
// validates a snapshot; a newer model replaces one not yet pushed); a CNI ADD waits (waitAcked)
// for Envoy's ACK of a snapshot of its pod's model.
type pusher struct {
	srv    *xds.Server
	log    *slog.Logger
	latest chan *model.Mesh
	// served, when set, is called after each model the server built and served.
	served func()
}

func newPusher(srv *xds.Server, log *slog.Logger) *pusher {
	return &pusher{srv: srv, log: log, latest: make(chan *model.Mesh, 1)}
}

// offer queues m, replacing a model not yet pushed.
func (p *pusher) offer(m *model.Mesh) { replaceLatest(p.latest, m) }

// run pushes models until ctx ends. A model whose snapshot cannot be built is skipped: the
// server keeps serving the last good snapshot (and counts the failure).
func (p *pusher) run(ctx context.Context) {
	for {
		var m *model.Mesh
		select {
		case <-ctx.Done():
			return
		case m = <-p.latest:
		}
		if _, err := p.srv.SetMesh(ctx, m); err != nil {
			p.log.Error("xDS snapshot not built; Envoy keeps the last good one", "model_version", m.Version, "err", err)
			continue
		}
		if p.served != nil {
			p.served()
		}
	}
}

// waitAcked returns once Envoy has ACKed a snapshot built from model m or a later one, an error
// when Envoy rejected it, or ctx's error. It asks the server which model it serves: the
// server's rotation serves models too (one whose first build failed for want of the identity
// provider's bundle, once the bundle came).
func (p *pusher) waitAcked(ctx context.Context, m *model.Mesh) error {
	for {
		served, v, ch := p.srv.ServedModel()
		if served >= m.Version {
			return p.srv.WaitForAck(ctx, v)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("model %d not pushed to Envoy: %w", m.Version, context.Cause(ctx))
		case <-ch:
		}
	}
}

// listenUnix listens on a unix socket at path, replacing a stale socket file, with mode 0600.
// Closing the listener leaves the file (it may be another agent's by then).
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Go unlinks the path on close, whoever's socket it is by then: when a second agent on the
	// node (a DaemonSet update with maxSurge) has taken it over, that would cut Envoy off from
	// the running agent. A file left after a clean stop is replaced by the next agent (above).
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	return l, nil
}
