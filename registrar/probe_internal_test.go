package registrar

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestProbeLoopLogsFailures: a registry probe that fails from the very first one (a permission
// the cluster's etcd user lacks) is logged, naming the error, and again only when the error
// changes; before, a failing first probe was never logged and the registrar sat unready with
// nothing in its log.
func TestProbeLoopLogsFailures(t *testing.T) {
	var buf bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := []string{"etcdserver: permission denied", "etcdserver: permission denied",
		"context deadline exceeded", "context deadline exceeded"}
	calls := 0
	r := &Registrar{probeErr: errNotProbed, log: slog.New(slog.NewTextHandler(&buf, nil)),
		cfg: Config{ProbeInterval: time.Millisecond, ProbeTimeout: time.Second, Probe: func(context.Context) error {
			err := errors.New(errs[calls])
			if calls++; calls == len(errs) {
				cancel()
			}
			return err
		}}}
	if err := r.probeLoop(ctx); err != nil {
		t.Fatalf("probeLoop: %v", err)
	}
	for _, want := range []string{"permission denied", "deadline exceeded"} {
		if n := strings.Count(buf.String(), want); n != 1 {
			t.Errorf("log names %q %d times, want once:\n%s", want, n, buf.String())
		}
	}
	if r.Ready() == nil {
		t.Error("registrar ready after failed probes")
	}
}
