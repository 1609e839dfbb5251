//go:build linux

package envoy

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	echov3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/echo/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/internal/xdsproto"
)

// TestOverloadManagerCapsConnections runs the real Envoy on the agent's bootstrap with
// MaxConnections 3, MaxHeapBytes 512 MiB and a listener "limited" to one connection (two echo
// listeners added, the ADS config removed so nothing waits for an xDS server): Envoy accepts the
// bootstrap with its overload manager and runtime layer; the limited listener serves one
// connection and closes a second, counted (downstream_cx_overflow); over all listeners it
// serves three connections at once, closes a fourth at accept and counts it
// (downstream_global_cx_overflow), and serves again once one closes.
func TestOverloadManagerCapsConnections(t *testing.T) {
	testenv.RequireTools(t, testenv.ToolEnvoy)
	raw, err := Bootstrap(BootstrapConfig{NodeID: "n1", AdminAddress: "127.0.0.1:0", MaxConnections: 3, MaxHeapBytes: 512 << 20,
		ListenerConnectionLimits: map[string]uint64{"limited": 1}})
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	if b.GetOverloadManager() == nil {
		t.Fatal("bootstrap has no overload manager")
	}
	b.DynamicResources, b.StaticResources = nil, nil
	echo, err := xdsproto.NetworkFilter("envoy.filters.network.echo", &echov3.Echo{})
	if err != nil {
		t.Fatal(err)
	}
	port, limitedPort := testenv.FreePort(t), testenv.FreePort(t)
	b.StaticResources = &bootstrapv3.Bootstrap_StaticResources{Listeners: []*listenerv3.Listener{{
		Name: "echo", Address: xdsproto.SocketAddress("127.0.0.1", uint32(port), ""),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{echo}}},
	}, {
		Name: "limited", Address: xdsproto.SocketAddress("127.0.0.1", uint32(limitedPort), ""),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{echo}}},
	}}}
	out, err := protojson.Marshal(&b)
	if err != nil {
		t.Fatal(err)
	}
	e := testenv.StartEnvoy(t, string(out), testenv.EnvoyOptions{})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	echoOnce := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "ping"); err != nil {
			return err
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != "ping" {
			return fmt.Errorf("echo %q", buf)
		}
		return nil
	}
	// The listener limited to one connection: a second is closed and counted on that listener.
	lim := fmt.Sprintf("127.0.0.1:%d", limitedPort)
	first, err := net.Dial("tcp", lim)
	if err != nil {
		t.Fatal(err)
	}
	if err := echoOnce(first); err != nil {
		t.Fatalf("first connection to the limited listener: %v", err)
	}
	second, err := net.Dial("tcp", lim)
	if err != nil {
		t.Fatal(err)
	}
	if err := echoOnce(second); err == nil {
		t.Fatal("a second connection to a listener limited to one was served")
	}
	second.Close()
	// Envoy counts the close on its worker; the admin API may read the counter a moment later.
	testenv.Eventually(t, 10*time.Second, "the listener overflow counted", func() error {
		if s := adminStats(t, e.AdminAddr, "downstream_cx_overflow"); !strings.Contains(s, fmt.Sprintf("listener.127.0.0.1_%d.downstream_cx_overflow: 1", limitedPort)) {
			return fmt.Errorf("listener overflow not counted:\n%s", s)
		}
		return nil
	})
	first.Close()
	testenv.Eventually(t, 30*time.Second, "the limited listener's connections closed", func() error {
		want := fmt.Sprintf("listener.127.0.0.1_%d.downstream_cx_active: 0", limitedPort)
		if s := adminStats(t, e.AdminAddr, "downstream_cx_active"); !strings.Contains(s, want) {
			return fmt.Errorf("%s", s)
		}
		return nil
	})

	// The global cap of 3 over all listeners.
	var held []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := echoOnce(c); err != nil {
			t.Fatalf("connection %d of 3: %v", i+1, err)
		}
		held = append(held, c)
	}
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := echoOnce(over); err == nil {
		t.Fatal("a fourth connection was served with MaxConnections 3")
	}
	over.Close()
	testenv.Eventually(t, 10*time.Second, "the global overflow counted", func() error {
		stats := adminStats(t, e.AdminAddr, "downstream_global_cx_overflow")
		if !strings.Contains(stats, "listener.127.0.0.1_"+fmt.Sprint(port)+".downstream_global_cx_overflow: 1") {
			return fmt.Errorf("overflow not counted:\n%s", stats)
		}
		return nil
	})
	held[0].Close()
	testenv.Eventually(t, 30*time.Second, "a connection served again after one closed", func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		return echoOnce(c)
	})
}

func adminStats(t *testing.T, admin, filter string) string {
	t.Helper()
	c, base := AdminClient(admin)
	resp, err := c.Get(base + "/stats?filter=" + filter)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
