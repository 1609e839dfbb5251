//go:build linux

package cni

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/containernetworking/cni/libcni"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/cni/plugin"

	"github.com/aethermesh/aether/internal/testenv"
)

// BenchmarkADD measures aether-cni ADD latency (p50/p99 reported as metrics) in four setups:
//
//   - plugin-only: the binary against an agent that answers at once (the plugin's own share:
//     process start, config parse, socket round trip, result print);
//   - agent-static: the Server called directly (no plugin process) with a static pod lookup
//     (record, nftables apply in the pod netns, fake dataplane);
//   - binary-static: the binary against the Server with a static lookup;
//   - binary-api: the binary against the Server reading the pod from a real kube-apiserver.
//
// Each iteration is one ADD (timed) followed by an untimed DEL of the same pod.
// Run: go test -run '^$' -bench BenchmarkADD -benchtime 200x ./cni/
func BenchmarkADD(b *testing.B) {
	testenv.RequireRoot(b)
	pod := testenv.NewNetns(b)
	conf := func(sock string) map[string]any {
		return map[string]any{"cniVersion": "1.0.0", "name": "bench", "type": plugin.PluginName, "agentSocket": sock,
			"prevResult": map[string]any{"cniVersion": "1.0.0", "interfaces": []any{map[string]any{"name": "eth0", "sandbox": pod.Path}},
				"ips": []any{map[string]any{"address": "10.250.0.2/16", "gateway": "10.250.0.1", "interface": 0}}}}
	}
	rt := podRT(pod, "ctr-bench", "mesh", "web")

	b.Run("plugin-only", func(b *testing.B) {
		sock := filepath.Join(sockDir(b), "cni.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			b.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"captured":true}`)) })}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		var cpu []time.Duration
		runADD(b, func() error {
			_, errb, st, err := execPluginState(b, "ADD", conf(sock), rt)
			if err != nil {
				return fmt.Errorf("%w: %s", err, errb)
			}
			cpu = append(cpu, st.UserTime()+st.SystemTime())
			return nil
		}, nil)
		// CPU time of the plugin process is what it costs the node whatever the load.
		slices.Sort(cpu)
		b.ReportMetric(float64(cpu[len(cpu)/2].Microseconds())/1000, "cpu-p50-ms")
		b.ReportMetric(float64(cpu[min(len(cpu)-1, len(cpu)*99/100)].Microseconds())/1000, "cpu-p99-ms")
	})

	b.Run("agent-static", func(b *testing.B) {
		sock := filepath.Join(sockDir(b), "cni.sock")
		startAgent(b, sock, b.TempDir(), ServerConfig{}, &staticLookup{}, &recordingDataplane{})
		c := plugin.NewClient(sock)
		req := cniv1.Request{Network: "bench", Attachment: cniv1.PodAttachment(attachment(pod, "mesh", "web"))}
		runADD(b, func() error { _, err := c.Add(context.Background(), req); return err },
			func() error { return c.Del(context.Background(), req) })
	})

	b.Run("binary-static", func(b *testing.B) {
		sock := filepath.Join(sockDir(b), "cni.sock")
		startAgent(b, sock, b.TempDir(), ServerConfig{}, &staticLookup{}, &recordingDataplane{})
		runADD(b, func() error { _, _, err := execPluginB(b, "ADD", conf(sock), rt); return err },
			func() error { _, _, err := execPluginB(b, "DEL", conf(sock), rt); return err })
	})

	b.Run("binary-api", func(b *testing.B) {
		api := testenv.StartTestKubeAPIServer(b, testenv.KubeAPIServerOptions{})
		cs, err := kubernetes.NewForConfig(api.Config)
		if err != nil {
			b.Fatal(err)
		}
		createNamespaces(b, cs)
		web := createPod(b, cs, "mesh", "web", nil, false)
		sock := filepath.Join(sockDir(b), "cni.sock")
		ag := startAgent(b, sock, b.TempDir(), ServerConfig{}, &staticLookup{}, &recordingDataplane{})
		ag.srv.Lookup = &KubePods{Client: cs}
		rtAPI := withUID(podRT(pod, "ctr-bench", "mesh", "web"), string(web.UID))
		runADD(b, func() error { _, _, err := execPluginB(b, "ADD", conf(sock), rtAPI); return err },
			func() error { _, _, err := execPluginB(b, "DEL", conf(sock), rtAPI); return err })
	})
}

func attachment(ns *testenv.Netns, podNS, name string) cniv1.PodAttachment {
	return cniv1.PodAttachment{ContainerID: "ctr-bench", Namespace: podNS, Name: name, NetnsPath: ns.Path,
		Interface: "eth0", IPs: []netip.Addr{netip.MustParseAddr("10.250.0.2")}}
}

// runADD times add over b.N iterations (running del, untimed, after each) and reports p50 and
// p99 in milliseconds.
func runADD(b *testing.B, add, del func() error) {
	b.Helper()
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := add(); err != nil {
			b.Fatalf("ADD: %v", err)
		}
		durs = append(durs, time.Since(start))
		if del != nil {
			b.StopTimer()
			if err := del(); err != nil {
				b.Fatalf("DEL: %v", err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	slices.Sort(durs)
	pct := func(p float64) float64 {
		return float64(durs[min(len(durs)-1, int(p*float64(len(durs))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// execPluginB is execPlugin with stderr in the error.
func execPluginB(b testing.TB, command string, conf map[string]any, rt *libcni.RuntimeConf) ([]byte, []byte, error) {
	out, errb, err := execPlugin(b, command, conf, rt)
	if err != nil {
		return out, errb, fmt.Errorf("%w: %s", err, errb)
	}
	return out, errb, nil
}
