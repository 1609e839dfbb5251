package testenv

import (
	"errors"
	"net"
	"testing"
	"time"
)

// ExpectClosed fails the test, naming what, unless a read on c fails within 5 s with a reset or
// an end of stream: the connection was cut, not just quiet.
func ExpectClosed(t testing.TB, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%s: read = %v, want the connection closed (reset or EOF)", what, err)
	}
}
