//go:build linux

package substrate

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// crashChildEnv makes the test binary (see TestMain) start a one-cluster substrate under the
// given base directory with a running pod and a node hook process, print "READY <run dir>" and
// wait to be killed; crashEchoEnv names the echo binary it runs.
const (
	crashChildEnv = "AESUB_TEST_CRASH_CHILD"
	crashEchoEnv  = "AESUB_TEST_ECHO_BIN"
)

func crashChild(base string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	echo := os.Getenv(crashEchoEnv)
	s, err := Start(ctx, Options{
		Clusters: []ClusterSpec{{Name: "crash", PodCIDR: "10.244.0.0/16", Nodes: 2}},
		BaseDir:  base,
		Hooks: Hooks{Node: func(ctx context.Context, n *Node) error {
			_, err := n.Start("fake-agent", []string{echo, "-http", ":18080", "-tcp", ""}, nil)
			return err
		}},
	})
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	c := s.Clusters[0]
	if err := c.CreateNamespace(ctx, "demo", nil); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	if _, err := c.Client.CoreV1().Pods("demo").Create(ctx, EchoPod("demo", "echo", c.Nodes[1].Name, c.Name, echo), metav1.CreateOptions{}); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	if _, err := c.WaitPodReady(ctx, "demo", "echo"); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Println("READY", s.Dir)
	select {}
}

// TestPrivilegedCleanAfterCrash kills a substrate's process with SIGKILL (no teardown runs) while
// pods and node processes run, and checks that nothing but namespace files and the run
// directory outlives it (Pdeathsig), and that Clean (make e2e-clean) removes those.
func TestPrivilegedCleanAfterCrash(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireTools(t, testenv.ToolEtcd, testenv.ToolKubeAPIServer, testenv.ToolCNIPlugins)
	bins := workloadBins(t)
	base := t.TempDir()
	before := snapshotRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), crashChildEnv+"="+base, crashEchoEnv+"="+bins["echo"])
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "READY ") {
		t.Fatalf("crash child: %q, %v", line, err)
	}
	dir := strings.TrimSpace(strings.TrimPrefix(line, "READY "))
	running, err := runProcesses(dir)
	if err != nil || len(running) < 6 {
		// API server, two etcds, two node hook processes, the pod's echo.
		t.Fatalf("before the crash: run processes %v (%v), want at least 6", running, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// Pdeathsig takes every child with the substrate.
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range running {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(pid) {
			t.Errorf("process %d outlived the crashed substrate", pid)
		}
	}
	if m, _ := mountsUnder(dir); len(m) == 0 {
		t.Errorf("no namespace mounts left after a crash: the test did not test Clean")
	}
	cleaned, err := Clean(base, false, nil)
	if err != nil {
		t.Fatalf("clean: %v", err)
	}
	if len(cleaned) != 1 || cleaned[0] != dir {
		t.Errorf("cleaned %v, want [%s]", cleaned, dir)
	}
	if m, _ := mountsUnder(base); len(m) > 0 {
		t.Errorf("mounts left after Clean: %v", m)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run dir %s left after Clean: %v", dir, err)
	}
	after := snapshotRoot(t)
	if strings.Join(before.links, ",") != strings.Join(after.links, ",") {
		t.Errorf("root namespace links changed: before %v, after %v", before.links, after.links)
	}
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return !strings.Contains(string(st), ") Z ")
}

// BenchmarkPrivilegedSubstrateStart measures the start-up time of the default two-cluster,
// four-node substrate (tools already built) and its resident memory right after start-up
// (reported as startup-s and rss-MiB), then tears it down.
//
//	go test -run '^$' -bench BenchmarkPrivilegedSubstrateStart -benchtime 3x ./e2e/substrate/
func BenchmarkPrivilegedSubstrateStart(b *testing.B) {
	testenv.RequireRoot(b)
	testenv.RequireTools(b, testenv.ToolEtcd, testenv.ToolKubeAPIServer, testenv.ToolCNIPlugins)
	for _, real := range []bool{false, true} {
		name := "stand-in"
		if real {
			name = "real-nodes"
			testenv.RequireTools(b, testenv.ToolNodes)
		}
		b.Run(name, func(b *testing.B) {
			var startup time.Duration
			var rss int64
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				s, err := Start(ctx, Options{RealNodes: real})
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				startup += s.StartupTime
				total, _, err := s.Memory()
				if err != nil {
					s.Stop()
					b.Fatal(err)
				}
				rss += total
				s.Stop()
			}
			b.ReportMetric(startup.Seconds()/float64(b.N), "startup-s")
			b.ReportMetric(float64(rss)/float64(b.N)/(1<<20), "rss-MiB")
		})
	}
}
