package testenv

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// ValidateEnvoy runs the real Envoy (see RequireTools) in --mode validate on bootstrap config (YAML
// or JSON: a file named bootstrap.json in the test's temp dir) at the given --log-level, and
// returns Envoy's output and whether it accepted the config (exit status 0). Envoy in validate
// mode binds no socket and needs no privileges. The test fails when Envoy cannot be run or does
// not finish within 2 minutes.
func ValidateEnvoy(t testing.TB, config, logLevel string) (out string, ok bool) {
	t.Helper()
	tl := RequireTools(t, ToolEnvoy)
	path := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tl.Envoy, "--mode", "validate", "-c", path, "--log-level", logLevel,
		"--use-dynamic-base-id", "--concurrency", "1")
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("testenv: envoy --mode validate did not finish in 2 minutes:\n%s", Tail(b.String(), 4000))
	case err != nil && !errors.As(err, &exit):
		t.Fatalf("testenv: run envoy --mode validate: %v", err)
	}
	return b.String(), err == nil
}
