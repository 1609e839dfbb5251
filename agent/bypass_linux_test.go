//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	bpfcapture "github.com/aethermesh/aether/bpf/capture"
	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
)

// forgedXFCC is what an attacker sends as its identity: the header strict mode must never let an
// application see unless the mesh set it.
const forgedXFCC = "By=spiffe://aether.internal/ns/shop/sa/web;URI=spiffe://aether.internal/ns/shop/sa/admin"

// TestPrivilegedCaptureBypassMatrix is the same-node capture-bypass matrix (docs/security.md has
// the table and the reasons): the real agent binary with its real Envoy and capture rules on a
// node namespace, a meshed client and a meshed web pod (strict inbound, a readiness probe on
// 8081), a pod outside the mesh, and a host outside the mesh. Every cell's expected result is
// written before it is tried; the test asserts what the peer saw (source address, identity) and
// that strict mode refused what it must.
// It runs once per capture mode: nft rules, and eBPF programs with nft's filter chains.
func TestPrivilegedCaptureBypassMatrix(t *testing.T) {
	testenv.RequireRoot(t)
	for _, mode := range []string{"nft", "ebpf"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "ebpf" {
				if err := bpfcapture.Probe().Err(); err != nil {
					t.Skipf("eBPF capture cannot run on this kernel or host: %v", err)
				}
			}
			bypassMatrix(t, mode)
		})
	}
}

func bypassMatrix(t *testing.T, mode string) {
	api, etcd, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs, "web", "client")
	web := createWebService(t, ctx, cs)
	client := createReadyPod(t, ctx, cs, "client-1", "client")
	// web-1's kubelet probe: HTTP readiness on its port "health", 8081.
	webPod := createReadyPod(t, ctx, cs, "web-1", "web", func(p *corev1.Pod) {
		c := &p.Spec.Containers[0]
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: "health", ContainerPort: 8081})
		c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("health")}}}
	})

	node := testenv.NewNetns(t)
	clientNS, webNS, plainNS, outsideNS := testenv.NewNetns(t), testenv.NewNetns(t), testenv.NewNetns(t), testenv.NewNetns(t)
	// Every pod is dual-stack: 10.250.<i>.2/24 and fd50:<i>::2/64, the node's side of its link
	// 10.250.<i>.1 and fd50:<i>::1.
	gw, gw6 := map[string]netip.Addr{}, map[string]netip.Addr{}
	ips, ips6 := map[string]netip.Addr{}, map[string]netip.Addr{}
	for i, p := range []struct {
		name string
		ns   *testenv.Netns
	}{{"client", clientNS}, {"web", webNS}, {"plain", plainNS}, {"outside", outsideNS}} {
		gw[p.name] = netip.AddrFrom4([4]byte{10, 250, byte(i + 1), 1})
		ips[p.name] = netip.AddrFrom4([4]byte{10, 250, byte(i + 1), 2})
		gw6[p.name] = netip.MustParseAddr(fmt.Sprintf("fd50:%d::1", i+1))
		ips6[p.name] = netip.MustParseAddr(fmt.Sprintf("fd50:%d::2", i+1))
		testenv.Veth(t, node, "v"+p.name, netip.PrefixFrom(gw[p.name], 24), p.ns, "eth0", netip.PrefixFrom(ips[p.name], 24))
		node.AddAddrs(t, "v"+p.name, netip.PrefixFrom(gw6[p.name], 64))
		p.ns.AddAddrs(t, "eth0", netip.PrefixFrom(ips6[p.name], 64))
		p.ns.DefaultRoute(t, gw[p.name])
		p.ns.DefaultRoute(t, gw6[p.name])
	}
	// The node routes between its pods, as a node does.
	for _, sysctl := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"} {
		if out, err := node.Command("sysctl", "-qw", sysctl).CombinedOutput(); err != nil {
			t.Fatalf("%s in the node namespace: %v %s", sysctl, err, out)
		}
	}
	apiAddr := strings.TrimPrefix(api.Config.Host, "https://")
	node.Forward(t, apiAddr, apiAddr)
	etcdAddr := strings.TrimPrefix(etcd.Endpoints[0], "http://")
	node.Forward(t, etcdAddr, etcdAddr)
	// HOST_IP is the node's address on the client's link, so the pods' DNS (DNAT'ed from the
	// cluster DNS address to HOST_IP) reaches the agent's resolver; a later flag wins over
	// startAgentWith's 127.0.0.1.
	// nsenter, not ip netns exec: in eBPF mode the agent must see the host's cgroup2 mount (ip
	// netns exec remounts /sys) and the test's bpffs.
	a := startAgentWith(t, agentOpts{wrap: []string{"nsenter", "--net=" + node.Path}, client: node.HTTPClient(false)},
		"--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0], "--host-ip", gw["client"].String(),
		"--capture-mode", mode, "--bpffs-dir", testBPFFS(t))
	a.waitReady(t, 60*time.Second, "agent ready")

	// The web pod's applications: HTTP on 8080 answering with the XFCC it got and the peer's
	// address, the probe port 8081 and a loopback-only port 9000 answering with the peer's
	// address, a UDP echo on 5353. The outside host answers with the peer's address on 7000.
	webNS.ServeHTTP(t, "0.0.0.0:8080", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "from=%s xfcc=%s", host, r.Header.Get("X-Forwarded-Client-Cert"))
	}))
	webNS.ServePeerAddr(t, "0.0.0.0:8081")
	webNS.ServePeerAddr(t, "127.0.0.1:9000")
	webNS.ServePeerAddr(t, "[::1]:9000")
	webNS.ServeUDPEcho(t, "0.0.0.0:5353", "web:")
	outsideNS.ServePeerAddr(t, "0.0.0.0:7000")

	cl := plugin.NewClient(a.cniSocket)
	for _, p := range []struct {
		pod *corev1.Pod
		ns  *testenv.Netns
		key string
	}{{webPod, webNS, "web"}, {client, clientNS, "client"}} {
		// Gateways as a bridge plugin's prevResult gives them: the node's side of the pod's link.
		if _, err := cl.Add(ctx, cniv1.Request{Network: "test", Gateways: []netip.Addr{gw[p.key], gw6[p.key]}, Attachment: cniv1.PodAttachment{
			ContainerID: "ctr-" + p.key, PodUID: string(p.pod.UID), Namespace: "shop", Name: p.pod.Name,
			NetnsPath: p.ns.Path, IPs: []netip.Addr{ips[p.key], ips6[p.key]}, Interface: "eth0"}}); err != nil {
			t.Fatalf("CNI ADD %s: %v", p.pod.Name, err)
		}
	}
	// Where the client's outbound capture is: the nat redirect in nft mode, none in eBPF mode.
	if out, err := clientNS.Command("nft", "list", "ruleset").CombinedOutput(); err != nil ||
		strings.Contains(string(out), "redirect to :15001") != (mode == "nft") {
		t.Fatalf("%s mode: the client's rules (%v):\n%s", mode, err, out)
	}
	// The node source guard (on by default) holds HOST_IP and both pods' gateways. Read until it
	// does: right after the ADDs it was once seen holding one IPv6 gateway of two (CI, eBPF case,
	// at the agent's 2 s repair sweep; not understood yet: each guard write is one transaction).
	testenv.Eventually(t, 10*time.Second, "node source guard after the ADDs", func() error {
		return (capture.NFTGuard{NetnsPath: node.Path}).Check([]netip.Addr{gw["client"], gw["web"], gw6["client"], gw6["web"]})
	})
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := webNS.Command("nft", "list", "ruleset").CombinedOutput()
			t.Logf("web pod rules:\n%s", out)
		}
	})

	vip := web.Spec.ClusterIP + ":80"
	webIP := func(port int) string { return fmt.Sprintf("%s:%d", ips["web"], port) }
	clientID := "spiffe://aether.internal/ns/shop/sa/client"
	get := func(ns *testenv.Netns, addr string) (string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
		req.Header.Set("X-Forwarded-Client-Cert", forgedXFCC)
		resp, err := ns.HTTPClient(false).Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return string(b), fmt.Errorf("GET %s: %s %q", addr, resp.Status, b)
		}
		return string(b), err
	}
	// The web endpoint reaches EDS through the registry: wait for the mesh path first.
	testenv.Eventually(t, 60*time.Second, "client reaches web's VIP through the mesh", func() error {
		_, err := get(clientNS, vip)
		return err
	})

	// refused accepts a refusal, a reset or a close before any answer (the client's Envoy accepts
	// the connection and closes it when the passthrough's upstream is refused: Go's HTTP client
	// then reports EOF or, when it reads nothing at all, "server closed idle connection").
	refused := func(t *testing.T, err error, what string) {
		t.Helper()
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) &&
			!strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "connection reset") &&
			!strings.Contains(err.Error(), "server closed idle connection") {
			t.Fatalf("%s: %v, want the connection refused or reset", what, err)
		}
	}
	sees := func(t *testing.T, got netip.Addr, err error, want netip.Addr, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got != want {
			t.Fatalf("%s: the peer saw %v, want %v", what, got, want)
		}
	}

	t.Run("meshed to neighbour by VIP: mTLS, the caller's own identity only", func(t *testing.T) {
		body, err := get(clientNS, vip)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(body, "URI="+clientID) || strings.Contains(body, "sa/admin") || !strings.Contains(body, "from=127.0.0.1") {
			t.Fatalf("web saw %q: want the inbound leg over its loopback with the caller's SPIFFE ID %s and no forged identity", body, clientID)
		}
	})
	t.Run("meshed to neighbour by pod IP, forged XFCC: refused", func(t *testing.T) {
		body, err := get(clientNS, webIP(8080))
		if err == nil {
			t.Fatalf("plaintext from a same-node meshed pod to web's pod IP answered: %q", body)
		}
		refused(t, err, "client to web's pod IP")
	})
	t.Run("meshed to neighbour's probe port by pod IP: refused", func(t *testing.T) {
		_, err := clientNS.PeerAddr(webIP(8081))
		if err == nil {
			t.Fatal("a pod reached web's probe port in plaintext")
		}
		refused(t, err, "client to web's probe port")
	})
	t.Run("meshed to neighbour's loopback-only port: refused", func(t *testing.T) {
		_, err := clientNS.PeerAddr(webIP(9000))
		if err == nil {
			t.Fatal("a pod reached web's loopback-only port")
		}
		refused(t, err, "client to web's loopback-only port")
	})
	t.Run("meshed to a non-mesh host: passthrough with the pod's own address", func(t *testing.T) {
		got, err := clientNS.PeerAddr(fmt.Sprintf("%s:7000", ips["outside"]))
		sees(t, got, err, ips["client"], "client to the outside host")
	})
	t.Run("meshed app forging the bypass mark: still its own address, still refused by strict", func(t *testing.T) {
		// Setting SO_MARK needs CAP_NET_ADMIN (the test has it; a pod normally does not). The
		// mark skips capture, so the connection leaves uncaptured, from the pod's own address.
		dial := func(addr string) (net.Conn, error) {
			var c net.Conn
			err := clientNS.Do(func() (err error) {
				d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
					var serr error
					if err := rc.Control(func(fd uintptr) {
						serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, capture.DefaultBypassMark)
					}); err != nil {
						return err
					}
					return serr
				}}
				c, err = d.Dial("tcp", addr)
				return err
			})
			return c, err
		}
		c, err := dial(webIP(8080))
		if err == nil {
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: web\r\nX-Forwarded-Client-Cert: %s\r\n\r\n", forgedXFCC)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, rerr := io.ReadAll(c)
			c.Close()
			if len(b) > 0 {
				t.Fatalf("marked plaintext to web's pod IP answered: %q", b)
			}
			err = rerr
			if err == nil {
				err = io.EOF
			}
		}
		refused(t, err, "marked connection to web's pod IP")
		c, err = dial(fmt.Sprintf("%s:7000", ips["outside"]))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(c)
		c.Close()
		got, perr := netip.ParseAddr(strings.TrimSpace(string(b)))
		sees(t, got, perr, ips["client"], "marked connection to the outside host")
	})
	t.Run("non-meshed pod to web's pod IP: refused", func(t *testing.T) {
		body, err := get(plainNS, webIP(8080))
		if err == nil {
			t.Fatalf("plaintext from a pod outside the mesh answered: %q", body)
		}
		refused(t, err, "plain pod to web")
	})
	t.Run("non-meshed pod to web's inbound port without a certificate: no application", func(t *testing.T) {
		body, err := get(plainNS, webIP(15008))
		if err == nil {
			t.Fatalf("plaintext HTTP to the inbound mTLS port answered: %q", body)
		}
	})
	t.Run("host to web's probe port: let in with the node's address", func(t *testing.T) {
		got, err := node.PeerAddr(webIP(8081))
		sees(t, got, err, gw["web"], "node to web's probe port")
	})
	t.Run("host to web's application port: refused", func(t *testing.T) {
		body, err := get(node, webIP(8080))
		if err == nil {
			t.Fatalf("plaintext from the node to a non-probe port answered: %q", body)
		}
		refused(t, err, "node to web's application port")
	})
	t.Run("DNS: a meshed pod resolves through the agent, a non-meshed pod is refused", func(t *testing.T) {
		_, dnsPort, _ := net.SplitHostPort(a.dnsAddr)
		ask := func(ns *testenv.Netns, server string) (*dns.Msg, error) {
			var r *dns.Msg
			err := ns.Do(func() (err error) {
				m := new(dns.Msg)
				m.SetQuestion("web.shop.mesh.", dns.TypeA)
				r, _, err = (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, server)
				return err
			})
			return r, err
		}
		// The client's query to the cluster DNS address is DNAT'ed to HOST_IP:<dns port> from
		// the client's own address, a pod of the model.
		r, err := ask(clientNS, "10.96.0.10:53")
		if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != web.Spec.ClusterIP {
			t.Fatalf("meshed client: web.shop.mesh = %v, %v; want %s", r, err, web.Spec.ClusterIP)
		}
		// The pod outside the mesh asks the resolver directly: not a source it serves.
		r, err = ask(plainNS, net.JoinHostPort(gw["client"].String(), dnsPort))
		if err != nil || r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Fatalf("non-meshed pod asking the agent's resolver directly: %v, %v; want REFUSED", r, err)
		}
		if n := a.metric(`aether_dns_refused_total{reason="source"}`); n < 1 {
			t.Errorf("aether_dns_refused_total{reason=\"source\"} = %v, want the refusal counted", n)
		}
	})
	// IPv6 (the pods are dual-stack). Capture covers IPv6 as IPv4, but the node Envoy does not
	// serve IPv6 mesh traffic yet (its capture listener is 127.0.0.1:15001, the REDIRECT of an
	// IPv6 connection goes to [::1]:15001): a meshed pod's IPv6 connections fail closed, never
	// leave uncaptured; strict judges IPv6 sources as IPv4 ones.
	web6 := func(port int) string { return net.JoinHostPort(ips6["web"].String(), fmt.Sprint(port)) }
	t.Run("IPv6: meshed to neighbour by pod IP, forged XFCC: refused", func(t *testing.T) {
		body, err := get(clientNS, web6(8080))
		if err == nil {
			t.Fatalf("plaintext over IPv6 from a same-node meshed pod to web answered: %q", body)
		}
		refused(t, err, "client to web's IPv6 pod IP")
	})
	t.Run("IPv6: meshed to neighbour's loopback-only port: refused", func(t *testing.T) {
		if _, err := clientNS.PeerAddr(web6(9000)); err == nil {
			t.Fatal("a pod reached web's [::1]-only port")
		} else {
			refused(t, err, "client to web's IPv6 loopback-only port")
		}
	})
	t.Run("IPv6: meshed to a non-mesh host: captured, fails closed", func(t *testing.T) {
		if got, err := clientNS.PeerAddr(net.JoinHostPort(ips6["outside"].String(), "7000")); err == nil {
			t.Fatalf("an IPv6 connection of a meshed pod left uncaptured: the outside host saw %s", got)
		} else {
			refused(t, err, "client to the outside host over IPv6")
		}
	})
	t.Run("IPv6: non-meshed pod to web's pod IP: refused", func(t *testing.T) {
		body, err := get(plainNS, web6(8080))
		if err == nil {
			t.Fatalf("plaintext over IPv6 from a pod outside the mesh answered: %q", body)
		}
		refused(t, err, "plain pod to web over IPv6")
	})
	t.Run("IPv6: host to web's probe port: let in with the node's address", func(t *testing.T) {
		got, err := node.PeerAddr(web6(8081))
		sees(t, got, err, gw6["web"], "node to web's probe port over IPv6")
	})
	t.Run("IPv6: host to web's application port: refused", func(t *testing.T) {
		body, err := get(node, web6(8080))
		if err == nil {
			t.Fatalf("plaintext over IPv6 from the node to a non-probe port answered: %q", body)
		}
		refused(t, err, "node to web's application port over IPv6")
	})
	t.Run("UDP between pods: not meshed, passes", func(t *testing.T) {
		// The mesh carries TCP; UDP (other than DNS to the cluster DNS address) passes as
		// without a mesh (docs/security.md says why).
		got, err := clientNS.AskUDP(webIP(5353), "hi", 5*time.Second)
		if err != nil || got != "web:hi" {
			t.Fatalf("UDP to web = %q, %v; want the echo", got, err)
		}
	})
}
