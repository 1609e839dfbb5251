package testenv

import (
	"io"
	"strings"
	"sync"
	"testing"
)

// Buffer is an io.Writer safe for concurrent use: a process's output or a logger writes into it
// while the test reads what has arrived so far with String.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p; it never fails.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// LogWriter returns an io.Writer that sends each write to t.Log (surrounding white space
// trimmed), for a slog handler or a process's output in a test.
func LogWriter(t testing.TB) io.Writer { return logWriter{t} }

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
