package envoy

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestRestartBackoff drives Run's delay policy with given uptimes: the delay doubles while
// Envoy keeps dying young, stops growing at the cap, and starts again from the minimum after an
// Envoy that stayed up for StableAfter.
func TestRestartBackoff(t *testing.T) {
	const ms = time.Millisecond
	young, old := time.Second, time.Minute
	for _, c := range []struct {
		name          string
		min, max      time.Duration
		uptimes, want []time.Duration
	}{
		{"grows while dying young", 200 * ms, 30 * time.Second,
			[]time.Duration{young, young, young, young},
			[]time.Duration{200 * ms, 400 * ms, 800 * ms, 1600 * ms}},
		{"capped", 100 * ms, 500 * ms,
			[]time.Duration{0, 0, 0, 0, 0, 0},
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms, 500 * ms}},
		{"reset after staying up, then grows again", 100 * ms, 500 * ms,
			[]time.Duration{young, young, young, young, old, young, young},
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 500 * ms, 100 * ms, 200 * ms, 400 * ms}},
		{"a first death after a long run waits the minimum", 100 * ms, 500 * ms,
			[]time.Duration{old, young},
			[]time.Duration{100 * ms, 200 * ms}},
		{"minimum above the cap is capped", time.Second, 300 * ms,
			[]time.Duration{young, young},
			[]time.Duration{300 * ms, 300 * ms}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &restartBackoff{min: c.min, max: c.max, stableAfter: old}
			var got []time.Duration
			for _, u := range c.uptimes {
				got = append(got, b.delay(u))
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("delays = %v, want %v", got, c.want)
			}
		})
	}
}

// delayRecorder wraps the supervisor's sleep and records every restart delay Run asks for.
type delayRecorder struct {
	mu     sync.Mutex
	delays []time.Duration
}

func (r *delayRecorder) install(s *Supervisor) {
	sleep := s.sleep
	s.sleep = func(ctx context.Context, d time.Duration) bool {
		r.mu.Lock()
		r.delays = append(r.delays, d)
		r.mu.Unlock()
		return sleep(ctx, d)
	}
}

func (r *delayRecorder) get() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.delays)
}

// unixBootstrap is a bootstrap for node id with the xDS server and Envoy's admin API on unix
// sockets in dir (xds.sock, admin.sock), so supervisor tests need no free ports.
func unixBootstrap(dir, id string) BootstrapConfig {
	return BootstrapConfig{NodeID: id, XDSAddress: "unix://" + filepath.Join(dir, "xds.sock"), AdminAddress: "unix://" + filepath.Join(dir, "admin.sock")}
}

// runRecorded runs sup.Run in the background with its restart delays recorded; ctx is Run's
// context, and stop cancels it and waits for Run to return.
func runRecorded(sup *Supervisor) (rec *delayRecorder, ctx context.Context, stop func()) {
	rec = &delayRecorder{}
	rec.install(sup)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sup.Run(ctx); close(done) }()
	return rec, ctx, func() { cancel(); <-done }
}

// waitDelays waits until at least n delays are recorded and returns them.
func (r *delayRecorder) waitDelays(t *testing.T, n int) []time.Duration {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("%d restart delays", n), func() error {
		if got := r.get(); len(got) < n {
			return fmt.Errorf("%d so far: %v", len(got), got)
		}
		return nil
	})
	return r.get()
}

// TestEnvoyRestartBackoff runs the supervisor around the real Envoy 1.40. While a flag file
// exists, a wrapper (the supervisor's Prefix) adds a bootstrap fragment with an unknown field,
// so Envoy rejects its bootstrap and exits at once: the supervisor restarts it after delays that
// double and stop at MaxBackoff, never restarting without a delay. Once the flag is removed
// Envoy stays up; killed after running longer than StableAfter, it is restarted after
// MinBackoff again, and a second quick death doubles the delay again.
func TestEnvoyRestartBackoff(t *testing.T) {
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	// Unix socket paths are limited to 108 bytes: keep them short.
	dir, err := os.MkdirTemp("", "aetb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	crash := filepath.Join(dir, "crash")
	if err := os.WriteFile(crash, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const minB, maxB, stable = 20 * time.Millisecond, 160 * time.Millisecond, 3 * time.Second
	cfg := SupervisorConfig{
		EnvoyPath: tools.Envoy,
		Bootstrap: unixBootstrap(dir, "backoff-node"),
		StateDir:  filepath.Join(dir, "envoy"),
		// $0 is the flag file, "$@" Envoy's command line.
		Prefix:        []string{"/bin/sh", "-c", `if [ -e "$0" ]; then exec "$@" --config-yaml '{crash_loop_bogus_field: 1}'; fi; exec "$@"`, crash},
		ExtraArgs:     []string{"--concurrency", "1"},
		MinBackoff:    minB,
		MaxBackoff:    maxB,
		StableAfter:   stable,
		CheckInterval: 100 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(testenv.LogWriter(t), &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	sup, err := NewSupervisor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec, ctx, stop := runRecorded(sup)
	t.Cleanup(func() {
		stop()
		_ = sup.Stop()
		if t.Failed() {
			o, _ := os.ReadFile(filepath.Join(cfg.StateDir, "envoy.out"))
			t.Logf("envoy output (tail):\n%s", testenv.Tail(string(o), 3000))
		}
	})

	crashLoop := []time.Duration{minB, 2 * minB, 4 * minB, maxB, maxB, maxB}
	t.Run("crash loop: delays grow and are capped", func(t *testing.T) {
		got := rec.waitDelays(t, len(crashLoop))
		if !slices.Equal(got[:len(crashLoop)], crashLoop) {
			t.Errorf("restart delays = %v, want %v then %v", got, crashLoop, maxB)
		}
		// Every start after the first follows a recorded delay (starts read before the delays).
		starts := sup.Starts()
		if n := len(rec.get()); starts > n+1 {
			t.Errorf("%d starts with %d restart delays: a restart without a delay", starts, n)
		}
		// Each start was Envoy's own exit on its bootstrap, not a failure to run it.
		o, err := os.ReadFile(filepath.Join(cfg.StateDir, "envoy.out"))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(o), "crash_loop_bogus_field"); n < len(crashLoop) {
			t.Errorf("envoy.out names the bogus bootstrap field %d times, want at least %d:\n%s", n, len(crashLoop), testenv.Tail(string(o), 2000))
		}
	})

	t.Run("stable Envoy resets the delay", func(t *testing.T) {
		if err := os.Remove(crash); err != nil {
			t.Fatal(err)
		}
		// Its admin API answers (no xDS server here, so it never gets to LIVE: that would take
		// the initial fetch timeouts).
		var pid int
		testenv.Eventually(t, time.Minute, "Envoy's admin API answers", func() error {
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			defer acancel()
			if _, err := sup.serverInfo(actx); err != nil {
				return err
			}
			if pid = sup.PID(); pid == 0 {
				return fmt.Errorf("no supervised pid")
			}
			return nil
		})
		before := len(rec.get())
		// It has been running since before its admin API answered; let it run past StableAfter.
		time.Sleep(2 * stable)
		if n := len(rec.get()); n != before {
			t.Fatalf("%d restarts while Envoy was meant to stay up", n-before)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		got := rec.waitDelays(t, before+1)
		if d := got[before]; d != minB {
			t.Errorf("delay after a death past StableAfter = %v, want MinBackoff %v (all: %v)", d, minB, got)
		}
		// The restarted Envoy dies young: the delay doubles again.
		var next int
		testenv.Eventually(t, time.Minute, "a new Envoy", func() error {
			if next = sup.PID(); next == 0 || next == pid {
				return fmt.Errorf("pid %d", next)
			}
			return nil
		})
		if err := syscall.Kill(next, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		got = rec.waitDelays(t, before+2)
		if d := got[before+1]; d != 2*minB {
			t.Errorf("delay after a quick second death = %v, want %v (all: %v)", d, 2*minB, got)
		}
	})
}
