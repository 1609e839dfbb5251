package testenv

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// Eventually calls check until it returns nil and returns how long that took. It polls after
// 10 ms at first, doubling the pause up to 100 ms, so a quick convergence is seen quickly and a
// slow one is not polled hard. When d passes first it fails the test with
// "<what>: not within <d>: <check's last error>". Tests give d several times the expected
// convergence time: the deadline catches a hang, it does not measure speed.
func Eventually(t testing.TB, d time.Duration, what string, check func() error) time.Duration {
	t.Helper()
	took, err := Poll(context.Background(), d, what, check)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return took
}

// Poll is Eventually for code without a test: it calls check as Eventually does until it returns
// nil (it returns how long that took), d passes (the error is "<what>: not within <d>: <check's
// last error>") or ctx ends (the error wraps ctx's and names check's last error).
func Poll(ctx context.Context, d time.Duration, what string, check func() error) (time.Duration, error) {
	start := time.Now()
	pause := 10 * time.Millisecond
	for {
		err := check()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) > d {
			return 0, fmt.Errorf("%s: not within %s: %v", what, d, err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(pause):
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// BenchEnv returns the positive integer in environment variable name (a benchmark's size: samples,
// changes, services), or def when it is unset; any other value fails tb.
func BenchEnv(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
