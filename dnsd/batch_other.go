//go:build !linux

package dnsd

import (
	"errors"
	"net"
	"net/netip"
)

// batchSize is the number of datagrams a batch holds (batched I/O is Linux-only).
const batchSize = 1

// batchIO is false: without recvmmsg(2) the fast path reads one datagram at a time.
const batchIO = false

// udpBatch is the Linux batched I/O; never created on other systems.
type udpBatch struct{ wire [batchSize][]byte }

func newUDPBatch(*net.UDPConn, int) (*udpBatch, error) {
	return nil, errors.New("batched udp i/o: linux only")
}

func (*udpBatch) read() (int, error)                  { return 0, errors.New("batched udp i/o: linux only") }
func (*udpBatch) packet(int) ([]byte, netip.AddrPort) { return nil, netip.AddrPort{} }
func (*udpBatch) write(idx []int, answers [][]byte) error {
	return errors.New("batched udp i/o: linux only")
}
