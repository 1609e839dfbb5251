package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/model"
)

// TestUDPCaptureOrder: for a model whose routed UDP frontends change, udpCapture waits for
// Envoy's ACK of that model before it changes the pods' redirects, holds the old frontends
// (their listeners stay) until the redirects are set, then asks for a rebuild; a failed set
// keeps both sets held and is tried again with the model of a rebuild it asks for.
func TestUDPCaptureOrder(t *testing.T) {
	var mu sync.Mutex
	var events []string
	log := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
	failOnce := true
	u := &udpCapture{log: slog.New(slog.NewTextHandler(io.Discard, nil)), retry: 10 * time.Millisecond,
		frontends: (*model.Mesh).UDPFrontends}
	u.acked = func(_ context.Context, m *model.Mesh) error {
		log(fmt.Sprintf("acked %d held=%d", m.Version, len(u.Held())))
		return nil
	}
	u.set = func(_ context.Context, rs []capture.UDPRedirect) error {
		if len(rs) == 0 && failOnce {
			failOnce = false
			log("set failed")
			return errors.New("a pod's rules could not be written")
		}
		log(fmt.Sprintf("set %d", len(rs)))
		return nil
	}
	done := make(chan struct{}, 10)
	u.rebuild = func() { log(fmt.Sprintf("rebuild held=%d", len(u.Held()))); done <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	latest := make(chan *model.Mesh, 1)
	go u.run(ctx, latest)

	with := routedMesh(2, true)
	latest <- with
	<-done
	latest <- routedMesh(3, true) // the same frontends: nothing to do
	latest <- routedMesh(4, false)
	<-done                         // the retry's rebuild
	latest <- routedMesh(5, false) // its model
	<-done
	mu.Lock()
	got := strings.Join(events, "\n")
	mu.Unlock()
	want := strings.Join([]string{"acked 2 held=0", "set 1", "rebuild held=1", "acked 4 held=1", "set failed", "rebuild held=1",
		"acked 5 held=1", "set 0", "rebuild held=0"}, "\n")
	if got != want {
		t.Errorf("events:\n%s\nwant\n%s", got, want)
	}
}

// routedMesh is a model (version v) with one Service, shop/dns (UDP 53), and, with route, a
// UDPRoute bound to it.
func routedMesh(v uint64, route bool) *model.Mesh {
	k := model.ServiceKey{Namespace: "shop", Name: "dns"}
	m := model.New(v, "c1", "mesh", model.DefaultTrustDomain, model.Node{Name: "n1"}, []*model.Service{{Key: k, Local: true,
		VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.24")}, Ports: []model.ServicePort{{Name: "dns", Port: 53, TargetPort: 53, Protocol: model.ProtocolUDP}}}}, nil, nil)
	if route {
		m.L4Routing = &model.L4Routing{UDP: map[model.Frontend]*model.L4Port{{Service: k, Port: 53}: {Routes: []model.L4Route{
			{Route: model.RouteRef{Kind: model.KindUDPRoute, Namespace: "shop", Name: "dns"}}}}}}
	}
	return m
}

// udpRecorder is a udpCapture whose Envoy ACKs at once and whose redirect sets are recorded as
// "<vip>><local port>,..." ("" for none); each rebuild it asks for is signalled on done.
type udpRecorder struct {
	*udpCapture
	mu   sync.Mutex
	sets []string
	acks []uint64 // the versions of the models whose ACK a pass waited for
	done chan struct{}
}

func newUDPRecorder(frontends func(*model.Mesh) []model.UDPFrontend) *udpRecorder {
	r := &udpRecorder{done: make(chan struct{}, 10)}
	r.udpCapture = &udpCapture{log: slog.New(slog.NewTextHandler(io.Discard, nil)), retry: 10 * time.Millisecond,
		frontends: frontends, rebuild: func() { r.done <- struct{}{} }}
	r.acked = func(_ context.Context, m *model.Mesh) error {
		r.mu.Lock()
		r.acks = append(r.acks, m.Version)
		r.mu.Unlock()
		return nil
	}
	r.set = func(_ context.Context, rs []capture.UDPRedirect) error {
		var s []string
		for _, x := range rs {
			s = append(s, fmt.Sprintf("%s>%d", x.VIP, x.LocalPort))
		}
		r.mu.Lock()
		r.sets = append(r.sets, strings.Join(s, ","))
		r.mu.Unlock()
		return nil
	}
	return r
}

// start runs the recorder until the test ends and returns the channel of its models.
func (r *udpRecorder) start(t *testing.T) chan *model.Mesh {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	latest := make(chan *model.Mesh, 1)
	go r.run(ctx, latest)
	return latest
}

func (r *udpRecorder) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sets)
}

// TestUDPCaptureFirstModel: the first model is applied even when it routes nothing (the pods may
// hold the redirects a previous agent persisted, cni.Server), later models without a change are
// not.
func TestUDPCaptureFirstModel(t *testing.T) {
	r := newUDPRecorder((*model.Mesh).UDPFrontends)
	latest := r.start(t)
	latest <- routedMesh(1, false)
	<-r.done
	latest <- routedMesh(2, false) // nothing changed: no set
	latest <- routedMesh(3, true)
	<-r.done
	if got := r.recorded(); !slices.Equal(got, []string{"", "10.96.0.24>" + strconv.Itoa(int(routedMesh(3, true).UDPFrontends()[0].LocalPort))}) {
		t.Errorf("redirect sets %q: want the first model's (none), then the routed one", got)
	}
}

// TestUDPCaptureWaitsForHeldPort: when a new frontend takes the local port a held frontend of
// another VIP still has (the held one moved to another port), its redirect waits until the held
// one's is gone from the pods, so a pod's datagrams never reach the new frontend's route through
// an old redirect; after an agent restart, the redirects a previous agent persisted hold their
// ports the same way.
func TestUDPCaptureWaitsForHeldPort(t *testing.T) {
	a := netip.MustParseAddr("10.96.0.24")
	b := netip.MustParseAddr("10.96.0.7")
	fe := func(vip netip.Addr, local uint16) model.UDPFrontend {
		return model.UDPFrontend{VIP: vip, Port: 53, LocalPort: local}
	}
	byVersion := map[uint64][]model.UDPFrontend{
		1: {fe(a, 15500)},
		2: {fe(b, 15500), fe(a, 15501)}, // b hashes to a's port and sorts first: a moves
	}
	frontends := func(m *model.Mesh) []model.UDPFrontend { return byVersion[min(m.Version, 2)] }
	r := newUDPRecorder(frontends)
	latest := r.start(t)
	latest <- routedMesh(1, false)
	<-r.done
	latest <- routedMesh(2, false)
	<-r.done
	latest <- routedMesh(3, false) // the rebuild's model
	<-r.done
	if got, want := r.recorded(), []string{"10.96.0.24>15500", "10.96.0.24>15501", "10.96.0.7>15500,10.96.0.24>15501"}; !slices.Equal(got, want) {
		t.Errorf("redirect sets %q, want %q", got, want)
	}

	// After an agent restart: a's old redirect (persisted, held without a route) keeps its port
	// until the first pass has moved a.
	restarted := newUDPRecorder(frontends)
	restarted.hold([]capture.UDPRedirect{{VIP: a, Port: 53, LocalPort: 15500}})
	latest = restarted.start(t)
	latest <- routedMesh(2, false)
	<-restarted.done
	latest <- routedMesh(3, false)
	<-restarted.done
	if got, want := restarted.recorded(), []string{"10.96.0.24>15501", "10.96.0.7>15500,10.96.0.24>15501"}; !slices.Equal(got, want) {
		t.Errorf("after a restart: redirect sets %q, want %q", got, want)
	}
}

// TestUDPCaptureSkipsStaleSnapshots: a model published before the held set last changed may
// have been pushed with the listeners held before, so its ACK is no proof of the listeners now
// held: the pass waits for a later model (the rebuild it asked for) before it installs a
// redirect that needed the change.
func TestUDPCaptureSkipsStaleSnapshots(t *testing.T) {
	a := netip.MustParseAddr("10.96.0.24")
	b := netip.MustParseAddr("10.96.0.7")
	moved := []model.UDPFrontend{{VIP: b, Port: 53, LocalPort: 15500}, {VIP: a, Port: 53, LocalPort: 15501}}
	r := newUDPRecorder(func(*model.Mesh) []model.UDPFrontend { return moved })
	var published atomic.Uint64
	published.Store(3) // a model v3 was published (and pushed) while the first pass ran
	r.current = published.Load
	r.hold([]capture.UDPRedirect{{VIP: a, Port: 53, LocalPort: 15500}})
	latest := r.start(t)
	latest <- routedMesh(2, false)
	<-r.done
	latest <- routedMesh(3, false) // built before the change: skipped
	latest <- routedMesh(4, false) // the rebuild's
	<-r.done
	if got, want := r.recorded(), []string{"10.96.0.24>15501", "10.96.0.7>15500,10.96.0.24>15501"}; !slices.Equal(got, want) {
		t.Errorf("redirect sets %q, want %q", got, want)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Equal(r.acks, []uint64{2, 4}) {
		t.Errorf("passes waited for the ACKs of models %v, want [2 4]: b's redirect only after a model newer than the change", r.acks)
	}
}
