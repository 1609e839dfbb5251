//go:build linux

package xds

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
)

// TestPrivilegedWaypointNodeIPNotLocal serves a real Envoy the tunnel listener of a node whose
// InternalIP is not (yet) an address of the node (a wrong --node-ip, an address configured late):
// Envoy must accept the listener (IP_FREEBIND) and serve it once the address appears. Before,
// Envoy could not bind it and rejected the whole LDS update, and with it every later one, since
// each snapshot holds the tunnel listener: no pod listener on the node changed again and every
// CNI ADD failed on the NACK.
func TestPrivilegedWaypointNodeIPNotLocal(t *testing.T) {
	testenv.RequireRoot(t)
	node := testenv.NewNetns(t) // the "node": only lo, without the node IP
	nodeIP := netip.MustParseAddr("192.0.2.10")
	r, err := tunnel.Build(model.New(1, "b", "mesh", "td", model.Node{Name: "n1", IP: nodeIP}, nil, nil, nil), tunnel.Options{Netns: node.Path})
	if err != nil {
		t.Fatal(err)
	}
	port, sc := adsServer(t, map[resource.Type][]types.Resource{resource.ListenerType: {}})
	ev := startFactsEnvoy(t, adsBootstrap("lds_config", port)+factsAdmin)
	ctx := context.Background()
	snap, err := cache.NewSnapshot("2", map[resource.Type][]types.Resource{resource.ListenerType: {r.Listener}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.SetSnapshot(ctx, "facts", snap); err != nil {
		t.Fatal(err)
	}
	stat := func(name string) (int, error) {
		s, err := ev.Admin(ctx, "/stats?filter=^"+strings.ReplaceAll(name, ".", `\.`)+"$")
		if err != nil {
			return 0, err
		}
		_, v, ok := strings.Cut(strings.TrimSpace(s), ": ")
		if !ok {
			return 0, nil
		}
		return strconv.Atoi(v)
	}
	testenv.Eventually(t, time.Minute, "the tunnel listener accepted", func() error {
		if n, err := stat("listener_manager.lds.update_rejected"); err != nil || n != 0 {
			l, _ := ev.Admin(ctx, "/listeners")
			t.Fatalf("Envoy rejected the tunnel listener of a node IP not on the node (update_rejected %d, %v); /listeners %q", n, err, l)
		}
		l, err := ev.Admin(ctx, "/listeners")
		if err != nil || !strings.Contains(l, tunnel.ListenerName+"::"+nodeIP.String()+":15443") {
			return fmt.Errorf("/listeners = %q (%v)", l, err)
		}
		return nil
	})
	// The address appears: the listener answers (plaintext is refused and counted).
	if out, err := node.Command("ip", "addr", "add", nodeIP.String()+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	testenv.Eventually(t, time.Minute, "plaintext to the tunnel refused and counted", func() error {
		c, err := node.Dial(nodeIP.String() + ":15443")
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
			return err
		}
		if b, err := io.ReadAll(c); len(b) != 0 || err != nil {
			return fmt.Errorf("read %q, %v; want the connection closed", b, err)
		}
		if n, err := stat(tunnel.RefusedStatPrefix + "." + tunnel.RefusedNotTLS + ".rbac.denied"); err != nil || n == 0 {
			return fmt.Errorf("not_tls refusals %d (%v)", n, err)
		}
		return nil
	})
}
