package xds

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// startForeign starts an unrelated long-running process (not Envoy) and returns it; the test
// kills it at the end.
func startForeign(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// TestSupervisorStalePIDFile: a pid file left from before a reboot names a live process that is
// not our Envoy (pids are reused). The supervisor neither adopts it (it starts its own real
// Envoy) nor signals it, in Run or in Stop.
func TestSupervisorStalePIDFile(t *testing.T) {
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	dir, err := os.MkdirTemp("", "aetp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	foreign := startForeign(t)
	cfg := SupervisorConfig{
		EnvoyPath: tools.Envoy,
		Bootstrap: BootstrapConfig{NodeID: "stale-pid-node", XDSAddress: "unix://" + filepath.Join(dir, "xds.sock"),
			AdminAddress: "unix://" + filepath.Join(dir, "admin.sock")},
		StateDir:      filepath.Join(dir, "envoy"),
		ExtraArgs:     []string{"--concurrency", "1"},
		CheckInterval: 100 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(cfg.StateDir, "envoy.pid")
	writePID := func() {
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(foreign.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writePID()

	t.Run("Stop leaves the foreign process alone", func(t *testing.T) {
		sup, err := NewSupervisor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := sup.Stop(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if !alive(foreign.Process.Pid) {
			t.Fatalf("Stop killed pid %d, a process it did not start", foreign.Process.Pid)
		}
	})

	t.Run("Run starts its own Envoy", func(t *testing.T) {
		writePID()
		sup, err := NewSupervisor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = sup.Run(ctx); close(done) }()
		defer func() {
			cancel()
			<-done
			_ = sup.Stop()
		}()
		testenv.Eventually(t, time.Minute, "our Envoy's admin API answers", func() error {
			if sup.Adopted() && sup.PID() == foreign.Process.Pid {
				return fmt.Errorf("adopted the foreign pid %d", foreign.Process.Pid)
			}
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			defer acancel()
			si, err := sup.serverInfo(actx)
			if err != nil {
				return err
			}
			if si.Node.ID != cfg.Bootstrap.NodeID {
				return fmt.Errorf("node id %q", si.Node.ID)
			}
			return nil
		})
		if sup.Starts() == 0 || sup.PID() == foreign.Process.Pid {
			t.Errorf("starts %d, pid %d (foreign %d): want an Envoy of its own", sup.Starts(), sup.PID(), foreign.Process.Pid)
		}
		if !alive(foreign.Process.Pid) {
			t.Errorf("foreign pid %d was killed", foreign.Process.Pid)
		}
	})
}
