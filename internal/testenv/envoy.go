package testenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Envoy is a real Envoy process started by StartEnvoy.
type Envoy struct {
	Cmd *exec.Cmd
	// AdminAddr is the admin listener's host:port, read from --admin-address-path.
	AdminAddr string
	// LogPath is the file Envoy's own log goes to.
	LogPath string
}

// EnvoyOptions tune StartEnvoy.
type EnvoyOptions struct {
	// ExtraArgs are appended to Envoy's command line.
	ExtraArgs []string
	// LogLevel is Envoy's --log-level (default "warning").
	LogLevel string
	// WaitReady makes StartEnvoy wait until /ready answers LIVE (default true via StartEnvoy;
	// set SkipReadyWait to not wait, e.g. for an xDS-fed Envoy whose listeners come later).
	SkipReadyWait bool
	// Cgroup, when set, is a cgroup v2 directory Envoy is born in (StartCmdInCgroup), so every
	// socket it makes, its listeners first, belongs to that cgroup and its eBPF programs.
	Cgroup string
}

// StartEnvoy starts the real Envoy binary (see RequireTools) from the given bootstrap (YAML or
// JSON; its admin address should be 127.0.0.1:0, the bound address is read back through
// --admin-address-path), waits until the admin API answers /ready with LIVE (up to 60 s), and
// stops it when the test ends. Envoy's log is written to a file in the test's temp dir and
// printed when the test fails.
func StartEnvoy(t testing.TB, bootstrap string, opts EnvoyOptions) *Envoy {
	t.Helper()
	tl := RequireTools(t, ToolEnvoy)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(cfg, []byte(bootstrap), 0o644); err != nil {
		t.Fatal(err)
	}
	adminPath := filepath.Join(dir, "admin-address")
	logPath := filepath.Join(dir, "envoy.log")
	level := opts.LogLevel
	if level == "" {
		level = "warning"
	}
	args := []string{
		"-c", cfg,
		"--admin-address-path", adminPath,
		"--use-dynamic-base-id",
		"--log-level", level,
		"--log-path", logPath,
		"--concurrency", "1",
	}
	args = append(args, opts.ExtraArgs...)
	cmd := exec.Command(tl.Envoy, args...)
	out, err := os.Create(filepath.Join(dir, "envoy.stdout"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := StartCmdInCgroup(cmd, opts.Cgroup); err != nil {
		t.Fatalf("testenv: start envoy: %v", err)
	}
	e := &Envoy{Cmd: cmd, LogPath: logPath}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			s, _ := os.ReadFile(out.Name())
			t.Logf("envoy output:\n%s\nenvoy log (tail):\n%s", s, Tail(string(b), 8000))
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(adminPath); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			e.AdminAddr = strings.TrimSpace(string(b))
			break
		}
		select {
		case <-done:
			b, _ := os.ReadFile(out.Name())
			t.Fatalf("testenv: envoy exited before its admin API came up: %s\n%s", cmd.ProcessState, b)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: envoy admin address not written within 60s")
		}
	}
	if !opts.SkipReadyWait {
		if err := e.WaitReady(context.Background(), time.Until(deadline)); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	return e
}

// Admin GETs path (e.g. "/stats?filter=...") from the Envoy admin API and returns the body. A
// non-200 status is an error.
func (e *Envoy) Admin(ctx context.Context, path string) (string, error) {
	return adminGet(ctx, e.AdminAddr, path)
}

func adminGet(ctx context.Context, addr, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("envoy admin %s: status %d: %s", path, resp.StatusCode, b)
	}
	return string(b), nil
}

// WaitReady polls /ready until Envoy reports LIVE or the timeout passes.
func (e *Envoy) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		body, err := e.Admin(ctx, "/ready")
		if err == nil && strings.TrimSpace(body) == "LIVE" {
			return nil
		}
		last = body
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("envoy not ready after %s: %s", timeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Tail returns the last n bytes of s, prefixed with "..." when it cut anything: for logging a
// process's output on failure.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
