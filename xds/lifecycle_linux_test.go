package xds

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// serverCertSerial returns the serial number of the certificate the server pod's inbound
// listener presents now.
func serverCertSerial(t *testing.T, f *meshFixture) string {
	t.Helper()
	good, err := f.ca.Issue(context.Background(), model.SPIFFEID(f.td, "shop", "alpha"))
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := tls.X509KeyPair(good.CertChainPEM, good.KeyPEM)
	raw, err := f.pods["outside"].Dial(f.ips["server"].String() + ":15008")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := tls.Client(raw, &tls.Config{ServerName: "8080", InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestPrivilegedCertRotation issues SVIDs living 6 s, so they rotate every 3 s (half-life): new
// SVIDs reach Envoy over SDS (the server pod presents a new certificate), connections established
// before the rotation keep working, and new connections work.
func TestPrivilegedCertRotation(t *testing.T) {
	f := startTrafficFixture(t, 6*time.Second, true, Options{})
	before := serverCertSerial(t, f)
	tcp, err := f.pods["alpha"].Dial(vipTCP.String() + ":9000")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	if err := testenv.EchoOnce(tcp, "before rotation"); err != nil {
		t.Fatal(err)
	}
	keep := f.pods["beta"].HTTPClient(true)
	if code, body, _, err := getBody(keep, "http://"+vipHTTP.String()+"/", nil); err != nil || code != 200 {
		t.Fatalf("HTTP before rotation: %d %q %v", code, body, err)
	}
	v0 := f.srv.Version()
	testenv.Eventually(t, time.Minute, "two SVID rotations pushed and ACKed", func() error {
		v := f.srv.Version()
		a, _ := strconv.Atoi(v0[strings.IndexByte(v0, '.')+1:])
		b, _ := strconv.Atoi(v[strings.IndexByte(v, '.')+1:])
		if b < a+2 {
			return fmt.Errorf("version %s, started at %s", v, v0)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return f.srv.WaitForAck(ctx, v)
	})
	testenv.Eventually(t, time.Minute, "the server pod presents a rotated certificate", func() error {
		if after := serverCertSerial(t, f); after == before {
			return fmt.Errorf("serial still %s", after)
		}
		return nil
	})
	if err := testenv.EchoOnce(tcp, "after rotation, same connection"); err != nil {
		t.Errorf("established TCP connection after rotation: %v", err)
	}
	if code, body, _, err := getBody(keep, "http://"+vipHTTP.String()+"/", nil); err != nil || code != 200 || xfccURI(body) != model.SPIFFEID(f.td, "shop", "beta") {
		t.Errorf("keep-alive HTTP after rotation: %d %q %v", code, body, err)
	}
	c2, err := f.pods["alpha"].Dial(vipTCP.String() + ":9000")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := testenv.EchoOnce(c2, "new connection after rotation"); err != nil {
		t.Errorf("new TCP connection after rotation: %v", err)
	}
}

// envoyPIDs lists the running Envoy processes started from this fixture's state dir.
func envoyPIDs(t *testing.T, f *meshFixture) []int { return testenv.EnvoysIn(t, f.dir) }

// TestPrivilegedEnvoySupervision: a killed Envoy is restarted and traffic resumes; an agent
// that dies and comes back (new xDS server, new supervisor) adopts the running Envoy, starts no
// second one, established connections survive the agent's absence, and new configuration flows
// again.
func TestPrivilegedEnvoySupervision(t *testing.T) {
	f := startTrafficFixture(t, time.Hour, true, Options{})
	httpOK := func() error {
		code, body, _, err := getBody(f.pods["alpha"].HTTPClient(false), "http://"+vipHTTP.String()+"/", nil)
		if err != nil {
			return err
		}
		if code != 200 || xfccURI(body) != model.SPIFFEID(f.td, "shop", "alpha") {
			return fmt.Errorf("%d %q", code, body)
		}
		return nil
	}
	if err := httpOK(); err != nil {
		t.Fatal(err)
	}

	t.Run("killed Envoy is restarted and traffic resumes", func(t *testing.T) {
		pid := f.sup.PID()
		if pid == 0 {
			t.Fatal("no supervised Envoy")
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, "a new Envoy", func() error {
			if p := f.sup.PID(); p == 0 || p == pid {
				return fmt.Errorf("pid %d", p)
			}
			return nil
		})
		testenv.Eventually(t, time.Minute, "traffic through the new Envoy", httpOK)
		if n := len(envoyPIDs(t, f)); n != 1 {
			t.Errorf("%d Envoy processes, want 1", n)
		}
	})

	t.Run("agent restart adopts Envoy", func(t *testing.T) {
		tcp, err := f.pods["alpha"].Dial(vipTCP.String() + ":9000")
		if err != nil {
			t.Fatal(err)
		}
		defer tcp.Close()
		if err := testenv.EchoOnce(tcp, "before the agent dies"); err != nil {
			t.Fatal(err)
		}
		envoyPID := f.sup.PID()
		f.stopAgent()
		// While the agent is away, Envoy keeps serving its last configuration.
		if err := testenv.EchoOnce(tcp, "while the agent is away"); err != nil {
			t.Errorf("established connection while the agent is away: %v", err)
		}
		if err := httpOK(); err != nil {
			t.Errorf("new HTTP request while the agent is away: %v", err)
		}
		f.startAgent()
		testenv.Eventually(t, time.Minute, "adoption", func() error {
			if !f.sup.Adopted() || f.sup.PID() != envoyPID {
				return fmt.Errorf("adopted=%v pid=%d, want adopted pid %d", f.sup.Adopted(), f.sup.PID(), envoyPID)
			}
			return nil
		})
		if f.sup.Starts() != 0 {
			t.Errorf("restarted supervisor started %d Envoys, want 0", f.sup.Starts())
		}
		// New configuration flows: a new service appears and is reachable.
		m := trafficMesh(f, 2)
		extra := &model.Service{Key: model.ServiceKey{Namespace: "web", Name: "http2"}, Local: true,
			VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")}, Ports: []model.ServicePort{{Port: 8000, TargetPort: 8080, Protocol: model.ProtocolHTTP}}}
		eps := m.Endpoints
		ep := eps[model.ServiceKey{Namespace: "web", Name: "http"}][0]
		ep.Service = extra.Key
		eps[extra.Key] = []model.Endpoint{ep}
		f.set(model.New(3, m.Cluster, m.MeshDomain, m.TrustDomain, m.Node, append(m.Services, extra), eps, m.Pods))
		code, body, _, err := getBody(f.pods["alpha"].HTTPClient(false), "http://10.96.0.20:8000/", nil)
		if err != nil || code != 200 {
			t.Errorf("new service after the agent restart: %d %q %v", code, body, err)
		}
		if err := testenv.EchoOnce(tcp, "after the agent is back"); err != nil {
			t.Errorf("established connection after the agent restart: %v", err)
		}
		if n := len(envoyPIDs(t, f)); n != 1 {
			t.Errorf("%d Envoy processes, want 1", n)
		}
	})
}
