package dnsd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// batchSize is the number of datagrams one recvmmsg(2) reads and one sendmmsg(2) writes at most.
const batchSize = 32

// batchIO says the fast path reads and writes datagrams in batches (recvmmsg/sendmmsg).
const batchIO = true

// mmsghdr is struct mmsghdr of recvmmsg(2) and sendmmsg(2): a msghdr and the byte count the
// kernel fills in (Go pads it as C does).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// udpBatch reads and writes datagrams batchSize at a time on one UDP socket with recvmmsg(2) and
// sendmmsg(2): one system call per batch instead of one per datagram, which is most of what a
// busy resolver's CPU does. The sender addresses stay in kernel form (sockaddr) from the read to
// the write, so nothing is parsed or allocated per datagram. Not safe for concurrent use.
//
// Both calls pass MSG_DONTWAIT (they never block: an empty socket parks the goroutine on Go's
// poller instead) and are made with RawSyscall6, without the runtime's syscall bookkeeping. A
// plain Syscall6 wakes the runtime's sysmon thread whenever it finds it in its idle sleep, which
// at a low query rate is every query: a second thread woken per query on the resolver's core
// (docs/dns.md has the measurement).
type udpBatch struct {
	raw   rawConn
	in    [batchSize]mmsghdr
	inIov [batchSize]unix.Iovec
	names [batchSize][unix.SizeofSockaddrInet6]byte
	bufs  [batchSize][]byte
	out   [batchSize]mmsghdr
	oIov  [batchSize]unix.Iovec
	// wire are the answer buffers of the batch's datagrams, for the caller to fill.
	wire [batchSize][]byte
	// recvFn and sendFn are b.recv and b.send, bound once: a closure made per call would escape
	// to the heap through rawConn (two allocations per batch, a GC cycle every few seconds at
	// 12k queries/s). They leave their results in the fields below.
	recvFn, sendFn func(fd uintptr) bool
	// n and errno are the last call's datagram count and error; sent is where send starts and
	// count how many datagrams the write has.
	n           int
	errno       unix.Errno
	sent, count int
}

// rawConn is the part of syscall.RawConn udpBatch uses (its Read and Write wait on Go's poller
// and honour the socket's deadlines).
type rawConn interface {
	Read(f func(fd uintptr) (done bool)) error
	Write(f func(fd uintptr) (done bool)) error
}

// newUDPBatch prepares batched I/O on c, reading datagrams of up to size bytes.
func newUDPBatch(c *net.UDPConn, size int) (*udpBatch, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("open raw udp socket: %w", err)
	}
	b := &udpBatch{raw: raw}
	for i := range b.in {
		b.bufs[i] = make([]byte, size)
		b.inIov[i].Base = &b.bufs[i][0]
		b.inIov[i].SetLen(size)
		b.in[i].hdr.Name = &b.names[i][0]
		b.in[i].hdr.Iov = &b.inIov[i]
		b.in[i].hdr.SetIovlen(1)
		b.wire[i] = make([]byte, 0, 512)
	}
	b.recvFn, b.sendFn = b.recv, b.send
	return b, nil
}

// read waits for datagrams and reads up to batchSize of them; datagram i is b.bufs[i][:n] (see
// packet). It returns the socket's error (a deadline's timeout after ShutdownContext).
func (b *udpBatch) read() (int, error) {
	for i := range b.in {
		b.in[i].hdr.Namelen = uint32(len(b.names[i]))
		b.in[i].hdr.Flags = 0
		b.in[i].n = 0
	}
	if err := b.raw.Read(b.recvFn); err != nil {
		return 0, err
	}
	if b.errno != 0 {
		return 0, &net.OpError{Op: "recvmmsg", Net: "udp", Err: b.errno}
	}
	return b.n, nil
}

// recv is one non-blocking recvmmsg(2) for rawConn.Read: false (wait on the poller) when the
// socket is empty or the call was interrupted, else true with the result in b.n and b.errno.
func (b *udpBatch) recv(fd uintptr) bool {
	r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.in[0])), batchSize, unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	b.n, b.errno = int(r), e
	return true
}

// packet returns datagram i of the last read and its sender (invalid for a sender address the
// kernel did not give as IPv4 or IPv6).
func (b *udpBatch) packet(i int) ([]byte, netip.AddrPort) {
	q := b.bufs[i][:b.in[i].n]
	name := b.names[i][:b.in[i].hdr.Namelen]
	if len(name) < 2 {
		return q, netip.AddrPort{}
	}
	port := binary.BigEndian.Uint16(name[2:4])
	switch binary.NativeEndian.Uint16(name) {
	case unix.AF_INET:
		if len(name) >= unix.SizeofSockaddrInet4 {
			return q, netip.AddrPortFrom(netip.AddrFrom4([4]byte(name[4:8])), port)
		}
	case unix.AF_INET6:
		if len(name) >= unix.SizeofSockaddrInet6 {
			return q, netip.AddrPortFrom(netip.AddrFrom16([16]byte(name[8:24])).Unmap(), port)
		}
	}
	return q, netip.AddrPort{}
}

// write sends answers[k] to the sender of datagram idx[k] of the last read, for every k, and
// returns the first error of a datagram the kernel refused (the others are still sent).
func (b *udpBatch) write(idx []int, answers [][]byte) error {
	for k, i := range idx {
		b.oIov[k].Base = unsafe.SliceData(answers[k])
		b.oIov[k].SetLen(len(answers[k]))
		b.out[k].hdr = unix.Msghdr{Name: &b.names[i][0], Namelen: b.in[i].hdr.Namelen, Iov: &b.oIov[k]}
		b.out[k].hdr.SetIovlen(1)
	}
	var first error
	b.count = len(idx)
	for b.sent = 0; b.sent < b.count; {
		if err := b.raw.Write(b.sendFn); err != nil {
			return errors.Join(first, err)
		}
		n := b.n
		if b.errno != 0 {
			// The datagram at sent failed (sendmmsg(2) reports an error only for the first
			// datagram of a call): skip it.
			if first == nil {
				first = &net.OpError{Op: "sendmmsg", Net: "udp", Err: b.errno}
			}
			n = 1
		}
		b.sent += n
	}
	return first
}

// send is one non-blocking sendmmsg(2) of datagrams b.sent to b.count of b.out for
// rawConn.Write: false (wait on the poller) when the socket buffer is full or the call was
// interrupted, else true with the result in b.n and b.errno.
func (b *udpBatch) send(fd uintptr) bool {
	r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.out[b.sent])), uintptr(b.count-b.sent), unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	b.n, b.errno = int(r), e
	return true
}
