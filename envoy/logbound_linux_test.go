//go:build linux

package envoy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestTrimLog: a file over the bound is copied to .1 and truncated, and a writer holding it open
// with O_APPEND (as Envoy's stdout is) goes on writing at the start of the emptied file, not at
// its old offset (no hole of zeros); a file within the bound and a missing file are left alone.
func TestTrimLog(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "envoy.out")
	if trimmed, err := trimLog(p, 10); trimmed || err != nil {
		t.Fatalf("missing file: trimmed %v, %v", trimmed, err)
	}
	w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	first := bytes.Repeat([]byte("denied\n"), 10) // 70 bytes
	if _, err := w.Write(first); err != nil {
		t.Fatal(err)
	}
	if trimmed, err := trimLog(p, 100); trimmed || err != nil {
		t.Fatalf("within the bound: trimmed %v, %v", trimmed, err)
	}
	if _, err := w.Write(first); err != nil {
		t.Fatal(err)
	}
	if trimmed, err := trimLog(p, 100); !trimmed || err != nil {
		t.Fatalf("over the bound: trimmed %v, %v", trimmed, err)
	}
	if old, err := os.ReadFile(p + ".1"); err != nil || !bytes.Equal(old, append(first, first...)) {
		t.Fatalf("copy %q, %v; want the 140 bytes written", old, err)
	}
	if _, err := w.Write([]byte("next\n")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "next\n" {
		t.Fatalf("after the trim the file holds %q (%d bytes), %v; want only the next line", b, len(b), err)
	}
}

// TestEnvoyOutputBounded runs the supervisor around the real Envoy at debug log level with a
// 16 KiB bound: Envoy's own log (--log-path, opened by Envoy) is copied to envoy.log.1 and
// truncated, and Envoy's next lines land at the start of the emptied file (Envoy appends), so
// the file stays near the bound while Envoy keeps logging.
func TestEnvoyOutputBounded(t *testing.T) {
	dir := lockTestDir(t)
	cfg := lockTestConfig(t, dir, "bounded-node")
	cfg.ExtraArgs = append(cfg.ExtraArgs, "--log-level", "debug")
	cfg.MaxLogBytes = 16 << 10
	stopEnvoyAtEnd(t, dir, cfg)
	sup, err := NewSupervisor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = sup.Run(ctx) }()
	adminAnswers(t, sup)
	log := filepath.Join(cfg.StateDir, "envoy.log")
	testenv.Eventually(t, time.Minute, "envoy.log copied to envoy.log.1 and Envoy writing again", func() error {
		if _, err := os.Stat(log + ".1"); err != nil {
			// Envoy at debug logs its admin requests: make it write.
			_, _ = sup.serverInfo(ctx)
			return err
		}
		_, _ = sup.serverInfo(ctx)
		b, err := os.ReadFile(log)
		if err != nil {
			return err
		}
		if len(b) == 0 {
			return fmt.Errorf("envoy.log empty since the trim")
		}
		if b[0] == 0 {
			return fmt.Errorf("envoy.log starts with a hole of zeros (%d bytes): Envoy writes at its old offset", len(b))
		}
		return nil
	})
	// However much Envoy logs, the file stays within the bound plus what one check interval
	// brings.
	for i := 0; i < 200; i++ {
		_, _ = sup.serverInfo(ctx)
	}
	testenv.Eventually(t, time.Minute, "envoy.log back within its bound", func() error {
		st, err := os.Stat(log)
		if err != nil {
			return err
		}
		if st.Size() > 2*cfg.MaxLogBytes {
			return fmt.Errorf("envoy.log %d bytes, bound %d", st.Size(), cfg.MaxLogBytes)
		}
		return nil
	})
}
