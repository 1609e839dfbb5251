package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	"github.com/aethermesh/aether/cni/plugin"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/atomicfile"
	"github.com/aethermesh/aether/model"
)

// PodInfo is what the agent needs to know about a pod from the API server.
type PodInfo struct {
	UID            string
	ServiceAccount string
	Ports          []model.PodPort
	// ProbePorts are the pod's kubelet probe ports (ProbePorts).
	ProbePorts []uint16
	// InMesh is model.PodMeshed's verdict on the pod and its namespace; NotMeshedReason says
	// why not when it is false.
	InMesh          bool
	NotMeshedReason string
}

// Meshed reports whether the pod must be captured, and if not, why (model.PodMeshed).
func (p PodInfo) Meshed() (bool, string) { return p.InMesh, p.NotMeshedReason }

// PodLookup reads a pod and its namespace from the API server. Implementations honour ctx's
// deadline (the server bounds every lookup with ServerConfig.LookupTimeout).
type PodLookup interface {
	LookupPod(ctx context.Context, namespace, name string) (PodInfo, error)
}

// PodRef names a pod.
type PodRef struct {
	Namespace, Name, UID string
}

// NodePods lists the meshed pods running on a node and deletes one; repair uses it to find meshed
// pods that started without an attachment (before the agent was ready).
type NodePods interface {
	// MeshedPodsOnNode returns the running, non-host-network pods on node whose namespace is
	// opted in and that are not opted out.
	MeshedPodsOnNode(ctx context.Context, node string) ([]PodRef, error)
	// DeletePod deletes the pod (preconditioned on its UID), so its controller recreates it
	// through the CNI chain (KubePods.DeletePod says why a delete and not an eviction).
	DeletePod(ctx context.Context, pod PodRef) error
}

// Dataplane is the node proxy side of an attachment (implemented by the xDS part).
type Dataplane interface {
	// PodAdded programs the pod's listeners and returns once Envoy has ACKed a snapshot holding
	// them, or an error when ctx ends first.
	PodAdded(ctx context.Context, pod model.LocalPod) error
	// PodRemoved removes the pod's listeners; idempotent. It does nothing when the pod is
	// served with another container than pod.ContainerID (a newer sandbox of the same pod: the
	// stale attachment's release must not take the live one's listeners).
	PodRemoved(ctx context.Context, pod model.LocalPod) error
}

// UncapturedObserver, when the Dataplane implements it, hears of the attachments of pods the
// server leaves alone (not meshed) and of their release, so that the agent can serve what such
// a pod needs without capturing it (an edge Gateway's pod, docs/gateway.md). The calls must not
// block.
type UncapturedObserver interface {
	UncapturedAdded(a cniv1.PodAttachment)
	UncapturedRemoved(a cniv1.PodAttachment)
}

// ServerConfig is the agent-side CNI server's configuration.
type ServerConfig struct {
	// Socket is the unix socket path to listen on (default DefaultAgentSocket).
	Socket string
	// StateDir holds one JSON record per attachment (Store).
	StateDir string
	// HostIP / HostIPv6 are the node addresses the agent's DNS resolver listens on.
	HostIP, HostIPv6 netip.Addr
	// ClusterDNS are the cluster DNS service addresses DNAT'ed to the resolver.
	ClusterDNS []netip.Addr
	// DNSPort is the resolver's port (default 18054).
	DNSPort uint16
	// Mode is the default inbound mode (default strict); the plugin config may override it.
	Mode capture.Mode
	// AllowCloudMetadata lets meshed pods reach the cloud metadata service
	// (capture.Config.AllowCloudMetadata; blocked by default).
	AllowCloudMetadata bool
	// BypassMark exempts sockets with this mark in a pod netns from capture (default
	// capture.DefaultBypassMark, the mark the node Envoy's per-pod passthrough sockets carry:
	// xds.Options.BypassMark must be the same).
	BypassMark uint32
	// LookupTimeout bounds each API server read (default 5 s).
	LookupTimeout time.Duration
	// DataplaneTimeout bounds the wait for Envoy's ACK of a pod's listeners (default 20 s).
	DataplaneTimeout time.Duration
	// RepairInterval re-runs repair periodically (0: only at start).
	RepairInterval time.Duration
	// NodeName is this node's name, used to find meshed pods without an attachment.
	NodeName string
}

// Server is the agent's CNI server: it turns CNI requests from aether-cni into persisted
// attachments, capture rules in pod netns and dataplane calls, and repairs all of it on start.
// Lookup, Dataplane and Backend are required.
type Server struct {
	Config    ServerConfig
	Lookup    PodLookup
	Dataplane Dataplane
	Backend   capture.Backend
	// NodePods is optional; without it repair does not look for unattached pods.
	NodePods NodePods
	// Guard is optional: the node source guard (capture.NodeGuard) that keeps pods from sending
	// with the addresses strict capture trusts as the node's (every record's gateways, HostIP,
	// HostIPv6). With it, an ADD whose gateways the guard does not cover yet fails unless the
	// guard takes them, and each repair re-applies it (which repairs drift).
	Guard NodeGuard
	Log   *slog.Logger

	once  sync.Once
	store Store
	locks keyedLocks
	// addedAt holds, per attachment key, when its last ADD succeeded (in this process); GC
	// leaves alone an attachment added after the GC began. Entries go with the attachment.
	addedMu sync.Mutex
	addedAt map[string]time.Time
	ready   atomic.Bool
	// guardMu serializes guard writes; guarded is what the guard last took, guardApplied whether
	// it ever took anything in this process, guardErr the last failure.
	guardMu      sync.Mutex
	guarded      []netip.Addr
	guardApplied bool
	guardErr     error
	// repaired, set by Serve, is closed when the first repair has finished; ADDs served
	// before then wait for it.
	repaired chan struct{}
	// repairCh holds a pending RequestRepair (capacity 1).
	repairCh chan struct{}
	// udpMu guards udp, the routed UDP frontends every captured pod's rules redirect
	// (SetUDPRedirects), and the state of their last change: udpSet once SetUDPRedirects was
	// called (a persisted set loaded later must not replace it), udpDirty until a change has
	// reached every pod and its flows were forgotten (a retry of the same set then runs again),
	// udpGone the VIP:ports whose redirect changed and whose flows are not all forgotten yet,
	// udpEver every VIP:port ever routed (a pod whose rules a repair changes forgets their
	// flows: an ADD's rules built from an older set, a drift).
	udpMu    sync.Mutex
	udp      []capture.UDPRedirect
	udpSet   bool
	udpDirty bool
	udpGone  []netip.AddrPort
	udpEver  []netip.AddrPort
	// inSetMu serializes SetInboundPolicies. inMu guards inbound, the per-pod inbound policies
	// by pod UID (SetInboundPolicies; loaded from the state dir at start), and the state of
	// their last change: inLoaded once the persisted set was read (or refused), inSet once
	// SetInboundPolicies was called (a persisted set loaded later must not replace it), inDirty
	// the pod UIDs whose change has not reached every pod yet, inUnsaved while the set in force
	// could not be persisted (a retry of it runs again), inStrictAll while a persisted set that
	// could not be read at all holds every pod strict (until SetInboundPolicies).
	inSetMu     sync.Mutex
	inMu        sync.Mutex
	inbound     map[string]PodInbound
	inLoaded    bool
	inSet       bool
	inDirty     map[string]bool
	inUnsaved   bool
	inStrictAll bool
}

func (s *Server) defaults() { s.once.Do(s.setDefaults) }

func (s *Server) setDefaults() {
	c := &s.Config
	if c.Socket == "" {
		c.Socket = cniv1.DefaultAgentSocket
	}
	if c.LookupTimeout == 0 {
		c.LookupTimeout = 5 * time.Second
	}
	if c.DataplaneTimeout == 0 {
		c.DataplaneTimeout = 20 * time.Second
	}
	if c.Mode == "" {
		c.Mode = capture.ModeStrict
	}
	if c.BypassMark == 0 {
		c.BypassMark = capture.DefaultBypassMark
	}
	if s.Log == nil {
		s.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s.store = Store{Dir: c.StateDir}
	s.repairCh = make(chan struct{}, 1)
}

// Serve listens on the socket, repairs every persisted attachment, reports ready and serves
// until ctx ends. The socket answers from the start, but until the first repair has finished
// STATUS answers not ready and an ADD waits for it (bounded by the request; then "try again
// later"), so no pod is added to a node whose earlier pods are not yet repaired; DEL, CHECK and
// GC are served meanwhile (per-attachment locks keep them apart from the repair). It replaces a
// socket file left at the path (a crashed agent's, or a running one's it takes over) and at
// shutdown removes the file only if it is still its own. It returns the listen error, or nil
// after ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	s.defaults()
	switch {
	case s.Config.StateDir == "":
		return fmt.Errorf("serve CNI: stateDir: empty")
	case s.Lookup == nil:
		return fmt.Errorf("serve CNI: Lookup: nil")
	case s.Dataplane == nil:
		return fmt.Errorf("serve CNI: Dataplane: nil")
	case s.Backend == nil:
		return fmt.Errorf("serve CNI: Backend: nil")
	}
	if err := os.MkdirAll(filepath.Dir(s.Config.Socket), 0o755); err != nil {
		return fmt.Errorf("serve CNI: %w", err)
	}
	_ = os.Remove(s.Config.Socket)
	l, err := net.Listen("unix", s.Config.Socket)
	if err != nil {
		return fmt.Errorf("serve CNI: listen on %s: %w", s.Config.Socket, err)
	}
	if err := os.Chmod(s.Config.Socket, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("serve CNI: %w", err)
	}
	// The socket file is removed at shutdown only while it is still ours: when a second agent
	// on the node (a DaemonSet update with maxSurge) has taken the path over, removing it would
	// cut the node's CNI off from the running agent. Go's own unlink on close goes by path too.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	ours, err := os.Stat(s.Config.Socket)
	if err != nil {
		l.Close()
		return fmt.Errorf("serve CNI: %w", err)
	}
	removeIfOurs := func() {
		if cur, err := os.Stat(s.Config.Socket); err == nil && os.SameFile(cur, ours) {
			_ = os.Remove(s.Config.Socket)
		}
	}
	s.loadUDP()
	// Before the first repair: a restarted agent repairs each pod with the inbound policy it
	// last gave it, never with a more open node default.
	s.loadInbound()
	s.repaired = make(chan struct{})
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()

	if err := s.Repair(ctx); err != nil {
		s.Log.Error("repair attachments", "err", err)
	}
	// Without its guard the node would fail every ADD (ensureGuard) while reporting ready: a
	// guard that could not be written at all is fatal, its error naming the cause.
	if err := s.guardFailure(); err != nil {
		_ = hs.Close()
		removeIfOurs()
		return fmt.Errorf("serve CNI: %w", err)
	}
	s.ready.Store(true)
	close(s.repaired)
	var tick <-chan time.Time
	if s.Config.RepairInterval > 0 {
		t := time.NewTicker(s.Config.RepairInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			s.ready.Store(false)
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
			removeIfOurs()
			return nil
		case err := <-errc:
			removeIfOurs()
			return fmt.Errorf("serve CNI: %w", err)
		case <-tick:
			if err := s.repair(ctx, false); err != nil {
				s.Log.Error("repair attachments", "err", err)
			}
		case <-s.repairCh:
			if err := s.repair(ctx, false); err != nil {
				s.Log.Error("repair attachments", "err", err)
			}
		}
	}
}

// RequestRepair asks the serving server for a repair pass now, without waiting for
// RepairInterval (the agent asks when Envoy rejects a configuration: the listeners of a pod
// whose netns is gone). Requests made while one is pending are merged into it; it never blocks.
// Before Serve's first repair it is a no-op beyond that pending request.
func (s *Server) RequestRepair() {
	s.defaults()
	select {
	case s.repairCh <- struct{}{}:
	default:
	}
}

// Ready reports whether the first repair has finished and the server is serving.
func (s *Server) Ready() bool { return s.ready.Load() }

// Handler returns the HTTP handler of the CNI API (paths Path*).
func (s *Server) Handler() http.Handler {
	s.defaults()
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+cniv1.PathAdd, s.handle(func(ctx context.Context, r cniv1.Request) (any, error) {
		if s.repaired != nil {
			select {
			case <-s.repaired:
			case <-ctx.Done():
				return nil, types.NewError(types.ErrTryAgainLater, "aether agent not ready", "repair of persisted attachments in progress")
			}
		}
		return s.Add(ctx, r)
	}))
	mux.HandleFunc("POST "+cniv1.PathDel, s.handle(func(ctx context.Context, r cniv1.Request) (any, error) { return nil, s.Del(ctx, r) }))
	mux.HandleFunc("POST "+cniv1.PathCheck, s.handle(func(ctx context.Context, r cniv1.Request) (any, error) { return nil, s.Check(ctx, r) }))
	mux.HandleFunc("POST "+cniv1.PathGC, s.handle(func(ctx context.Context, r cniv1.Request) (any, error) { return nil, s.GC(ctx, r) }))
	mux.HandleFunc("GET "+cniv1.PathStatus, func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			writeError(w, types.NewError(types.ErrPluginNotAvailable, "aether agent not ready", "repair in progress"))
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	return mux
}

func (s *Server) handle(fn func(context.Context, cniv1.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req cniv1.Request
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
			writeError(w, types.NewError(types.ErrDecodingFailure, "decode request", err.Error()))
			return
		}
		out, err := fn(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if out == nil {
			out = struct{}{}
		}
		_ = json.NewEncoder(w).Encode(out)
	}
}

func writeError(w http.ResponseWriter, err error) {
	e := cniv1.ErrorResponse{Code: types.ErrInternal, Message: err.Error()}
	var te *types.Error
	if errors.As(err, &te) {
		e = cniv1.ErrorResponse{Code: te.Code, Message: te.Msg, Details: te.Details}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusInternalServerError)
	_ = json.NewEncoder(w).Encode(e)
}

// lock takes the attachment's own lock and returns its release. Attachments never share a lock:
// one pod's ADD waiting (up to DataplaneTimeout, and as long again to undo) must not hold up
// another pod's ADD, DEL or CHECK.
func (s *Server) lock(key string) func() { return s.locks.lock(key) }

// keyedLocks is one mutex per key, kept only while someone holds or waits for it, so the map
// holds at most the attachments with a request in flight.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyedLock
}

type keyedLock struct {
	mu   sync.Mutex
	refs int // holders and waiters; guarded by keyedLocks.mu
}

func (k *keyedLocks) lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyedLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

func validateRequest(r cniv1.Request, needNetns bool) error {
	a := r.Attachment
	if err := validKeyPart("containerID", a.ContainerID); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "validate request: "+err.Error(), "")
	}
	if err := validKeyPart("interface", a.Interface); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "validate request: "+err.Error(), "")
	}
	if needNetns && a.NetnsPath == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "validate request: netnsPath: empty", "")
	}
	if needNetns && (a.Namespace == "" || a.Name == "") {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("validate request: pod %q/%q: namespace and name are required", a.Namespace, a.Name), "")
	}
	return nil
}

// rules builds a record's capture rule set from the node-wide settings, the record and the
// pod's inbound policy (SetInboundPolicies). The inbound mode is the policy's, else the plugin
// config's (the record's), else ServerConfig.Mode.
func (s *Server) rules(r *Record) (capture.RuleSet, error) {
	mode := s.Config.Mode
	if r.Capture.InboundMode != "" {
		mode = capture.Mode(r.Capture.InboundMode)
	}
	pol := s.inboundOf(r.Attachment.PodUID)
	if pol.Mode != "" {
		mode = pol.Mode
	}
	var nodes []netip.Prefix
	for _, g := range r.Gateways {
		nodes = append(nodes, netip.PrefixFrom(g, g.BitLen()))
	}
	for _, h := range []netip.Addr{s.Config.HostIP, s.Config.HostIPv6} {
		if h.IsValid() {
			nodes = append(nodes, netip.PrefixFrom(h, h.BitLen()))
		}
	}
	s.udpMu.Lock()
	udp := s.udp
	s.udpMu.Unlock()
	return capture.Build(capture.Config{
		PodIPs: r.Attachment.IPs, HostIP: s.Config.HostIP, HostIPv6: s.Config.HostIPv6, ClusterDNS: s.Config.ClusterDNS,
		Mode: mode, DNSPort: s.Config.DNSPort, BypassMark: s.Config.BypassMark, NodeSources: nodes,
		ProbePorts: r.ProbePorts, NodeAllPorts: !r.ProbesRecorded, AllowCloudMetadata: s.Config.AllowCloudMetadata,
		ExcludeOutboundPorts: r.Capture.ExcludeOutboundPorts, ExcludeInboundPorts: r.Capture.ExcludeInboundPorts,
		ExcludeOutboundCIDRs: r.Capture.ExcludeOutboundCIDRs, UDPRedirects: udp,
		StrictPorts: pol.StrictPorts, PermissivePorts: pol.PermissivePorts,
	})
}

// Add handles CNI ADD: it reads the pod from the API server (bounded), persists the attachment,
// installs capture in the pod netns and waits (bounded) for the dataplane; any failure undoes
// all of it and returns an error naming the cause. A pod that is not meshed is recorded as such
// and left alone. Repeating an ADD re-applies idempotently.
func (s *Server) Add(ctx context.Context, req cniv1.Request) (cniv1.Response, error) {
	s.defaults()
	if err := validateRequest(req, true); err != nil {
		return cniv1.Response{}, err
	}
	if len(req.Attachment.IPs) == 0 {
		return cniv1.Response{}, types.NewError(types.ErrInvalidNetworkConfig, "validate request: ips: empty", "")
	}
	a := req.Attachment
	defer s.lock(attachmentKey(a.ContainerID, a.Interface))()
	log := s.Log.With("pod", a.Namespace+"/"+a.Name, "containerID", a.ContainerID)
	// Every pod, meshed or not, could forge the node's addresses: the guard covers its
	// gateways before the pod gets a network.
	if err := s.ensureGuard(req.Gateways); err != nil {
		return cniv1.Response{}, types.NewError(types.ErrInternal, "install node source guard", err.Error())
	}

	lctx, cancel := context.WithTimeout(ctx, s.Config.LookupTimeout)
	info, err := s.Lookup.LookupPod(lctx, a.Namespace, a.Name)
	cancel()
	if err != nil {
		return cniv1.Response{}, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("look up pod %s/%s", a.Namespace, a.Name), err.Error())
	}
	if a.PodUID != "" && info.UID != "" && a.PodUID != info.UID {
		return cniv1.Response{}, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("look up pod %s/%s: UID %s, want %s (pod replaced)", a.Namespace, a.Name, info.UID, a.PodUID), "")
	}
	if a.PodUID == "" {
		a.PodUID = info.UID
	}
	rec := &Record{Network: req.Network, Attachment: a, Gateways: req.Gateways, Capture: req.Capture,
		ServiceAccount: info.ServiceAccount, Ports: info.Ports, ProbePorts: info.ProbePorts, ProbesRecorded: true,
		Added: time.Now().UTC()}
	meshed, reason := info.Meshed()
	if !meshed {
		rec.Reason = reason
		if err := s.store.Save(rec); err != nil {
			return cniv1.Response{}, types.NewError(types.ErrIOFailure, "record attachment", err.Error())
		}
		if o, ok := s.Dataplane.(UncapturedObserver); ok {
			o.UncapturedAdded(a)
		}
		log.Info("pod not meshed: left alone", "reason", reason)
		return cniv1.Response{Captured: false, Reason: reason}, nil
	}
	// One captured attachment per container: the dataplane serves one per pod and capture is
	// one rule table per netns, so a second interface's ADD (aether-cni in a second network's
	// conflist too) would rebuild both for its addresses and take the pod's mesh traffic off
	// the first.
	if other, err := s.capturedSibling(a.ContainerID, a.Interface); err != nil {
		return cniv1.Response{}, types.NewError(types.ErrIOFailure, "load attachments", err.Error())
	} else if other != "" {
		return cniv1.Response{}, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(
			"validate request: interface %q: container %s is already captured through interface %q; %s captures one interface per pod (is it in a second network's conflist?)",
			a.Interface, a.ContainerID, other, plugin.PluginName), "")
	}
	rec.Captured = true
	rs, err := s.rules(rec)
	if err != nil {
		return cniv1.Response{}, types.NewError(types.ErrInvalidNetworkConfig, "build capture rules", err.Error())
	}
	// Persist first: if the agent dies half-way, repair finds the record and completes or
	// removes the attachment.
	if err := s.store.Save(rec); err != nil {
		return cniv1.Response{}, types.NewError(types.ErrIOFailure, "record attachment", err.Error())
	}
	undo := func(cause error) error {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Config.DataplaneTimeout)
		defer cancel()
		errs := []error{cause}
		if err := s.Backend.Teardown(a.NetnsPath); err != nil {
			errs = append(errs, err)
		}
		if err := s.Dataplane.PodRemoved(uctx, rec.LocalPod()); err != nil {
			errs = append(errs, err)
		}
		if err := s.store.Delete(a.ContainerID, a.Interface); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	if _, err := s.Backend.Apply(a.NetnsPath, rs); err != nil {
		err = undo(err)
		log.Error("install capture failed; undone", "err", err)
		return cniv1.Response{}, types.NewError(types.ErrInternal, "install capture rules", err.Error())
	}
	dctx, cancel := context.WithTimeout(ctx, s.Config.DataplaneTimeout)
	err = s.Dataplane.PodAdded(dctx, rec.LocalPod())
	cancel()
	if err != nil {
		err = undo(err)
		log.Error("dataplane did not accept the pod; undone", "err", err)
		return cniv1.Response{}, types.NewError(types.ErrTryAgainLater, "program pod listeners", err.Error())
	}
	s.setAddedAt(a.ContainerID, a.Interface, time.Now())
	log.Info("pod captured")
	return cniv1.Response{Captured: true}, nil
}

// capturedSibling returns the interface of another captured attachment of containerID than
// ifname, or "".
func (s *Server) capturedSibling(containerID, ifname string) (string, error) {
	recs, err := s.store.ForContainer(containerID)
	for _, r := range recs {
		if r.Captured && r.Attachment.Interface != ifname {
			return r.Attachment.Interface, nil
		}
	}
	return "", err
}

// netnsCapturedByOther reports whether a captured attachment other than key has its rules in
// netnsPath (unreadable records are skipped: List reports them).
func (s *Server) netnsCapturedByOther(netnsPath, key string) bool {
	recs, _ := s.store.List()
	return slices.ContainsFunc(recs, func(r *Record) bool {
		return r.Captured && r.Key() != key && r.Attachment.NetnsPath == netnsPath
	})
}

// setAddedAt records (t set) or forgets (t zero) when the attachment's last ADD succeeded.
func (s *Server) setAddedAt(containerID, ifname string, t time.Time) {
	s.addedMu.Lock()
	defer s.addedMu.Unlock()
	k := attachmentKey(containerID, ifname)
	if t.IsZero() {
		delete(s.addedAt, k)
		return
	}
	if s.addedAt == nil {
		s.addedAt = map[string]time.Time{}
	}
	s.addedAt[k] = t
}

// addedSince reports whether the attachment's last ADD succeeded after t.
func (s *Server) addedSince(key string, t time.Time) bool {
	s.addedMu.Lock()
	defer s.addedMu.Unlock()
	return s.addedAt[key].After(t)
}

// Del handles CNI DEL: it removes the capture rules (if the netns still exists), the pod's
// listeners and the record. Missing pieces are success (idempotent).
func (s *Server) Del(ctx context.Context, req cniv1.Request) error {
	s.defaults()
	if err := validateRequest(req, false); err != nil {
		return err
	}
	a := req.Attachment
	defer s.lock(attachmentKey(a.ContainerID, a.Interface))()
	return s.release(ctx, a)
}

// release undoes an attachment; the caller holds its lock.
func (s *Server) release(ctx context.Context, a cniv1.PodAttachment) error {
	rec, err := s.store.Load(a.ContainerID, a.Interface)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "load attachment", err.Error())
	}
	netnsPath := a.NetnsPath
	if rec != nil && netnsPath == "" {
		netnsPath = rec.Attachment.NetnsPath
	}
	// An attachment without a record (its ADD failed or was refused) tears down the netns's
	// rules only when no other captured attachment owns them: the runtime's DEL of a refused
	// second interface must not uncapture the first.
	if netnsPath != "" && rec == nil && s.netnsCapturedByOther(netnsPath, attachmentKey(a.ContainerID, a.Interface)) {
		netnsPath = ""
	}
	if netnsPath != "" {
		if err := s.Backend.Teardown(netnsPath); err != nil {
			return types.NewError(types.ErrInternal, "remove capture rules", err.Error())
		}
	}
	if o, ok := s.Dataplane.(UncapturedObserver); ok && rec != nil && !rec.Captured {
		o.UncapturedRemoved(rec.Attachment)
	}
	if rec != nil && rec.Captured {
		dctx, cancel := context.WithTimeout(ctx, s.Config.DataplaneTimeout)
		err := s.Dataplane.PodRemoved(dctx, rec.LocalPod())
		cancel()
		if err != nil {
			return types.NewError(types.ErrTryAgainLater, "remove pod listeners", err.Error())
		}
	}
	if err := s.store.Delete(a.ContainerID, a.Interface); err != nil {
		return types.NewError(types.ErrIOFailure, "delete attachment", err.Error())
	}
	s.setAddedAt(a.ContainerID, a.Interface, time.Time{})
	return nil
}

// Check handles CNI CHECK: the attachment must be recorded and, when captured, its rules intact.
func (s *Server) Check(_ context.Context, req cniv1.Request) error {
	s.defaults()
	if err := validateRequest(req, true); err != nil {
		return err
	}
	a := req.Attachment
	defer s.lock(attachmentKey(a.ContainerID, a.Interface))()
	rec, err := s.store.Load(a.ContainerID, a.Interface)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "load attachment", err.Error())
	}
	if rec == nil {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("check attachment %s/%s: not recorded", a.ContainerID, a.Interface), "")
	}
	if !rec.Captured {
		return nil
	}
	rs, err := s.rules(rec)
	if err != nil {
		return types.NewError(types.ErrInternal, "build capture rules", err.Error())
	}
	if err := s.Backend.Check(a.NetnsPath, rs); err != nil {
		return types.NewError(types.ErrInternal, "check capture rules", err.Error())
	}
	return nil
}

// GC handles CNI GC: every recorded attachment of req.Network not in req.ValidAttachments is
// released, except one whose ADD succeeded after the GC began (an ADD in flight while the
// runtime built its list of valid attachments cannot be on it; releasing it would leave a pod
// that its runtime saw added running uncaptured).
func (s *Server) GC(ctx context.Context, req cniv1.Request) error {
	s.defaults()
	start := time.Now()
	recs, err := s.store.List()
	if err != nil {
		s.Log.Warn("gc: some attachments unreadable", "err", err)
	}
	var errs []error
	for _, r := range recs {
		if r.Network != req.Network || slices.Contains(req.ValidAttachments, cniv1.Attachment{ContainerID: r.Attachment.ContainerID, IfName: r.Attachment.Interface}) {
			continue
		}
		unlock := s.lock(r.Key())
		if s.addedSince(r.Key(), start) {
			unlock()
			s.Log.Info("gc: attachment added while the GC ran: kept", "containerID", r.Attachment.ContainerID)
			continue
		}
		if err := s.release(ctx, r.Attachment); err != nil {
			errs = append(errs, err)
		}
		unlock()
		s.Log.Info("gc: released stale attachment", "containerID", r.Attachment.ContainerID)
	}
	if len(errs) > 0 {
		return types.NewError(types.ErrInternal, "collect stale attachments", errors.Join(errs...).Error())
	}
	return nil
}

// SetUDPRedirects sets the routed UDP frontends (capture.Config.UDPRedirects: one redirect per
// VIP and port a UDPRoute is bound to, none without UDPRoutes) and, when they changed, re-applies
// every captured pod's rules before it returns (a repair pass without announcing pods), so the
// caller can order it with the node Envoy's UDP listeners: serve a frontend's listener before
// its redirect is set, and remove the listener only after this returned without the frontend.
// An ADD whose rules were built while the set changed is caught by a second pass it requests
// (RequestRepair). It returns the joined errors of the pods it could not update.
func (s *Server) SetUDPRedirects(ctx context.Context, rs []capture.UDPRedirect) error {
	s.defaults()
	rs = slices.Clone(rs)
	s.udpMu.Lock()
	if slices.Equal(s.udp, rs) && !s.udpDirty {
		s.udpSet = true
		s.udpMu.Unlock()
		return nil
	}
	gone := s.udpGone
	for _, o := range s.udp {
		if !slices.Contains(rs, o) && !slices.Contains(gone, netip.AddrPortFrom(o.VIP, o.Port)) {
			gone = append(gone, netip.AddrPortFrom(o.VIP, o.Port))
		}
	}
	for _, r := range rs {
		if ap := netip.AddrPortFrom(r.VIP, r.Port); !slices.Contains(s.udpEver, ap) {
			s.udpEver = append(s.udpEver, ap)
		}
	}
	s.udp, s.udpSet, s.udpDirty, s.udpGone = rs, true, true, gone
	s.udpMu.Unlock()
	if err := s.saveUDP(rs); err != nil {
		// The pods get the set all the same; only a restarted agent starts without it.
		s.Log.Error("persist routed UDP frontends", "err", err)
	}
	s.Log.Info("routed UDP frontends changed: re-applying capture rules", "frontends", len(rs))
	err := errors.Join(s.repair(ctx, false), s.forgetUDPFlows(gone))
	s.RequestRepair()
	if err == nil {
		s.udpMu.Lock()
		if slices.Equal(s.udp, rs) {
			s.udpDirty, s.udpGone = false, nil
		}
		s.udpMu.Unlock()
	}
	return err
}

// forgetUDPFlows deletes, in every captured pod's netns, the conntrack entries of UDP flows to
// the VIP:ports gone (those whose redirect changed or went, capture.ForgetUDPFlows): their next
// datagrams meet the rules just applied. It returns the joined errors of the pods it could not
// clear.
func (s *Server) forgetUDPFlows(gone []netip.AddrPort) error {
	if len(gone) == 0 {
		return nil
	}
	recs, err := s.store.List()
	errs := []error{err}
	for _, r := range recs {
		if !r.Captured {
			continue
		}
		n, err := capture.ForgetUDPFlows(r.Attachment.NetnsPath, gone)
		errs = append(errs, err)
		if n > 0 {
			s.Log.Info("routed UDP frontends changed: flows forgotten", "pod", r.Attachment.Namespace+"/"+r.Attachment.Name, "flows", n)
		}
	}
	return errors.Join(errs...)
}

// udpStateFile, in StateDir, holds the last routed UDP frontends (SetUDPRedirects) as JSON, so
// a restarted agent repairs its pods' rules with them instead of dropping every redirect until
// its first model is served. Its name is not a Record's (no ".json").
const udpStateFile = "udp-redirects"

// saveUDP persists rs (udpStateFile).
func (s *Server) saveUDP(rs []capture.UDPRedirect) error {
	b, err := json.Marshal(rs)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Config.StateDir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(s.Config.StateDir, udpStateFile), b, 0o600)
}

// loadUDP sets the routed UDP frontends from udpStateFile (LoadUDPRedirects); a file it cannot
// take is logged and ignored (no pod's rules fail to build over it).
func (s *Server) loadUDP() {
	rs, err := LoadUDPRedirects(s.Config.StateDir, s.Config.HostIP, s.Config.HostIPv6)
	if err != nil {
		s.Log.Error("persisted routed UDP frontends ignored", "err", err)
		return
	}
	s.udpMu.Lock()
	defer s.udpMu.Unlock()
	if s.udpSet {
		return // the agent's set came first: it is newer
	}
	s.udp = rs
	for _, r := range rs {
		s.udpEver = append(s.udpEver, netip.AddrPortFrom(r.VIP, r.Port))
	}
}

// LoadUDPRedirects returns the routed UDP frontends persisted in stateDir (the last
// SetUDPRedirects of a Server on it), none when there is no file. A file that does not parse, or
// whose set the capture would refuse with these host addresses (capture.ValidUDPRedirects), is
// an error naming the file.
func LoadUDPRedirects(stateDir string, hostIP, hostIPv6 netip.Addr) ([]capture.UDPRedirect, error) {
	path := filepath.Join(stateDir, udpStateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var rs []capture.UDPRedirect
	if err == nil {
		err = json.Unmarshal(b, &rs)
	}
	if err == nil {
		err = capture.ValidUDPRedirects(rs, hostIP, hostIPv6)
	}
	if err != nil {
		return nil, fmt.Errorf("routed UDP frontends in %s: %w", path, err)
	}
	return rs, nil
}

// Repair reconciles every persisted attachment: a record whose netns is gone is released; a
// captured pod's rules are re-applied where they drifted and the pod is announced to the
// dataplane (PodAdded, so a restarted agent serves Envoy every pod again; of several records of
// one pod UID, only the newest is announced). With NodePods set,
// meshed pods on the node that have no attachment are reported and deleted. It returns the
// joined errors of the pods it could not repair. Serve runs it at start; the periodic repairs
// (RepairInterval) do the same without announcing pods the dataplane already has.
func (s *Server) Repair(ctx context.Context) error { return s.repair(ctx, true) }

func (s *Server) repair(ctx context.Context, announce bool) error {
	s.defaults()
	started := time.Now()
	recs, err := s.store.List()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if err := s.applyGuard(recs); err != nil {
		errs = append(errs, err)
	}
	// attached holds the pods with a live attachment: a record whose netns is gone (a sandbox
	// that ended, every sandbox of a rebooted node) is released and does not count, or a pod
	// whose new sandbox came up without aether-cni (the node's primary CNI rewrote the conflist
	// at boot) would pass for captured.
	attached := map[string]bool{}
	newest := newestByPod(recs)
	for _, r := range recs {
		// The dataplane serves one attachment per pod UID: announcing an older sandbox's record
		// after the newer one would move the live pod's listeners into the old netns.
		live, err := s.repairOne(ctx, r, announce && newest[r.Attachment.PodUID] == r)
		if err != nil {
			errs = append(errs, fmt.Errorf("repair %s/%s: %w", r.Attachment.Namespace, r.Attachment.Name, err))
		}
		if live {
			attached[r.Attachment.Namespace+"/"+r.Attachment.Name] = true
		}
	}
	// A backend with node-wide state (eBPF maps) forgets the pods whose attachment is gone; a
	// record list cut short by a read error must not make it forget a live pod.
	if p, ok := s.Backend.(capture.Pruner); ok && err == nil {
		if keep, err := s.capturedNetns(); err == nil {
			if _, err := p.Prune(started, keep); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if s.NodePods != nil && s.Config.NodeName != "" {
		lctx, cancel := context.WithTimeout(ctx, s.Config.LookupTimeout)
		pods, err := s.NodePods.MeshedPodsOnNode(lctx, s.Config.NodeName)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("list meshed pods on %s: %w", s.Config.NodeName, err))
		}
		var unattached []PodRef
		for _, p := range pods {
			if !attached[p.Namespace+"/"+p.Name] {
				unattached = append(unattached, p)
			}
		}
		if len(unattached) > 0 {
			// An ADD through aether-cni may have saved its record after the list above and the
			// pod shown its IP before the pod list: such a pod is captured. Read the records
			// again (an unreadable record counts as no attachment, as in the first read).
			if err := s.liveAttachments(attached); err != nil {
				errs = append(errs, err)
			}
		}
		for _, p := range unattached {
			if attached[p.Namespace+"/"+p.Name] {
				continue
			}
			s.Log.Warn("meshed pod runs without capture: deleting it (its controller recreates it through the CNI chain)", "pod", p.Namespace+"/"+p.Name)
			ectx, cancel := context.WithTimeout(ctx, s.Config.LookupTimeout)
			if err := s.NodePods.DeletePod(ectx, p); err != nil {
				errs = append(errs, fmt.Errorf("delete uncaptured pod %s/%s: %w", p.Namespace, p.Name, err))
			}
			cancel()
		}
	}
	return errors.Join(errs...)
}

// capturedNetns returns the netns paths of the stored captured attachments (read now, after the
// pass has released the gone ones), or the store's error when it could not read every record.
func (s *Server) capturedNetns() ([]string, error) {
	recs, err := s.store.List()
	var out []string
	for _, r := range recs {
		if r.Captured {
			out = append(out, r.Attachment.NetnsPath)
		}
	}
	return out, err
}

// liveAttachments adds to attached the namespace/name of every stored attachment whose netns
// exists now; it returns the store's error for the records it could not read.
func (s *Server) liveAttachments(attached map[string]bool) error {
	recs, err := s.store.List()
	for _, r := range recs {
		if _, err := os.Stat(r.Attachment.NetnsPath); err == nil {
			attached[r.Attachment.Namespace+"/"+r.Attachment.Name] = true
		}
	}
	return err
}

// NodeGuard is the part of capture.NodeGuard the server uses.
type NodeGuard interface {
	// Apply makes the guard drop frames from pods that carry any of addrs as their source
	// (capture.NodeGuard.Apply: idempotent, reports whether it changed the node's rules).
	Apply(addrs []netip.Addr) (changed bool, err error)
}

// nodeAddrs returns the node's own addresses that strict capture trusts: HostIP, HostIPv6 and
// the given gateways (deduplicated, sorted).
func (s *Server) nodeAddrs(gateways []netip.Addr) []netip.Addr {
	out := slices.Clone(gateways)
	for _, h := range []netip.Addr{s.Config.HostIP, s.Config.HostIPv6} {
		if h.IsValid() {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// applyGuard makes the guard cover the node addresses of recs and every address it covered
// before in this process (no-op without a guard; Apply itself checks the live table first and
// repairs drift). It never drops an address it took: an ADD that has passed ensureGuard may not
// have saved its record yet, and a record list cut short by a read error must not open a
// gateway (a stale node address costs nothing: no frame carries it once its bridge is gone). An
// agent restart starts again from the records.
func (s *Server) applyGuard(recs []*Record) error {
	if s.Guard == nil {
		return nil
	}
	var gws []netip.Addr
	for _, r := range recs {
		gws = append(gws, r.Gateways...)
	}
	s.guardMu.Lock()
	defer s.guardMu.Unlock()
	want := s.nodeAddrs(append(gws, s.guarded...))
	changed, err := s.Guard.Apply(want)
	if err != nil {
		s.guardErr = fmt.Errorf("node source guard: %w", err)
		return s.guardErr
	}
	if changed && s.guardApplied && slices.Equal(want, s.guarded) {
		s.Log.Warn("repair: node source guard was missing or had drifted; re-applied", "addrs", want)
	}
	s.guarded, s.guardApplied = want, true
	return nil
}

// guardFailure returns the guard's last error when a guard is set and has never been applied in
// this process, else nil.
func (s *Server) guardFailure() error {
	s.guardMu.Lock()
	defer s.guardMu.Unlock()
	if s.Guard == nil || s.guardApplied {
		return nil
	}
	if s.guardErr == nil {
		return errors.New("node source guard: not applied")
	}
	return s.guardErr
}

// ensureGuard makes sure the guard covers gateways (and the host addresses), adding them to what
// it already covers; it writes nothing when they are all covered.
func (s *Server) ensureGuard(gateways []netip.Addr) error {
	if s.Guard == nil {
		return nil
	}
	s.guardMu.Lock()
	defer s.guardMu.Unlock()
	want := s.nodeAddrs(append(slices.Clone(s.guarded), gateways...))
	if slices.Equal(want, s.guarded) {
		return nil
	}
	if _, err := s.Guard.Apply(want); err != nil {
		return err
	}
	s.guarded, s.guardApplied = want, true
	return nil
}

// learnProbePorts reads the pod of a record an older agent wrote without its probe ports and, when
// the read succeeds and it is the same pod, records them, so its strict capture stops trusting
// the node on every port. A failed read leaves the record as it was (logged; the next repair
// tries again).
func (s *Server) learnProbePorts(ctx context.Context, r *Record) {
	if s.Lookup == nil {
		return
	}
	a := r.Attachment
	lctx, cancel := context.WithTimeout(ctx, s.Config.LookupTimeout)
	info, err := s.Lookup.LookupPod(lctx, a.Namespace, a.Name)
	cancel()
	if err != nil || (a.PodUID != "" && info.UID != "" && info.UID != a.PodUID) {
		s.Log.Warn("repair: cannot learn the probe ports of an older record; the node stays trusted on every port",
			"pod", a.Namespace+"/"+a.Name, "err", err, "uid", info.UID)
		return
	}
	r.ProbePorts, r.ProbesRecorded = info.ProbePorts, true
	if err := s.store.Save(r); err != nil {
		s.Log.Warn("repair: record probe ports", "pod", a.Namespace+"/"+a.Name, "err", err)
	}
}

// newestByPod returns, per pod UID, its captured record added last (ties: the greater key). A
// pod has several when its sandbox was recreated and the old one's DEL never arrived.
func newestByPod(recs []*Record) map[string]*Record {
	out := map[string]*Record{}
	for _, r := range recs {
		if !r.Captured {
			continue
		}
		cur := out[r.Attachment.PodUID]
		if cur == nil || r.Added.After(cur.Added) || r.Added.Equal(cur.Added) && r.Key() > cur.Key() {
			out[r.Attachment.PodUID] = r
		}
	}
	return out
}

// repairOne repairs one persisted attachment: live is false when its netns is gone (the record
// is then released), true when the attachment stands (its rules re-applied by repairLive).
func (s *Server) repairOne(ctx context.Context, r *Record, announce bool) (live bool, err error) {
	defer s.lock(r.Key())()
	// Re-read under the lock: a DEL may have removed it meanwhile.
	cur, err := s.store.Load(r.Attachment.ContainerID, r.Attachment.Interface)
	if err != nil || cur == nil {
		return false, err
	}
	if _, err := os.Stat(cur.Attachment.NetnsPath); errors.Is(err, os.ErrNotExist) {
		s.Log.Info("repair: netns gone, releasing attachment", "pod", cur.Attachment.Namespace+"/"+cur.Attachment.Name)
		return false, s.release(ctx, cur.Attachment)
	}
	return true, s.repairLive(ctx, cur, announce)
}

// repairLive re-applies the capture rules of a live attachment and, with announce, announces
// the pod to the dataplane.
func (s *Server) repairLive(ctx context.Context, cur *Record, announce bool) error {
	if !cur.Captured {
		return nil
	}
	if !cur.ProbesRecorded {
		s.learnProbePorts(ctx, cur)
	}
	changed, err := s.applyRules(cur)
	if changed {
		s.Log.Warn("repair: capture rules restored or updated", "pod", cur.Attachment.Namespace+"/"+cur.Attachment.Name)
	}
	if err != nil {
		return err
	}
	if !announce {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, s.Config.DataplaneTimeout)
	defer cancel()
	return s.Dataplane.PodAdded(dctx, cur.LocalPod())
}

// applyRules builds a captured record's rules, applies them (capture.Backend.Apply: nothing is
// written when they already match) and reports whether the live rules changed. The caller holds
// the record's lock.
func (s *Server) applyRules(cur *Record) (changed bool, err error) {
	rs, err := s.rules(cur)
	if err != nil {
		return false, err
	}
	changed, err = s.Backend.Apply(cur.Attachment.NetnsPath, rs)
	if err != nil || !changed {
		return changed, err
	}
	// Flows to routed VIPs may have been translated by the rules this replaced (an ADD's,
	// built from an older set; a drift): their next datagrams meet these.
	s.udpMu.Lock()
	ever := slices.Clone(s.udpEver)
	s.udpMu.Unlock()
	_, err = capture.ForgetUDPFlows(cur.Attachment.NetnsPath, ever)
	// Callers' connections these rules refuse (a port or the pod turned strict) get a reset at
	// their next packet; the pod's end is closed too, so the application is told. A failure
	// leaves the refusal to the rules and is not retried.
	if n, cerr := capture.CutRefused(cur.Attachment.NetnsPath, rs); cerr != nil {
		s.Log.Error("close connections the inbound policy refuses", "pod", cur.Attachment.Namespace+"/"+cur.Attachment.Name, "closed", n, "err", cerr)
	} else if n > 0 {
		s.Log.Info("connections the inbound policy refuses closed", "pod", cur.Attachment.Namespace+"/"+cur.Attachment.Name, "closed", n)
	}
	return true, err
}
