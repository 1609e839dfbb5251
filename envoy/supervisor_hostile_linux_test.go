package envoy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
		EnvoyPath:     tools.Envoy,
		Bootstrap:     unixBootstrap(dir, "stale-pid-node"),
		StateDir:      filepath.Join(dir, "envoy"),
		ExtraArgs:     []string{"--concurrency", "1"},
		CheckInterval: 100 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(testenv.LogWriter(t), nil)),
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
		_, ctx, stop := runRecorded(sup)
		defer func() {
			stop()
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

// logBuffer is a slog handler target that keeps every record for the test to search.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
	t  testing.TB
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Log(strings.TrimSpace(string(p)))
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// foreignAdmin serves an admin-like /server_info on 127.0.0.1 (another node's Envoy, or any
// program holding the port) and returns its address.
func foreignAdmin(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"state":"LIVE","node":{"id":"someone-else"}}`)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// TestSupervisorAdminAddressTaken: another program holds Envoy's admin address and answers
// /server_info for another node. With the real Envoy, which cannot bind the address and exits,
// and with a missing Envoy binary, the supervisor keeps retrying with backoff (it never takes
// the foreign admin API for its Envoy), its log names the address or the path, and the foreign
// program keeps serving.
func TestSupervisorAdminAddressTaken(t *testing.T) {
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	for _, tc := range []struct {
		name, envoy string
		want        func(dir, admin string) string
	}{
		{"real envoy", tools.Envoy, func(_, admin string) string { return admin }},
		{"missing binary", "", func(dir, _ string) string { return filepath.Join(dir, "no-envoy") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			admin := foreignAdmin(t)
			envoy := tc.envoy
			if envoy == "" {
				envoy = filepath.Join(dir, "no-envoy")
			}
			logs := &logBuffer{t: t}
			sup, err := NewSupervisor(SupervisorConfig{
				EnvoyPath: envoy,
				Bootstrap: BootstrapConfig{NodeID: "taken-node", XDSAddress: "unix://" + filepath.Join(dir, "xds.sock"),
					AdminAddress: admin},
				StateDir:      filepath.Join(dir, "envoy"),
				ExtraArgs:     []string{"--concurrency", "1"},
				MinBackoff:    20 * time.Millisecond,
				MaxBackoff:    100 * time.Millisecond,
				CheckInterval: 50 * time.Millisecond,
				Logger:        slog.New(slog.NewTextHandler(logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			rec, ctx, stop := runRecorded(sup)
			defer func() {
				stop()
				_ = sup.Stop()
			}()
			rec.waitDelays(t, 3)
			if sup.Adopted() {
				t.Errorf("adopted the foreign admin API")
			}
			if want := tc.want(dir, admin); !strings.Contains(logs.String(), want) {
				t.Errorf("supervisor log does not name %s", want)
			}
			wctx, wcancel := context.WithTimeout(ctx, time.Second)
			defer wcancel()
			if err := sup.WaitLive(wctx); err == nil {
				t.Errorf("WaitLive = nil with another node's admin API on %s", admin)
			}
			c, base := AdminClient(admin)
			if _, _, err := adminGet(ctx, c, base+"/server_info"); err != nil {
				t.Errorf("foreign admin API: %v", err)
			}
		})
	}
}

// TestSupervisorBadPaths: a state dir that cannot be created is an error naming it; an Envoy
// binary that is not executable is logged with its path and retried with backoff, nothing
// started.
func TestSupervisorBadPaths(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(file, "envoy")
	if _, err := NewSupervisor(SupervisorConfig{EnvoyPath: "envoy", StateDir: bad}); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("NewSupervisor with state dir %s = %v, want an error naming it", bad, err)
	}
	logs := &logBuffer{t: t}
	sup, err := NewSupervisor(SupervisorConfig{
		EnvoyPath: file, StateDir: filepath.Join(dir, "state"),
		Bootstrap:  unixBootstrap(dir, "bad-path-node"),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, _, stop := runRecorded(sup)
	rec.waitDelays(t, 3)
	stop()
	if sup.Starts() != 0 {
		t.Errorf("starts = %d with a non-executable binary", sup.Starts())
	}
	if !strings.Contains(logs.String(), file) || !strings.Contains(logs.String(), "permission denied") {
		t.Errorf("log does not name %s and the cause", file)
	}
}

// zombieChildren returns the pids of this process's children that exited and were not reaped.
func zombieChildren(t *testing.T) []int {
	return testenv.ProcsWhere(t, "stat", func(_ int, b []byte) bool {
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:])) // state, ppid, ...
		return len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(os.Getpid())
	})
}

// TestSupervisorPIDFileUnwritable: when the pid file cannot be written (a directory stands at
// its path), the real Envoy just started is killed and reaped (no zombie left per retry), the
// error names the path, and the supervisor retries with backoff.
func TestSupervisorPIDFileUnwritable(t *testing.T) {
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	dir, err := os.MkdirTemp("", "aetw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state := filepath.Join(dir, "envoy")
	pidPath := filepath.Join(state, "envoy.pid")
	if err := os.MkdirAll(pidPath, 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{t: t}
	sup, err := NewSupervisor(SupervisorConfig{
		EnvoyPath: tools.Envoy, StateDir: state, ExtraArgs: []string{"--concurrency", "1"},
		Bootstrap:  unixBootstrap(dir, "pid-dir-node"),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, _, stop := runRecorded(sup)
	rec.waitDelays(t, 3)
	stop()
	if !strings.Contains(logs.String(), pidPath) {
		t.Errorf("log does not name %s", pidPath)
	}
	testenv.Eventually(t, 30*time.Second, "no zombie Envoy", func() error {
		if z := zombieChildren(t); len(z) > 0 {
			return fmt.Errorf("zombie children %v", z)
		}
		return nil
	})
}

// TestSupervisorAdoptedAdminChangesHands: an Envoy adopted through its admin API alone (no pid
// file) goes away and another program answers on the admin address for another node. The
// supervisor counts that as gone and starts again (here: tries, with a missing binary) instead
// of watching a foreign program for good.
func TestSupervisorAdoptedAdminChangesHands(t *testing.T) {
	dir := t.TempDir()
	var id atomic.Value
	id.Store("handover-node")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"state":"LIVE","node":{"id":%q}}`, id.Load())
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	sup, err := NewSupervisor(SupervisorConfig{
		EnvoyPath: filepath.Join(dir, "no-envoy"), StateDir: filepath.Join(dir, "state"),
		Bootstrap:     BootstrapConfig{NodeID: "handover-node", XDSAddress: "unix://" + filepath.Join(dir, "xds.sock"), AdminAddress: l.Addr().String()},
		MinBackoff:    10 * time.Millisecond,
		CheckInterval: 20 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(testenv.LogWriter(t), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, _, stop := runRecorded(sup)
	defer stop()
	testenv.Eventually(t, 30*time.Second, "adopted through the admin API", func() error {
		if !sup.Adopted() {
			return fmt.Errorf("not adopted")
		}
		return nil
	})
	id.Store("someone-else")
	rec.waitDelays(t, 1)
}
