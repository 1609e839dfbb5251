//go:build linux

package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	bpfcapture "github.com/aethermesh/aether/bpf/capture"
	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedAgentCaptureModes runs the real agent binary with its real Envoy on a node
// namespace, a meshed client and a meshed web pod (IPv4), once per --capture-mode case: the
// client's TCP to the web Service's VIP reaches the web pod through the capture listener and
// mTLS (Envoy routed it by the original VIP), a DNS query to the cluster DNS address is answered
// by the agent's resolver with the cluster DNS address as its source, an excluded port passes
// uncaptured, and the pod's nft table holds the nat redirect only where nft captures. The
// eBPF case then kills the agent with SIGKILL: the pod stays captured, and the restarted agent
// converges (a pod whose netns went meanwhile leaves the maps). A bpffs directory that cannot be
// made falls back to nft in auto mode, and stops an agent in ebpf mode with a message naming it.
func TestPrivilegedAgentCaptureModes(t *testing.T) {
	testenv.RequireRoot(t)
	if err := bpfcapture.Probe().Err(); err != nil {
		t.Skipf("eBPF capture cannot run on this kernel or host: %v", err)
	}
	for _, tc := range []struct {
		name, mode string
		// brokenBPFFS points --bpffs-dir under a regular file.
		brokenBPFFS bool
		wantMode    string
		restart     bool
	}{
		{name: "nft", mode: "nft", wantMode: "nft"},
		{name: "ebpf", mode: "ebpf", wantMode: "ebpf", restart: true},
		{name: "auto, bpffs dir unusable: falls back to nft", mode: "auto", brokenBPFFS: true, wantMode: "nft"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, etcd, cs := startSources(t)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			createNodeAndMeshNamespace(t, ctx, cs, "web", "client")
			web := createWebService(t, ctx, cs)
			clientPod := createReadyPod(t, ctx, cs, "client-1", "client")
			webPod := createReadyPod(t, ctx, cs, "web-1", "web")
			extraPod := createReadyPod(t, ctx, cs, "extra-1", "client")

			node, clientNS, webNS := testenv.NewNetns(t), testenv.NewNetns(t), testenv.NewNetns(t)
			gw := map[string]netip.Addr{"client": netip.MustParseAddr("10.250.1.1"), "web": netip.MustParseAddr("10.250.2.1")}
			ips := map[string]netip.Addr{"client": netip.MustParseAddr("10.250.1.2"), "web": netip.MustParseAddr("10.250.2.2")}
			for name, ns := range map[string]*testenv.Netns{"client": clientNS, "web": webNS} {
				testenv.Veth(t, node, "v"+name, netip.PrefixFrom(gw[name], 24), ns, "eth0", netip.PrefixFrom(ips[name], 24))
				ns.DefaultRoute(t, gw[name])
			}
			if out, err := node.Command("sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
				t.Fatalf("ip_forward in the node namespace: %v %s", err, out)
			}
			apiAddr := strings.TrimPrefix(api.Config.Host, "https://")
			node.Forward(t, apiAddr, apiAddr)
			etcdAddr := strings.TrimPrefix(etcd.Endpoints[0], "http://")
			node.Forward(t, etcdAddr, etcdAddr)

			var bpffsDir string
			if tc.brokenBPFFS {
				bpffsDir = filepath.Join(t.TempDir(), "file")
				if err := os.WriteFile(bpffsDir, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				bpffsDir = filepath.Join(bpffsDir, "aether")
			} else {
				bpffsDir = testBPFFS(t)
			}
			// nsenter, not ip netns exec: the agent must see the host's cgroup2 mount (ip netns
			// exec remounts /sys) and the test's bpffs.
			a := startAgentWith(t, agentOpts{wrap: []string{"nsenter", "--net=" + node.Path}, client: node.HTTPClient(false)},
				"--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0], "--host-ip", gw["client"].String(),
				"--capture-mode", tc.mode, "--bpffs-dir", bpffsDir)
			a.waitReady(t, 60*time.Second, "agent ready")
			if _, body := a.get("/readyz"); !strings.Contains(body, "capture: "+tc.wantMode+" ") {
				t.Fatalf("/readyz %q: want the capture mode %s", body, tc.wantMode)
			}
			if tc.brokenBPFFS {
				if _, body := a.get("/readyz"); !strings.Contains(body, "fell back") || !strings.Contains(body, "--bpffs-dir "+bpffsDir) {
					t.Errorf("/readyz %q: want the fallback and its reason naming --bpffs-dir", body)
				}
				if log := mustReadFile(t, a.logPath); !strings.Contains(grepLines(log, "falling back to nft"), "--bpffs-dir") {
					t.Errorf("agent log does not say why it fell back:\n%s", grepLines(log, "capture mode"))
				}
			} else if v := a.metric(`aether_capture_mode{mode="` + tc.wantMode + `",reason=""}`); v != 1 {
				t.Errorf("aether_capture_mode{mode=%q} = %v, want 1", tc.wantMode, v)
			}

			cl := plugin.NewClient(a.cniSocket)
			add := func(pod string, ns string, ip, gateway netip.Addr, uid string, excl []uint16) {
				t.Helper()
				if _, err := cl.Add(ctx, cniv1.Request{Network: "test", Gateways: []netip.Addr{gateway},
					Capture: cniv1.CaptureOptions{ExcludeOutboundPorts: excl}, Attachment: cniv1.PodAttachment{
						ContainerID: "ctr-" + pod, PodUID: uid, Namespace: "shop", Name: pod,
						NetnsPath: ns, IPs: []netip.Addr{ip}, Interface: "eth0"}}); err != nil {
					t.Fatalf("CNI ADD %s: %v", pod, err)
				}
			}
			add("web-1", webNS.Path, ips["web"], gw["web"], string(webPod.UID), nil)
			add("client-1", clientNS.Path, ips["client"], gw["client"], string(clientPod.UID), []uint16{7000})

			vip := web.Spec.ClusterIP + ":80"
			getVIP := func() error {
				resp, err := clientNS.HTTPClient(false).Get("http://" + vip + "/")
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "URI=spiffe://aether.internal/ns/shop/sa/client") {
					return fmt.Errorf("GET %s: %s %q, want web's answer with the client's identity", vip, resp.Status, b)
				}
				return nil
			}
			webNS.ServeHTTP(t, "0.0.0.0:8080", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "xfcc=%s", r.Header.Get("X-Forwarded-Client-Cert"))
			}))
			node.ServePeerAddr(t, gw["client"].String()+":7000")
			testenv.Eventually(t, 60*time.Second, "client reaches web's VIP through the capture listener", getVIP)

			// The capture of the client: where the nat redirect is, and what the programs hold.
			rules := func() string {
				out, err := clientNS.Command("nft", "list", "ruleset").CombinedOutput()
				if err != nil {
					t.Fatalf("nft list ruleset in the client: %v %s", err, out)
				}
				return string(out)
			}
			clientCookie, err := bpfcapture.NetnsCookie(clientNS.Path)
			if err != nil {
				t.Fatal(err)
			}
			inMaps := func(cookie uint64) bool {
				t.Helper()
				if tc.wantMode != "ebpf" {
					return false
				}
				c, err := bpfcapture.OpenPinned(bpffsDir)
				if err != nil {
					t.Fatalf("open the agent's pins: %v", err)
				}
				defer c.Close()
				pods, err := c.ListPods()
				if err != nil {
					t.Fatal(err)
				}
				_, ok := pods[cookie]
				return ok
			}
			hasRedirect := strings.Contains(rules(), "redirect to :15001")
			switch tc.wantMode {
			case "ebpf":
				if hasRedirect || strings.Contains(rules(), "dnat") || !strings.Contains(rules(), "input_filter") {
					t.Errorf("eBPF mode: the client's nft rules hold a nat redirect or DNAT, or lost their filter chains:\n%s", rules())
				}
				if !inMaps(clientCookie) {
					t.Errorf("eBPF mode: the client's netns cookie %d is not in the programs' maps", clientCookie)
				}
			default:
				if !hasRedirect {
					t.Errorf("nft mode: the client's rules have no redirect to :15001:\n%s", rules())
				}
				if _, err := os.Stat(bpffsDir); err == nil && !tc.brokenBPFFS {
					t.Errorf("nft mode: %s exists: nothing may be pinned", bpffsDir)
				}
			}

			// An excluded port passes uncaptured: the node sees the client's own address, and in
			// eBPF mode the socket is connected to the node itself (a captured one is connected
			// to 127.0.0.1:15001).
			if got, err := clientNS.PeerAddr(gw["client"].String() + ":7000"); err != nil || got != ips["client"] {
				t.Errorf("the node saw %v, %v on the excluded port, want the client's %s", got, err, ips["client"])
			}
			if tc.wantMode == "ebpf" {
				c, err := clientNS.Dial(gw["client"].String() + ":7001")
				if err != nil {
					t.Fatalf("client to a captured port: %v", err)
				}
				local := c.LocalAddr().(*net.TCPAddr).IP.String()
				c.Close()
				if local != "127.0.0.1" {
					t.Errorf("a captured connect's local address is %s, want 127.0.0.1 (sent to the capture listener)", local)
				}
			}

			// DNS from an unconnected socket: the answer comes from the cluster DNS address.
			askDNS := func() error {
				return clientNS.Do(func() error {
					pc, err := net.ListenPacket("udp4", "0.0.0.0:0")
					if err != nil {
						return err
					}
					defer pc.Close()
					m := new(dns.Msg)
					m.SetQuestion("web.shop.mesh.", dns.TypeA)
					b, _ := m.Pack()
					if _, err := pc.WriteTo(b, &net.UDPAddr{IP: net.IPv4(10, 96, 0, 10), Port: 53}); err != nil {
						return err
					}
					_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
					buf := make([]byte, 1500)
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return err
					}
					r := new(dns.Msg)
					if err := r.Unpack(buf[:n]); err != nil {
						return err
					}
					if from.String() != "10.96.0.10:53" || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != web.Spec.ClusterIP {
						return fmt.Errorf("answer from %s: %v; want %s from 10.96.0.10:53", from, r.Answer, web.Spec.ClusterIP)
					}
					return nil
				})
			}
			if err := askDNS(); err != nil {
				t.Errorf("DNS from the client: %v", err)
			}
			if !tc.restart {
				return
			}

			// A third pod whose netns goes while the agent is down.
			extraNS := fmt.Sprintf("aet-extra-%d", os.Getpid())
			if out, err := exec.Command("ip", "netns", "add", extraNS).CombinedOutput(); err != nil {
				t.Fatalf("ip netns add: %v %s", err, out)
			}
			extraPath := "/var/run/netns/" + extraNS
			t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", extraNS).Run() })
			// Envoy binds the pod's inbound listener to its address.
			for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", "10.250.3.2/32", "dev", "lo"}} {
				if out, err := exec.Command("ip", append([]string{"-n", extraNS}, args...)...).CombinedOutput(); err != nil {
					t.Fatalf("ip %v: %v %s", args, err, out)
				}
			}
			add("extra-1", extraPath, netip.MustParseAddr("10.250.3.2"), netip.MustParseAddr("10.250.3.1"), string(extraPod.UID), nil)
			extraCookie, err := bpfcapture.NetnsCookie(extraPath)
			if err != nil {
				t.Fatal(err)
			}
			if !inMaps(extraCookie) {
				t.Fatalf("the extra pod's netns cookie %d is not in the maps after its ADD", extraCookie)
			}

			_ = a.cmd.Process.Kill()
			<-a.done
			// The agent is gone; the pins keep the programs attached and Envoy keeps serving.
			if err := getVIP(); err != nil {
				t.Fatalf("with the agent killed, the client's capture stopped: %v", err)
			}
			if out, err := exec.Command("ip", "netns", "del", extraNS).CombinedOutput(); err != nil {
				t.Fatalf("ip netns del: %v %s", err, out)
			}
			a.run(t)
			a.waitReady(t, 60*time.Second, "the restarted agent ready")
			testenv.Eventually(t, 30*time.Second, "the gone pod removed from the maps", func() error {
				if inMaps(extraCookie) {
					return fmt.Errorf("netns cookie %d still in the maps", extraCookie)
				}
				return nil
			})
			if !inMaps(clientCookie) {
				t.Errorf("after the restart the client's netns cookie %d is not in the maps", clientCookie)
			}
			if strings.Contains(rules(), "redirect to :15001") {
				t.Errorf("after the restart the client's rules hold a nat redirect:\n%s", rules())
			}
			if err := getVIP(); err != nil {
				t.Errorf("after the restart: %v", err)
			}
			if err := askDNS(); err != nil {
				t.Errorf("DNS after the restart: %v", err)
			}

			// Back to nft: the restarted agent gives the client its nat redirect, then removes
			// the pins (the programs detach).
			_ = a.cmd.Process.Kill()
			<-a.done
			for i, arg := range a.argv {
				if arg == "--capture-mode" {
					a.argv[i+1] = "nft"
				}
			}
			a.run(t)
			a.waitReady(t, 60*time.Second, "the agent restarted in nft mode ready")
			if !strings.Contains(rules(), "redirect to :15001") {
				t.Errorf("nft mode after eBPF: the client's rules have no redirect to :15001:\n%s", rules())
			}
			testenv.Eventually(t, 30*time.Second, "the earlier agent's pins removed", func() error {
				if _, err := os.Stat(filepath.Join(bpffsDir, "map_pods")); err == nil {
					return fmt.Errorf("%s/map_pods still pinned", bpffsDir)
				}
				return nil
			})
			if err := getVIP(); err != nil {
				t.Errorf("nft mode after eBPF: %v", err)
			}
			if err := askDNS(); err != nil {
				t.Errorf("nft mode after eBPF: DNS: %v", err)
			}
		})
	}
	t.Run("ebpf, bpffs dir unusable: start refused naming it", func(t *testing.T) {
		api, etcd, _ := startSources(t)
		bad := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(bad, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0],
			"--capture-mode", "ebpf", "--bpffs-dir", filepath.Join(bad, "aether"))
		select {
		case <-a.done:
		case <-time.After(90 * time.Second):
			t.Fatal("the agent did not stop with --capture-mode ebpf and an unusable --bpffs-dir")
		}
		log := mustReadFile(t, a.logPath)
		if !strings.Contains(log, "--capture-mode ebpf") || !strings.Contains(log, "--bpffs-dir "+filepath.Join(bad, "aether")) {
			t.Errorf("agent log does not name the mode and the bpffs dir:\n%s", tailString(log, 3000))
		}
	})
}

// testBPFFS mounts a bpffs of the test's own (the agent's pins must outlive the agent's
// process and mount namespace) and returns the pin directory in it for --bpffs-dir; the pins
// and the mount go when the test ends.
func testBPFFS(t testing.TB) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "bpffs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpffs", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	dir := filepath.Join(mnt, "aether")
	t.Cleanup(func() {
		if err := bpfcapture.RemovePins(dir); err != nil {
			t.Errorf("remove the agent's pins: %v", err)
		}
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs: %v", err)
		}
	})
	return dir
}
