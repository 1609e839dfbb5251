//go:build linux

package testenv

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// Raw frames for tests that play a pod forging what it sends (a source address, an ARP or
// neighbour-discovery claim), as a pod with CAP_NET_RAW can.

// SendFrame writes one raw Ethernet frame out of eth0 in ns (AF_PACKET), as a pod with
// CAP_NET_RAW can.
func SendFrame(t testing.TB, ns *Netns, frame []byte) {
	t.Helper()
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checksum is the Internet checksum (RFC 1071) of the concatenated parts.
func checksum(parts ...[]byte) uint16 {
	var sum uint32
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	for i := 0; i+1 < len(all); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(all[i:]))
	}
	if len(all)%2 == 1 {
		sum += uint32(all[len(all)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func ether(dst, src net.HardwareAddr, typ uint16) []byte {
	f := append(append([]byte{}, dst...), src...)
	return binary.BigEndian.AppendUint16(f, typ)
}

// UDPFrame is an Ethernet frame carrying a UDP datagram from src to dst:port, with valid
// checksums, whatever src is.
func UDPFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, port uint16) []byte {
	payload := []byte("spoofed")
	udp := binary.BigEndian.AppendUint16(nil, 40000)
	udp = binary.BigEndian.AppendUint16(udp, port)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(payload)))
	udp = append(udp, 0, 0)
	udp = append(udp, payload...)
	if src.Is4() {
		ip := []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, unix.IPPROTO_UDP, 0, 0}
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
		ip = append(append(ip, src.AsSlice()...), dst.AsSlice()...)
		binary.BigEndian.PutUint16(ip[10:], checksum(ip))
		return append(append(ether(dstMAC, srcMAC, unix.ETH_P_IP), ip...), udp...)
	}
	pseudo := append(append(append([]byte{}, src.AsSlice()...), dst.AsSlice()...), 0, 0, 0, byte(len(udp)), 0, 0, 0, unix.IPPROTO_UDP)
	binary.BigEndian.PutUint16(udp[6:], checksum(pseudo, udp))
	return append(append(ether(dstMAC, srcMAC, unix.ETH_P_IPV6), ipv6Header(src, dst, unix.IPPROTO_UDP, len(udp), 64)...), udp...)
}

func ipv6Header(src, dst netip.Addr, next uint8, n int, hops uint8) []byte {
	ip := []byte{0x60, 0, 0, 0, 0, 0, next, hops}
	binary.BigEndian.PutUint16(ip[4:], uint16(n))
	return append(append(ip, src.AsSlice()...), dst.AsSlice()...)
}

// ARPRequest is a broadcast ARP request (RFC 826) from senderMAC claiming senderIP, asking for
// target: a host that owns target updates its neighbour entry for senderIP.
func ARPRequest(senderMAC net.HardwareAddr, senderIP, target netip.Addr) []byte {
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	a := []byte{0, 1, 0x08, 0, 6, 4, 0, 1}
	a = append(append(a, senderMAC...), senderIP.AsSlice()...)
	a = append(append(a, make([]byte, 6)...), target.AsSlice()...)
	return append(ether(bcast, senderMAC, unix.ETH_P_ARP), a...)
}

// NeighborAdvert is an unsolicited, overriding neighbour advertisement (RFC 4861 section 4.4)
// from mac claiming target, sent to dst (a neighbour's address and MAC).
func NeighborAdvert(mac net.HardwareAddr, src, target, dst netip.Addr, dstMAC net.HardwareAddr) []byte {
	na := []byte{136, 0, 0, 0, 0x20, 0, 0, 0} // type, code, checksum, flags: O
	na = append(na, target.AsSlice()...)
	na = append(append(na, 2, 1), mac...) // option: target link-layer address
	pseudo := append(append(append([]byte{}, src.AsSlice()...), dst.AsSlice()...), 0, 0, 0, byte(len(na)), 0, 0, 0, unix.IPPROTO_ICMPV6)
	binary.BigEndian.PutUint16(na[2:], checksum(pseudo, na))
	return append(append(ether(dstMAC, mac, unix.ETH_P_IPV6), ipv6Header(src, dst, unix.IPPROTO_ICMPV6, len(na), 255)...), na...)
}
