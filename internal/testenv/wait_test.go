package testenv

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// fatalTB records Fatalf and stops the calling goroutine's work by panicking, as t.Fatalf's
// runtime.Goexit would.
type fatalTB struct {
	testing.TB
	msg string
}

type fatalStop struct{}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatalStop{})
}

// TestEventually: Eventually returns once check succeeds (after the failures before it), and
// fails the test with the check's last error when the deadline passes first.
func TestEventually(t *testing.T) {
	calls := 0
	took := Eventually(t, time.Minute, "third call", func() error {
		if calls++; calls < 3 {
			return fmt.Errorf("call %d", calls)
		}
		return nil
	})
	if calls != 3 || took <= 0 {
		t.Errorf("Eventually: %d calls, took %s; want 3 calls and a positive duration", calls, took)
	}

	f := &fatalTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(fatalStop); !ok {
					panic(r)
				}
			}
		}()
		Eventually(f, 50*time.Millisecond, "never", func() error { return errors.New("still down") })
	}()
	if want := "never: not within 50ms: still down"; f.msg != want {
		t.Errorf("failure message %q, want %q", f.msg, want)
	}
}
