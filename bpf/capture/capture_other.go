//go:build !linux || !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package capture

import "fmt"

// errPlatform says why: the object is compiled for little-endian BPF (bpfel) and loaded on Linux.
var errPlatform = fmt.Errorf("%w: needs Linux on a little-endian CPU", ErrUnsupported)

// Capture is the loaded capture programs and maps (see the Linux build); here every method fails
// with ErrUnsupported.
type Capture struct{}

// Load fails with ErrUnsupported here.
func Load() (*Capture, error) { return nil, errPlatform }

// OpenPinned fails with ErrUnsupported here.
func OpenPinned(string) (*Capture, error) { return nil, errPlatform }

// Ensure fails with ErrUnsupported here.
func Ensure(string, string) (*Capture, error) { return nil, errPlatform }

// RemovePins fails with ErrUnsupported here.
func RemovePins(string) error { return errPlatform }

// NetnsCookie fails with ErrUnsupported here.
func NetnsCookie(string) (uint64, error) { return 0, errPlatform }

// Probe reports eBPF capture missing here.
func Probe() ProbeResult { return ProbeResult{Missing: []string{errPlatform.Error()}} }

// Attach fails with ErrUnsupported here.
func (*Capture) Attach(string) error { return errPlatform }

// Pin fails with ErrUnsupported here.
func (*Capture) Pin(string) error { return errPlatform }

// Attached returns nothing here.
func (*Capture) Attached() []string { return nil }

// Unpin fails with ErrUnsupported here.
func (*Capture) Unpin() error { return errPlatform }

// Close does nothing here.
func (*Capture) Close() error { return nil }

// SetPod fails with ErrUnsupported here.
func (*Capture) SetPod(uint64, PodSettings) error { return errPlatform }

// DeletePod fails with ErrUnsupported here.
func (*Capture) DeletePod(uint64) error { return errPlatform }

// ListPods fails with ErrUnsupported here.
func (*Capture) ListPods() (map[uint64]PodSettings, error) { return nil, errPlatform }

// Handshakes fails with ErrUnsupported here.
func (*Capture) Handshakes() (int, error) { return 0, errPlatform }

// Stats are the programs' counters (see the Linux build).
type Stats struct{ Redirected, Passed, Refused, OriginalDst, NoStorage, DNS uint64 }

// Stats fails with ErrUnsupported here.
func (*Capture) Stats() (Stats, error) { return Stats{}, errPlatform }
