//go:build linux

package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
)

// clientHello returns the bytes of the TLS ClientHello that crypto/tls sends for cfg.
func clientHello(t *testing.T, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { _ = tls.Client(a, cfg).Handshake() }()
	buf := make([]byte, 64<<10)
	_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := b.Read(buf) // the ClientHello is one write
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// closedWithin reports nil when the peer closes c (EOF or a reset) within d, reading and
// discarding what it sends meanwhile (a ServerHello, say), and an error when c is still open.
func closedWithin(c net.Conn, d time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("still open after %s", d)
	}
	return nil // io.Copy's nil is EOF; anything else is a reset or another close
}

// TestPrivilegedHandshakeTimeout holds connections that never finish their TLS handshake open
// against a real Envoy: to a pod's inbound listener (pod_ip:15008) and to the node's tunnel
// listener (node_ip:15443, the east-west waypoint), a client that sends nothing, one that sends
// half a ClientHello and one that sends a whole ClientHello and then stalls are each disconnected
// (Options.HandshakeTimeout, here 1 s: Listener.listener_filters_timeout for tls_inspector, then
// FilterChain.transport_socket_connect_timeout on the inbound chains), while an mTLS client
// completes its handshake through each and its connection outlives the timeout. Before, Envoy's
// default listener filter timeout (15 s) closed the first two only after 15 s, and the third
// stayed open forever: any pod could hold any number of stalled connections on every node.
func TestPrivilegedHandshakeTimeout(t *testing.T) {
	const timeout = time.Second
	// Generous against the 1 s timeout on a loaded machine, short of Envoy's 15 s default.
	const wait = 10 * time.Second
	f := newMeshFixture(t, time.Hour, true, Options{HandshakeTimeout: timeout, EastWestWaypoint: true})
	vips := map[string]netip.Addr{"srv": netip.MustParseAddr("10.96.0.40")}
	f.addPod("alpha", false)
	srv, srvIP := f.addPod("srv", false)
	outside, _ := f.addPod("outside", false) // the client: no capture
	serveEcho(srv.Listen(t, "0.0.0.0:9000"))
	m := podAddrMesh(f, 1, vips, "srv")
	m.Services[0].Exported = true // the tunnel listener gets a chain for it
	f.set(m)

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.ca.BundlePEM())
	good, err := f.ca.Issue(context.Background(), model.SPIFFEID(f.td, "web", "alpha"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(good.CertChainPEM, good.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	key := model.ServiceKey{Namespace: "web", Name: "srv"}
	for _, c := range []struct{ name, addr, sni string }{
		{"inbound", srvIP.String() + ":15008", "9000"},
		{"tunnel", m.Node.IP.String() + ":" + fmt.Sprint(tunnel.Port), WaypointSNI(m, key, 9000)},
	} {
		cfg := &tls.Config{ServerName: c.sni, RootCAs: pool, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}
		hello := clientHello(t, cfg)
		t.Run(c.name, func(t *testing.T) {
			for _, s := range []struct {
				name string
				send []byte
			}{
				{"sends nothing", nil},
				{"half a ClientHello", hello[:len(hello)/2]},
				{"a whole ClientHello, then nothing", hello},
			} {
				conn, err := outside.Dial(c.addr)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Write(s.send); err != nil {
					t.Fatal(err)
				}
				if err := closedWithin(conn, wait); err != nil {
					t.Errorf("%s: %v, want closed by the %s handshake timeout", s.name, err, timeout)
				}
				conn.Close()
			}
			// A client that completes its handshake is served, and keeps its connection past the
			// timeout (it bounds the handshake, not the connection).
			raw, err := outside.Dial(c.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			tc := tls.Client(raw, cfg)
			_ = tc.SetDeadline(time.Now().Add(time.Minute))
			if err := testenv.EchoOnce(tc, "through a completed handshake"); err != nil {
				t.Fatalf("mTLS client: %v", err)
			}
			time.Sleep(3 * timeout)
			if err := testenv.EchoOnce(tc, "after the handshake timeout"); err != nil {
				t.Errorf("mTLS connection after the handshake timeout: %v", err)
			}
		})
	}
	// Envoy counts what each timeout closed: the stalled handshakes on the inbound chains
	// (twice: one direct, one through the tunnel), the listener filter waits on both listeners.
	st := f.stats()
	for name, want := range map[string]int{
		"listener." + srvIP.String() + "_15008.downstream_cx_transport_socket_connect_timeout": 2,
		"listener." + srvIP.String() + "_15008.downstream_pre_cx_timeout":                      2,
		"listener." + tunnel.StatPrefix + ".downstream_pre_cx_timeout":                         2,
	} {
		if st[name] < want {
			t.Errorf("%s = %d, want at least %d", name, st[name], want)
		}
	}
}
