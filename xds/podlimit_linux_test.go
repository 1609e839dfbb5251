//go:build linux

package xds

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestPrivilegedPodListenerConnectionLimit runs the real Envoy with PodMaxConnections 2 and the
// RTDS layer in its bootstrap: Envoy takes the layer (the caps show in its runtime), a pod holds
// two captured connections and its third is closed at accept and counted, while another pod on
// the same node still gets its own two; once one of the first pod's closes, it connects again.
func TestPrivilegedPodListenerConnectionLimit(t *testing.T) {
	f := newMeshFixture(t, time.Hour, true, Options{PodMaxConnections: 2})
	m := goldenMesh()
	for _, p := range m.Pods {
		if f.pods[p.Name] == nil {
			f.addPod(p.Name, true)
		}
		p.NetnsPath, p.IPs = f.pods[p.Name].Path, []netip.Addr{f.ips[p.Name]}
	}
	if len(m.Pods) < 2 {
		t.Fatalf("the golden mesh has %d pods, want two", len(m.Pods))
	}
	f.set(model.New(2, m.Cluster, m.MeshDomain, f.td, m.Node, m.Services, m.Endpoints, m.Pods))
	a, b := m.Pods[0], m.Pods[1]

	rt, err := f.admin("/runtime")
	if err != nil {
		t.Fatal(err)
	}
	key := "envoy.resource_limits.listener." + captureListenerName(a) + ".connection_limit"
	if !strings.Contains(rt, key) || !strings.Contains(rt, RuntimeLayerName) {
		t.Fatalf("Envoy's runtime has no %s from layer %s:\n%s", key, RuntimeLayerName, testenv.Tail(rt, 2000))
	}

	// A server outside the mesh, on the node: each connection echoes one line and stays open.
	l := f.node.Listen(t, "10.44.0.1:7000")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	open := func(pod string) (net.Conn, error) {
		c, err := f.pods[pod].Dial("10.44.0.1:7000")
		if err != nil {
			return nil, err
		}
		if err := testenv.EchoOnce(c, "hi"); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range 2 {
		c, err := open(a.Name)
		if err != nil {
			t.Fatalf("%s's connection %d of 2: %v", a.Name, i+1, err)
		}
		held = append(held, c)
	}
	if c, err := open(a.Name); err == nil {
		c.Close()
		t.Fatalf("%s's third connection was served with PodMaxConnections 2", a.Name)
	}
	testenv.Eventually(t, 10*time.Second, "the overflow counted", func() error {
		s, err := f.admin("/stats?filter=127.0.0.1_15001.downstream_cx_overflow")
		if err != nil {
			return err
		}
		if !strings.Contains(s, "downstream_cx_overflow: ") || strings.Contains(s, "downstream_cx_overflow: 0") {
			return fmt.Errorf("%q", s)
		}
		return nil
	})
	for i := range 2 {
		c, err := open(b.Name)
		if err != nil {
			t.Fatalf("%s (another pod) connection %d of 2 while %s is at its cap: %v", b.Name, i+1, a.Name, err)
		}
		held = append(held, c)
	}
	held[0].Close()
	testenv.Eventually(t, 30*time.Second, a.Name+" connects again after one closed", func() error {
		c, err := open(a.Name)
		if err != nil {
			return err
		}
		held = append(held, c)
		return nil
	})
	f.wantNoRejections(t)
}
