//go:build linux

package xds

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// TestWaitListenersWarm feeds a real Envoy over ADS a pod's lane listener whose route (RDS) is
// not served: Envoy ACKs the listener but keeps it warming, and envoy.WaitListenersWarm waits. Once
// the route is served the listener turns active and envoy.WaitListenersWarm returns.
func TestWaitListenersWarm(t *testing.T) {
	pod := &model.LocalPod{Namespace: "shop", Name: "web-1"}
	names := PodListenerNames(pod)
	hcm, err := rdsHCM("lane", "lane-shop-web-1")
	if err != nil {
		t.Fatal(err)
	}
	lane := &listenerv3.Listener{
		Name:         laneListenerName(pod),
		Address:      xdsproto.SocketAddress("127.0.0.1", 0, ""),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{hcm}}},
	}
	// Envoy starts with no listener (a listener warming while Envoy initialises would hold /ready
	// back until the route's initial fetch times out), then gets the lane listener.
	port, sc := adsServer(t, map[resource.Type][]types.Resource{resource.ListenerType: {}})
	ev := startFactsEnvoy(t, adsBootstrap("lds_config", port)+factsAdmin)
	ctx := context.Background()
	serve := func(version string, res map[resource.Type][]types.Resource) {
		t.Helper()
		snap, err := cache.NewSnapshot(version, res)
		if err != nil {
			t.Fatal(err)
		}
		if err := sc.SetSnapshot(ctx, "facts", snap); err != nil {
			t.Fatal(err)
		}
	}
	serve("2", map[resource.Type][]types.Resource{resource.ListenerType: {lane}})
	// Envoy holds the listener (ACKed) but it waits for its route.
	testenv.Eventually(t, time.Minute, "lane listener added", func() error {
		s, err := ev.Admin(ctx, "/stats?filter=^listener_manager.total_listeners_warming$")
		if err != nil {
			return err
		}
		if !strings.Contains(s, ": 1") {
			return fmt.Errorf("%s", strings.TrimSpace(s))
		}
		return nil
	})
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = envoy.WaitListenersWarm(short, ev.AdminAddr, names)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "still warming: "+lane.Name) {
		t.Fatalf("envoy.WaitListenersWarm while the route is missing = %v, want an error naming %s as warming", err, lane.Name)
	}

	serve("3", map[resource.Type][]types.Resource{resource.ListenerType: {lane}, resource.RouteType: {&routev3.RouteConfiguration{Name: "lane-shop-web-1"}}})
	long, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := envoy.WaitListenersWarm(long, ev.AdminAddr, names); err != nil {
		t.Fatalf("envoy.WaitListenersWarm once the route is served: %v", err)
	}
	if l, err := ev.Admin(ctx, "/listeners"); err != nil || !strings.Contains(l, lane.Name) {
		t.Fatalf("after envoy.WaitListenersWarm, /listeners = %q (%v), want %s active", l, err, lane.Name)
	}

	// A listener Envoy cannot bind (its port is taken) is in error_state: an error at once.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	inbound := proto.Clone(lane).(*listenerv3.Listener)
	inbound.Name = inboundListenerName(pod)
	inbound.Address = xdsproto.SocketAddress("127.0.0.1", uint32(taken.Addr().(*net.TCPAddr).Port), "")
	serve("4", map[resource.Type][]types.Resource{resource.ListenerType: {lane, inbound}, resource.RouteType: {&routev3.RouteConfiguration{Name: "lane-shop-web-1"}}})
	// (Called here before Envoy took the update it returns nil: the agent calls it after the
	// LDS ACK, which Envoy refuses in this case.)
	testenv.Eventually(t, time.Minute, "the unbindable listener reported", func() error {
		err := envoy.WaitListenersWarm(long, ev.AdminAddr, names)
		if err == nil || !strings.Contains(err.Error(), "envoy failed listener "+inbound.Name+": ") {
			return fmt.Errorf("envoy.WaitListenersWarm = %v, want an error naming %s", err, inbound.Name)
		}
		t.Logf("unbindable listener: %v", err)
		return nil
	})
}
