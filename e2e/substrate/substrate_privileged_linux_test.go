//go:build linux

package substrate

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	buildOnce   sync.Once
	bins        map[string]string
	buildErr    error
	workloadDir string // removed by TestMain
)

func workloadBins(t *testing.T) map[string]string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "aether-workloads-")
		if err != nil {
			buildErr = err
			return
		}
		workloadDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		bins, buildErr = BuildWorkloads(ctx, dir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bins
}

// echoReply mirrors e2e/workloads/echo's Reply.
type echoReply struct {
	Server, Namespace, Cluster, Protocol, Peer, Message string
}

// rootState is what the root namespaces hold that the substrate must not change or leave behind.
type rootState struct {
	links []string
	netns []string
}

func snapshotRoot(t *testing.T) rootState {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var st rootState
	for _, l := range ls {
		st.links = append(st.links, l.Attrs().Name)
	}
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		st.netns = append(st.netns, e.Name())
	}
	slices.Sort(st.links)
	return st
}

// TestPrivilegedSubstrate brings up two clusters of two nodes, with distinct and with identical
// pod CIDRs, runs an echo server, a server-first service, a client and a hostNetwork echo in
// each, and checks: the CNI chain's result and IPAM state, pod-to-pod traffic (HTTP, gRPC, TCP,
// server-first) across nodes inside a cluster, the stub
// kube-dns, no traffic between pod CIDRs across clusters, node IPs reachable across clusters
// (from nodes and, masqueraded, from pods), CNI DEL on pod deletion, and that teardown leaves no
// namespace, mount, process or link behind.
func TestPrivilegedSubstrate(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireTools(t, testenv.ToolEtcd, testenv.ToolKubeAPIServer, testenv.ToolCNIPlugins)
	b := workloadBins(t)
	for _, tc := range []struct {
		name         string
		cidrA, cidrB string
	}{
		{"distinct-pod-cidrs", "10.244.0.0/16", "10.245.0.0/16"},
		{"identical-pod-cidrs", "10.244.0.0/16", "10.244.0.0/16"},
	} {
		t.Run(tc.name, func(t *testing.T) { runScenario(t, b, tc.cidrA, tc.cidrB) })
	}
}

func runScenario(t *testing.T, bins map[string]string, cidrA, cidrB string) {
	before := snapshotRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), fakePluginName)
	if err := os.Symlink(self, fake); err != nil {
		t.Fatal(err)
	}
	hookProcs := map[string]*Process{}
	var hookMu sync.Mutex
	s, err := Start(ctx, Options{
		Clusters:    DefaultClusters(cidrA, cidrB),
		Logger:      log,
		CNIPlugins:  []json.RawMessage{json.RawMessage(`{"type":"` + fakePluginName + `"}`)},
		CNIBinaries: []string{fake},
		Hooks: Hooks{
			// Stand-ins for the registrar and the agent: long-running processes the
			// substrate must stop at teardown.
			Cluster: func(ctx context.Context, c *Cluster) error {
				p, err := c.Start("fake-registrar", []string{bins["client"], "sleep"}, nil)
				hookMu.Lock()
				hookProcs[c.Name] = p
				hookMu.Unlock()
				return err
			},
			Node: func(ctx context.Context, n *Node) error {
				// A node process sees the node's files at their real paths.
				out, err := n.Exec(ctx, "cat", "/run/flannel/subnet.env")
				if err != nil {
					return err
				}
				if want := SubnetEnv(n.Plan, n.Cluster.Plan); string(out) != string(want) {
					return fmt.Errorf("%s sees subnet.env %q, want %q", n.Name, out, want)
				}
				p, err := n.Start("fake-agent", []string{bins["client"], "sleep"}, nil)
				hookMu.Lock()
				hookProcs[n.Name] = p
				hookMu.Unlock()
				return err
			},
		},
	})
	if err != nil {
		t.Fatalf("start substrate: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			s.Stop()
		}
	})
	t.Logf("substrate up in %v (dir %s)", s.StartupTime.Round(time.Millisecond), s.Dir)
	alpha, beta := s.Clusters[0], s.Clusters[1]

	// Per cluster: an echo server on node1, a client on node2, a hostNetwork echo on node2.
	const ns = "demo"
	for _, c := range s.Clusters {
		if err := c.CreateNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
		host := EchoPod(ns, "echo-host", c.Nodes[1].Name, c.Name, bins["echo"])
		host.Spec.HostNetwork = true
		host.Spec.Containers[0].Args = []string{"-http", ":18080", "-tcp", ""}
		host.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 18080}}
		// The scheduler stand-in places smtp on node1 by its nodeSelector.
		smtp := ServerFirstPod(ns, "smtp", "", c.Name, bins["serverfirst"])
		smtp.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": c.Nodes[0].Name}
		for _, p := range []*corev1.Pod{
			EchoPod(ns, "echo", c.Nodes[0].Name, c.Name, bins["echo"]),
			smtp,
			ClientPod(ns, "client", c.Nodes[1].Name, c.Name, bins["client"]),
			host,
		} {
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create pod %s in %s: %v", p.Name, c.Name, err)
			}
		}
		if _, err := c.Client.CoreV1().Services(ns).Create(ctx, EchoService(ns, "echo", "echo"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	podIP := map[string]string{}
	for _, c := range s.Clusters {
		for _, name := range []string{"echo", "smtp", "client", "echo-host"} {
			p, err := c.WaitPodReady(ctx, ns, name)
			if err != nil {
				dumpLogs(t, s)
				t.Fatal(err)
			}
			podIP[c.Name+"/"+name] = p.Status.PodIP
			if name == "smtp" && p.Spec.NodeName != c.Nodes[0].Name {
				t.Errorf("%s: smtp scheduled on %q, want %s (nodeSelector)", c.Name, p.Spec.NodeName, c.Nodes[0].Name)
			}
		}
	}

	t.Run("cni-chain-result", func(t *testing.T) {
		for _, c := range s.Clusters {
			sb, n, ok := c.Sandbox(ns, "echo")
			if !ok {
				t.Fatalf("%s: no sandbox for echo", c.Name)
			}
			res := sb.CNIResult
			if len(res.IPs) != 1 || !n.Plan.PodSubnet.Contains(sb.IP) {
				t.Fatalf("%s: CNI result IPs %v, want one address in %s", c.Name, res.IPs, n.Plan.PodSubnet)
			}
			if gw := res.IPs[0].Gateway.String(); gw != n.Plan.BridgeGateway().String() {
				t.Errorf("%s: gateway %s, want the bridge's %s", c.Name, gw, n.Plan.BridgeGateway())
			}
			var names []string
			for _, i := range res.Interfaces {
				names = append(names, i.Name)
			}
			if !slices.Contains(names, "cni0") || !slices.Contains(names, "eth0") {
				t.Errorf("%s: CNI result interfaces %v, want cni0 and eth0 (bridge plugin)", c.Name, names)
			}
			if podIP[c.Name+"/echo"] != sb.IP.String() {
				t.Errorf("%s: pod status IP %s, sandbox IP %s", c.Name, podIP[c.Name+"/echo"], sb.IP)
			}
			// host-local's state lives in the node's own /var/lib/cni.
			if _, err := os.Stat(n.hostPath("/var/lib/cni/networks/" + ConflistName + "/" + sb.IP.String())); err != nil {
				t.Errorf("%s: host-local reservation: %v", c.Name, err)
			}
			// A node process that started before the pod (the fake agent) sees the pod's
			// netns mount in its own mount namespace, as the agent must to capture the pod.
			fs, err := exec.Command("nsenter", "--target", fmt.Sprint(hookProcs[n.Name].Pid()), "--mount", "--",
				"stat", "-f", "-c", "%T", sb.Netns.Path).CombinedOutput()
			if err != nil || !(strings.Contains(string(fs), "nsfs") || strings.Contains(string(fs), "6e736673")) {
				t.Errorf("%s: pod netns in the node process's mount namespace: filesystem %q (%v), want nsfs", c.Name, fs, err)
			}
			// The chained plugin ran in the node's mount namespace with prevResult, and its
			// mark is in the pod's netns.
			calls, err := os.ReadFile(n.hostPath("/run/aether/fake-cni.log"))
			if err != nil || !strings.Contains(string(calls), "ADD "+sb.ContainerID+" "+sb.Netns.Path+"\n") {
				t.Errorf("%s: chained plugin calls %q (%v): no ADD for %s", c.Name, calls, err, sb.ContainerID)
			}
			if out, err := exec.Command("nsenter", "--net="+sb.Netns.Path, "--", "nft", "list", "tables").CombinedOutput(); err != nil || !strings.Contains(string(out), fakeTable) {
				t.Errorf("%s: pod netns tables %q (%v): no %s from the chained plugin", c.Name, out, err, fakeTable)
			}
			if err := sb.Netns.Do(func() error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				if l.Attrs().MTU != FlannelMTU {
					return fmt.Errorf("pod eth0 MTU %d, want %d", l.Attrs().MTU, FlannelMTU)
				}
				return nil
			}); err != nil {
				t.Errorf("%s: %v", c.Name, err)
			}
		}
	})

	run := func(c *Cluster, args ...string) (string, error) {
		out, err := c.ExecInPod(ctx, ns, "client", append([]string{bins["client"], "-timeout", "3s"}, args...)...)
		return string(out), err
	}
	reply := func(t *testing.T, out string) echoReply {
		t.Helper()
		var r echoReply
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("echo reply %q: %v", out, err)
		}
		return r
	}

	t.Run("pod-to-pod-inside-cluster", func(t *testing.T) {
		for _, c := range s.Clusters {
			out, err := run(c, "http", "http://"+net.JoinHostPort(podIP[c.Name+"/echo"], "8080")+"/hello")
			if err != nil {
				t.Fatalf("%s: client -> echo over HTTP: %v", c.Name, err)
			}
			r := reply(t, out)
			host, _, _ := net.SplitHostPort(r.Peer)
			if r.Server != "echo" || r.Cluster != c.Name || host != podIP[c.Name+"/client"] {
				t.Errorf("%s: reply %+v, want server echo of %s seeing the client's pod IP %s (no NAT inside the cluster)", c.Name, r, c.Name, podIP[c.Name+"/client"])
			}
			out, err = run(c, "grpc", net.JoinHostPort(podIP[c.Name+"/echo"], "9090"), "hi")
			if err != nil {
				t.Fatalf("%s: client -> echo over gRPC: %v", c.Name, err)
			}
			if r := reply(t, out); r.Protocol != "grpc" || r.Message != "hi" || r.Cluster != c.Name {
				t.Errorf("%s: gRPC reply %+v", c.Name, r)
			}
			out, err = run(c, "tcp", net.JoinHostPort(podIP[c.Name+"/echo"], "9000"), "ping")
			if err != nil {
				t.Fatalf("%s: client -> echo over TCP: %v", c.Name, err)
			}
			if r := reply(t, out); r.Protocol != "tcp" || r.Message != "ping" || r.Cluster != c.Name {
				t.Errorf("%s: TCP reply %+v", c.Name, r)
			}
			out, err = run(c, "banner", net.JoinHostPort(podIP[c.Name+"/smtp"], "2525"))
			if want := "220 smtp " + c.Name + " ready\r\n"; err != nil || out != want {
				t.Errorf("%s: server-first banner %q (%v), want %q", c.Name, out, err, want)
			}
			// The client (node2) reached node1's pods through Flannel's vxlan device.
			if err := c.Nodes[1].Netns.Do(func() error {
				l, err := netlink.LinkByName(vxlanName)
				if err != nil {
					return err
				}
				if st := l.Attrs().Statistics; st == nil || st.TxPackets == 0 || st.RxPackets == 0 {
					return fmt.Errorf("%s of %s carried no traffic: %+v", vxlanName, c.Nodes[1].Name, st)
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("stub-kube-dns", func(t *testing.T) {
		for _, c := range s.Clusters {
			svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			dnsSvc, err := c.Client.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
			if err != nil || dnsSvc.Spec.ClusterIP != c.Plan.DNSIP.String() {
				t.Errorf("%s: kube-system/kube-dns: %v, %v; want ClusterIP %s", c.Name, dnsSvc, err, c.Plan.DNSIP)
			}
			for _, name := range []string{"echo", "echo.demo", "echo.demo.svc.cluster.local"} {
				out, err := run(c, "resolve", name)
				if err != nil || strings.TrimSpace(out) != svc.Spec.ClusterIP {
					t.Errorf("%s: resolve %s = %q, %v; want %s", c.Name, name, out, err, svc.Spec.ClusterIP)
				}
			}
			if out, err := run(c, "resolve", "example.com"); err == nil {
				t.Errorf("%s: example.com resolved to %q; the stub must not answer outside the cluster zone", c.Name, out)
			}
		}
	})

	t.Run("no-pod-traffic-across-clusters", func(t *testing.T) {
		for _, pair := range [][2]*Cluster{{alpha, beta}, {beta, alpha}} {
			from, to := pair[0], pair[1]
			out, err := run(from, "http", "http://"+net.JoinHostPort(podIP[to.Name+"/echo"], "8080")+"/")
			if err != nil {
				continue // not routed: what we want
			}
			// With identical pod CIDRs the address may be a pod of the caller's own cluster.
			if r := reply(t, out); r.Cluster != from.Name {
				t.Errorf("%s client reached %s's pod %s at %s", from.Name, to.Name, r.Server, podIP[to.Name+"/echo"])
			}
		}
	})

	t.Run("node-ips-across-clusters", func(t *testing.T) {
		for _, pair := range [][2]*Cluster{{alpha, beta}, {beta, alpha}} {
			from, to := pair[0], pair[1]
			url := "http://" + net.JoinHostPort(to.Nodes[1].Plan.IP.String(), "18080") + "/"
			out, err := from.Nodes[0].Exec(ctx, bins["client"], "-timeout", "3s", "http", url)
			if err != nil {
				t.Fatalf("%s node -> %s node IP: %v", from.Name, to.Name, err)
			}
			r := reply(t, string(out))
			host, _, _ := net.SplitHostPort(r.Peer)
			if r.Cluster != to.Name || host != from.Nodes[0].Plan.IP.String() {
				t.Errorf("%s node -> %s: reply %+v, want %s's host echo seeing %s", from.Name, to.Name, r, to.Name, from.Nodes[0].Plan.IP)
			}
			// From a pod, Flannel's ip-masq rules SNAT to the pod's node IP.
			out2, err := run(from, "http", url)
			if err != nil {
				t.Fatalf("%s pod -> %s node IP: %v", from.Name, to.Name, err)
			}
			r = reply(t, out2)
			host, _, _ = net.SplitHostPort(r.Peer)
			if r.Cluster != to.Name || host != from.Nodes[1].Plan.IP.String() {
				t.Errorf("%s pod -> %s: reply %+v, want the client's node IP %s as peer", from.Name, to.Name, r, from.Nodes[1].Plan.IP)
			}
		}
	})

	t.Run("pod-delete-runs-cni-del", func(t *testing.T) {
		c := alpha
		sb, n, ok := c.Sandbox(ns, "client")
		if !ok {
			t.Fatal("no client sandbox")
		}
		reservation := n.hostPath("/var/lib/cni/networks/" + ConflistName + "/" + sb.IP.String())
		if _, err := os.Stat(reservation); err != nil {
			t.Fatalf("host-local reservation before DEL: %v", err)
		}
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "client", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitPodGone(ctx, ns, "client"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(reservation); !os.IsNotExist(err) {
			t.Errorf("host-local reservation %s still there after the pod went (err %v): CNI DEL did not run", reservation, err)
		}
		if calls, _ := os.ReadFile(n.hostPath("/run/aether/fake-cni.log")); !strings.Contains(string(calls), "DEL "+sb.ContainerID+" ") {
			t.Errorf("chained plugin calls %q: no DEL for %s", calls, sb.ContainerID)
		}
		if _, err := os.Stat(sb.Netns.Path); !os.IsNotExist(err) {
			t.Errorf("pod netns %s still there: %v", sb.Netns.Path, err)
		}
		if err := n.Netns.Do(func() error {
			ls, err := netlink.LinkList()
			if err != nil {
				return err
			}
			for _, l := range ls {
				if l.Type() == "veth" && l.Attrs().MasterIndex != 0 {
					return fmt.Errorf("veth %s still on the bridge", l.Attrs().Name)
				}
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	})

	total, per, err := s.Memory()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("substrate memory (RSS): %d MiB total; per process: %v", total>>20, mib(per))
	var pids []int
	for name := range per {
		var pid int
		if _, err := fmt.Sscanf(name[strings.LastIndexByte(name, '[')+1:], "%d]", &pid); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	for name, p := range hookProcs {
		select {
		case <-p.Done():
			t.Errorf("hook process of %s exited early: %v", name, p.ExitErr())
		default:
		}
	}
	dir := s.Dir

	s.Stop()
	for name, p := range hookProcs {
		select {
		case <-p.Done():
		default:
			t.Errorf("hook process of %s still runs after Stop", name)
		}
	}
	stopped = true
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run dir %s still there after Stop", dir)
	}
	if m, _ := mountsUnder(dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !strings.Contains(string(st), ") Z ") {
				t.Errorf("process %d still runs after Stop", pid)
			}
		}
	}
	if left, _ := runProcesses(dir); len(left) > 0 {
		t.Errorf("processes naming the run dir still run: %v", left)
	}
	after := snapshotRoot(t)
	if !slices.Equal(before.links, after.links) {
		t.Errorf("root namespace links changed: before %v, after %v", before.links, after.links)
	}
	for _, n := range after.netns {
		if strings.HasPrefix(n, Prefix) {
			t.Errorf("netns %s left in /var/run/netns", n)
		}
	}
}

func mib(m map[string]int64) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = fmt.Sprintf("%.1fMiB", float64(v)/(1<<20))
	}
	return out
}

func dumpLogs(t *testing.T, s *Substrate) {
	_ = filepath.WalkDir(s.Dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".log") && !strings.Contains(p, "apiserver") {
			b, _ := os.ReadFile(p)
			if len(b) > 2000 {
				b = b[len(b)-2000:]
			}
			t.Logf("== %s\n%s", p, b)
		}
		return nil
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
