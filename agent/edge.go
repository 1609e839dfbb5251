package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"

	"github.com/vishvananda/netns"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/xds"
)

// edges serves this node's edge pods (model.Mesh.EdgePods, docs/gateway.md): for each, an
// xds.EdgeServer on 127.0.0.1:xds.EdgeXDSPort inside the pod's network namespace, which only
// that pod's processes can reach (the edge Envoy's bootstrap points there), serving its
// Gateway's configuration and the SVID of the edge's ServiceAccount. A pod whose listener cannot
// be opened yet (its netns is being set up or torn down) is tried again with the next model.
type edges struct {
	log *slog.Logger
	// idp returns the identity provider of one edge pod's server (owner names it) and the
	// function that releases it.
	idp  func(owner string) (identity.Provider, func())
	opts xds.Options

	mu      sync.Mutex
	running map[string]*edgeRun // by pod UID
}

// edgeRun is one served edge pod.
type edgeRun struct {
	pod     model.EdgePod
	srv     *xds.EdgeServer
	cancel  context.CancelFunc
	done    chan struct{}
	release func()
}

func newEdges(log *slog.Logger, idp func(owner string) (identity.Provider, func()), opts xds.Options) *edges {
	return &edges{log: log, idp: idp, opts: opts, running: map[string]*edgeRun{}}
}

// update starts serving the edge pods of m not served yet, stops those gone (or whose netns,
// Gateway or identity changed), and serves every running one its Gateway as m has it.
func (e *edges) update(ctx context.Context, m *model.Mesh) {
	e.mu.Lock()
	defer e.mu.Unlock()
	want := make(map[string]model.EdgePod, len(m.EdgePods))
	for _, p := range m.EdgePods {
		want[p.UID] = p
	}
	for uid, r := range e.running {
		if p, ok := want[uid]; !ok || p != r.pod {
			r.stop()
			delete(e.running, uid)
			e.log.Info("edge pod no longer served", "pod", r.pod.Namespace+"/"+r.pod.Name, "gateway", r.pod.Gateway.String())
		}
	}
	for uid, p := range want {
		if e.running[uid] != nil {
			continue
		}
		r, err := e.start(ctx, p)
		if err != nil {
			e.log.Warn("edge pod not served yet; trying again with the next model", "pod", p.Namespace+"/"+p.Name, "gateway", p.Gateway.String(), "err", err)
			continue
		}
		e.running[uid] = r
		e.log.Info("serving edge pod", "pod", p.Namespace+"/"+p.Name, "gateway", p.Gateway.String(), "identity", p.SPIFFEID)
	}
	for _, r := range e.running {
		g := m.Gateway(r.pod.Gateway)
		if g == nil {
			continue
		}
		if _, err := r.srv.Set(ctx, m, g); err != nil {
			e.log.Error("edge configuration not built; the edge keeps the last good one", "gateway", g.Key.String(), "err", err)
		}
	}
}

// start opens p's ADS listener inside its netns and serves it until stopped.
func (e *edges) start(ctx context.Context, p model.EdgePod) (*edgeRun, error) {
	idp, release := e.idp("edge " + p.UID)
	srv, err := xds.NewEdgeServer(p.Gateway, identity.Workload{UID: p.UID, SPIFFEID: p.SPIFFEID}, idp, e.opts, e.log.With("part", "edge"))
	if err != nil {
		release()
		return nil, err
	}
	l, err := listenInNetns(p.NetnsPath, net.JoinHostPort("127.0.0.1", strconv.Itoa(xds.EdgeXDSPort)))
	if err != nil {
		release()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &edgeRun{pod: p, srv: srv, cancel: cancel, done: make(chan struct{}), release: release}
	go func() {
		defer close(r.done)
		if err := srv.Serve(rctx, l); err != nil {
			e.log.Error("edge xDS server stopped", "pod", p.Namespace+"/"+p.Name, "err", err)
		}
	}()
	return r, nil
}

func (r *edgeRun) stop() {
	r.cancel()
	<-r.done
	r.release()
}

// stopAll stops serving every edge pod.
func (e *edges) stopAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid, r := range e.running {
		r.stop()
		delete(e.running, uid)
	}
}

// listenInNetns opens a TCP listener on addr inside the network namespace at path. The socket
// belongs to that namespace for its whole life; the thread that entered it is locked and never
// unlocked, so the runtime ends it rather than run other goroutines in the pod's namespace.
func listenInNetns(path, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromPath(path)
		if err != nil {
			ch <- result{err: fmt.Errorf("open netns %s: %w", path, err)}
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ch <- result{err: fmt.Errorf("enter netns %s: %w", path, err)}
			return
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("listen on %s in netns %s: %w", addr, path, err)
		}
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}
