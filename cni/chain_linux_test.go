//go:build linux

package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aethermesh/aether/cni/plugin"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	cniversion "github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/aethermesh/aether/internal/testenv"
)

// node is a test "host" namespace that the chain runs from (the bridge lives there), with
// HOST_IP on its loopback, and the libcni handle and conflist for it.
type node struct {
	host    *testenv.Netns
	cni     *libcni.CNIConfig
	list    *libcni.NetworkConfigList
	raw     []byte
	binDirs []string
	ipamDir string
}

// newNode creates the host namespace and a conflist of the given version: bridge + host-local on
// subnet, then aether-cni talking to socket, with extra fields merged into aether-cni's entry.
func newNode(t *testing.T, version, subnet, socket string, extra map[string]any) *node {
	t.Helper()
	tl := testenv.RequireTools(t, testenv.ToolCNIPlugins)
	n := &node{host: testenv.NewNetns(t)}
	h, err := n.host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, _ := h.LinkByName("lo")
	addr, _ := netlink.ParseAddr(hostIP + "/32")
	if err := h.AddrAdd(lo, addr); err != nil {
		t.Fatalf("add HOST_IP: %v", err)
	}
	dir := t.TempDir()
	n.ipamDir = filepath.Join(dir, "ipam")
	aether := map[string]any{"type": plugin.PluginName, "agentSocket": socket, "timeoutSeconds": 20}
	for k, v := range extra {
		aether[k] = v
	}
	conf := map[string]any{
		"cniVersion": version, "name": "aethertest",
		"plugins": []any{
			map[string]any{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
				"ipam": map[string]any{"type": "host-local", "dataDir": n.ipamDir,
					"ranges": []any{[]any{map[string]any{"subnet": subnet}}},
					"routes": []any{map[string]any{"dst": "0.0.0.0/0"}}}},
			aether,
		},
	}
	n.raw, _ = json.Marshal(conf)
	if n.list, err = libcni.ConfListFromBytes(n.raw); err != nil {
		t.Fatal(err)
	}
	n.binDirs = []string{tl.CNIBinDir, pluginBinary(t)}
	// An explicit exec: libcni creates its default one lazily, which races under concurrent use.
	n.cni = libcni.NewCNIConfigWithCacheDir(n.binDirs, filepath.Join(dir, "cache"),
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: cniversion.PluginDecoder{}})
	return n
}

func podRT(ns *testenv.Netns, cid, podNS, podName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: cid, NetNS: ns.Path, IfName: "eth0", Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", podNS}, {"K8S_POD_NAME", podName},
		{"K8S_POD_UID", "uid-" + podName}, {"K8S_POD_INFRA_CONTAINER_ID", cid}}}
}

// add runs the chain's ADD from the host namespace (plugins run in the namespace of whoever
// execs them).
func (n *node) add(t *testing.T, rt *libcni.RuntimeConf) (types.Result, error) {
	var res types.Result
	err := n.host.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err = n.cni.AddNetworkList(ctx, n.list, rt)
		return err
	})
	return res, err
}

func (n *node) do(fn func(ctx context.Context) error) error {
	return n.host.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return fn(ctx)
	})
}

// podIP returns the first IPv4 address in a result.
func podIP(t *testing.T, r types.Result) string {
	t.Helper()
	b, _ := json.Marshal(r)
	var v struct {
		IPs []struct{ Address, Gateway string } `json:"ips"`
	}
	_ = json.Unmarshal(b, &v)
	if len(v.IPs) == 0 {
		t.Fatalf("result has no IPs: %s", b)
	}
	ip, _, _ := net.ParseCIDR(v.IPs[0].Address)
	return ip.String()
}

// execPlugin runs the built aether-cni binary directly with a config (plus prevResult) and
// returns its stdout, stderr and exit error.
func execPlugin(t testing.TB, command string, conf map[string]any, rt *libcni.RuntimeConf) ([]byte, []byte, error) {
	out, errb, _, err := execPluginState(t, command, conf, rt)
	return out, errb, err
}

// execPluginState is execPlugin that also returns the exited process's state (CPU times).
func execPluginState(t testing.TB, command string, conf map[string]any, rt *libcni.RuntimeConf) ([]byte, []byte, *os.ProcessState, error) {
	t.Helper()
	stdin, _ := json.Marshal(conf)
	var args []string
	for _, kv := range rt.Args {
		args = append(args, kv[0]+"="+kv[1])
	}
	cmd := exec.Command(filepath.Join(pluginBinary(t), plugin.PluginName))
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID="+rt.ContainerID, "CNI_NETNS="+rt.NetNS,
		"CNI_IFNAME="+rt.IfName, "CNI_PATH=/nonexistent", "CNI_ARGS="+strings.Join(args, ";"))
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.Bytes(), errb.Bytes(), cmd.ProcessState, err
}

// pluginConf returns aether-cni's entry of the node's conflist with name and cniVersion, as a
// runtime would pass it.
func (n *node) pluginConf() map[string]any {
	var v map[string]any
	_ = json.Unmarshal(n.list.Plugins[1].Bytes, &v)
	v["name"], v["cniVersion"] = n.list.Name, n.list.CNIVersion
	return v
}

func listenIn(t *testing.T, ns *testenv.Netns, addr string) chan net.Conn {
	t.Helper()
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	ch := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	return ch
}

func dialIn(ns *testenv.Netns, src, addr string) error {
	return ns.Do(func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		if src != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
		}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// TestPrivilegedCNIChain drives the real chain bridge + host-local + aether-cni through libcni
// under conflists of versions 0.3.1, 1.0.0 and 1.1.0 and checks the CNI spec's command sequences
// and what capture does to traffic.
func TestPrivilegedCNIChain(t *testing.T) {
	testenv.RequireRoot(t)
	for i, tc := range []struct {
		version string
		mode    string
	}{{"0.3.1", "strict"}, {"1.0.0", "permissive"}, {"1.1.0", "strict"}} {
		t.Run(tc.version+"-"+tc.mode, func(t *testing.T) {
			sock := filepath.Join(sockDir(t), "cni.sock")
			ag := startAgent(t, sock, t.TempDir(), ServerConfig{}, &staticLookup{}, &recordingDataplane{})
			n := newNode(t, tc.version, fmt.Sprintf("10.244.%d.0/24", 10+i), sock, map[string]any{"inboundMode": tc.mode})
			gw := fmt.Sprintf("10.244.%d.1", 10+i)
			podA := testenv.NewNetns(t)
			rtA := podRT(podA, "ctr-a", "mesh", "a")

			// VERSION (CNI spec 1.1, "Version") through libcni, which asks in its own current
			// version (1.1.0), through libcni's conflist validation (which asks every plugin of
			// the chain whether it supports the conflist's version), and by running the binary
			// with this conflist's cniVersion on stdin, which the answer must echo.
			var info cniversion.PluginInfo
			if err := n.do(func(ctx context.Context) (err error) {
				info, err = n.cni.GetVersionInfo(ctx, plugin.PluginName)
				return err
			}); err != nil {
				t.Fatalf("VERSION via libcni: %v", err)
			}
			checkVersionAnswer(t, info, cniversion.Current())
			if err := n.do(func(ctx context.Context) error { _, err := n.cni.ValidateNetworkList(ctx, n.list); return err }); err != nil {
				t.Fatalf("libcni ValidateNetworkList for %s: %v", tc.version, err)
			}
			out, stderr, err := execPlugin(t, "VERSION", map[string]any{"cniVersion": tc.version}, rtA)
			if err != nil {
				t.Fatalf("VERSION: %v\n%s", err, stderr)
			}
			if info, err = (&cniversion.PluginDecoder{}).Decode(out); err != nil {
				t.Fatalf("VERSION answer %s: %v", out, err)
			}
			checkVersionAnswer(t, info, tc.version)

			// ADD: the chain's result is the bridge's result, passed through unchanged.
			res, err := n.add(t, rtA)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if got := res.Version(); got != tc.version {
				t.Fatalf("result version %s, want %s", got, tc.version)
			}
			ipA := podIP(t, res)
			if !tableIn(t, podA) {
				t.Fatal("no aether table in the pod netns after ADD")
			}
			if recs := records(t, ag.state); len(recs) != 1 || recs[0].Attachment.NetnsPath != podA.Path || recs[0].Attachment.Name != "a" {
				t.Fatalf("records after ADD = %+v", recs)
			}
			if ag.dp.liveCount() != 1 {
				t.Fatalf("dataplane has %d pods, want 1", ag.dp.liveCount())
			}
			// ADD's stdout equals the prevResult it was given (direct run of the binary; the
			// agent treats the repeated ADD idempotently).
			prevJSON, _ := json.Marshal(res)
			var prev map[string]any
			_ = json.Unmarshal(prevJSON, &prev)
			conf := n.pluginConf()
			conf["prevResult"] = prev
			out, stderr, err = execPlugin(t, "ADD", conf, rtA)
			if err != nil {
				t.Fatalf("direct ADD: %v\n%s", err, stderr)
			}
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("ADD stdout is not JSON: %q", out)
			}
			if !reflect.DeepEqual(got, prev) {
				t.Fatalf("ADD result differs from prevResult:\n got  %s\n want %s", out, prevJSON)
			}
			// ADD without prevResult (not chained) is an error.
			delete(conf, "prevResult")
			if out, _, err := execPlugin(t, "ADD", conf, rtA); err == nil || !strings.Contains(string(out), "prevResult") {
				t.Fatalf("ADD without prevResult = %v, %s; want an error naming prevResult", err, out)
			}

			// CHECK (spec 0.4.0 and later).
			if tc.version != "0.3.1" {
				if err := n.do(func(ctx context.Context) error { return n.cni.CheckNetworkList(ctx, n.list, rtA) }); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}

			// Outbound TCP lands on the capture listener with its original destination.
			captured := listenIn(t, podA, "127.0.0.1:15001")
			if err := dialIn(podA, "", "203.0.113.9:80"); err != nil {
				t.Fatalf("dial from pod: %v", err)
			}
			select {
			case c := <-captured:
				od, err := originalDst(c)
				c.Close()
				if err != nil || od.String() != "203.0.113.9:80" {
					t.Fatalf("SO_ORIGINAL_DST = %v, %v", od, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("capture listener got nothing")
			}
			// DNS to the cluster DNS address reaches the resolver on HOST_IP:18054.
			n.host.ServeUDPEcho(t, hostIP+":18054", "resolver:")
			if got, err := podA.AskUDP(clusterDNS+":53", "q", 5*time.Second); err != nil || got != "resolver:q" {
				t.Fatalf("DNS query = %q, %v", got, err)
			}

			// A kube-system pod is passed through without asking the agent.
			podK := testenv.NewNetns(t)
			rtK := podRT(podK, "ctr-k", "kube-system", "k")
			if _, err := n.add(t, rtK); err != nil {
				t.Fatalf("ADD kube-system pod: %v", err)
			}
			if tableIn(t, podK) || len(records(t, ag.state)) != 1 {
				t.Fatal("kube-system pod got capture rules or a record")
			}
			// Inbound: pod B (namespace not opted in: recorded, left uncaptured) dials pod A.
			ag.lookup.set(map[string]bool{"plain/b": true}, nil)
			podB := testenv.NewNetns(t)
			rtB := podRT(podB, "ctr-b", "plain", "b")
			if _, err := n.add(t, rtB); err != nil {
				t.Fatalf("ADD pod B: %v", err)
			}
			if tableIn(t, podB) {
				t.Fatal("pod outside the mesh got capture rules")
			}
			listenIn(t, podA, ipA+":8080")
			listenIn(t, podA, ipA+":15008")
			err = dialIn(podB, "", ipA+":8080")
			if tc.mode == "strict" && !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("strict: plaintext pod B -> A:8080 = %v, want refused", err)
			}
			if tc.mode == "permissive" && err != nil {
				t.Fatalf("permissive: plaintext pod B -> A:8080: %v", err)
			}
			if err := dialIn(podB, "", ipA+":15008"); err != nil {
				t.Fatalf("pod B -> A:15008: %v", err)
			}
			// The node's connections (source: the gateway address on the bridge) pass to the
			// kubelet's probe port only (strict).
			listenIn(t, podA, ipA+":8081")
			if err := dialIn(n.host, gw, ipA+":8081"); err != nil {
				t.Fatalf("node -> A:8081 (probe port): %v", err)
			}
			err = dialIn(n.host, gw, ipA+":8080")
			if tc.mode == "strict" && !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("strict: node -> A:8080 (not a probe port) = %v, want refused", err)
			}
			if tc.mode == "permissive" && err != nil {
				t.Fatalf("permissive: node -> A:8080: %v", err)
			}

			// CHECK notices rules deleted by hand.
			if tc.version != "0.3.1" {
				if out, err := podA.Command("nft", "delete", "table", "inet", "aether").CombinedOutput(); err != nil {
					t.Fatalf("%v %s", err, out)
				}
				if err := n.do(func(ctx context.Context) error { return n.cni.CheckNetworkList(ctx, n.list, rtA) }); err == nil {
					t.Fatal("CHECK passed with the rules gone")
				}
			}

			// GC (1.1.0): only pod B is valid, so pod A's attachment is released.
			if tc.version == "1.1.0" {
				err := n.do(func(ctx context.Context) error {
					return n.cni.GCNetworkList(ctx, n.list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "ctr-b", IfName: "eth0"}}})
				})
				if err != nil {
					t.Fatalf("GC: %v", err)
				}
				if recs := records(t, ag.state); len(recs) != 1 || recs[0].Attachment.ContainerID != "ctr-b" {
					t.Fatalf("records after GC = %d, want only ctr-b", len(recs))
				}
				if tableIn(t, podA) {
					t.Fatal("GC left pod A's rules")
				}
			}

			// DEL twice: both succeed and leave nothing of aether's.
			for i := 0; i < 2; i++ {
				for _, rt := range []*libcni.RuntimeConf{rtA, rtB, rtK} {
					if err := n.do(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, n.list, rt) }); err != nil {
						t.Fatalf("DEL %d of %s: %v", i+1, rt.ContainerID, err)
					}
				}
			}
			if tableIn(t, podA) {
				t.Fatal("rules left after DEL")
			}
			if recs := records(t, ag.state); len(recs) != 0 {
				t.Fatalf("records left after DEL: %d", len(recs))
			}
			if ag.dp.liveCount() != 0 {
				t.Fatalf("dataplane still has %d pods", ag.dp.liveCount())
			}

			// STATUS (1.1.0): ready while the agent runs, error 50 once it is down.
			if tc.version == "1.1.0" {
				if err := n.do(func(ctx context.Context) error { return n.cni.GetStatusNetworkList(ctx, n.list) }); err != nil {
					t.Fatalf("STATUS with the agent up: %v", err)
				}
				ag.stop()
				err := n.do(func(ctx context.Context) error { return n.cni.GetStatusNetworkList(ctx, n.list) })
				var te *types.Error
				if !errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable {
					t.Fatalf("STATUS with the agent down = %v, want error code 50", err)
				}
			}
		})
	}
}

// checkVersionAnswer asserts a VERSION answer: it names cniVersion and supports every conflist
// version aether-cni is chained under (0.3.1, what kube-flannel writes, 1.0.0 and 1.1.0).
func checkVersionAnswer(t *testing.T, info cniversion.PluginInfo, cniVersion string) {
	t.Helper()
	var buf bytes.Buffer
	if err := info.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	var got struct {
		CNIVersion string   `json:"cniVersion"`
		Supported  []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("VERSION answer %s: %v", buf.Bytes(), err)
	}
	if got.CNIVersion != cniVersion {
		t.Errorf("VERSION answered cniVersion %q, want %q (the input's)", got.CNIVersion, cniVersion)
	}
	for _, v := range []string{"0.3.1", "1.0.0", "1.1.0"} {
		if !slices.Contains(got.Supported, v) {
			t.Errorf("VERSION supportedVersions %v lacks %s", got.Supported, v)
		}
	}
}
