//go:build linux

package capture

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ForgetUDPFlows deletes, in the network namespace at netnsPath, the conntrack entries of UDP
// flows whose original destination is one of dsts, and returns how many it deleted. NAT rules
// apply to the first packet of a flow only: without this, a pod's socket that keeps sending to a
// VIP and port whose UDPRedirect changed or went would stay translated to the old local port
// (to another frontend's listener, or to none where kube-proxy should now answer). The next
// datagram of such a flow meets the current rules. A missing netns is no error (nothing to
// forget).
func ForgetUDPFlows(netnsPath string, dsts []netip.AddrPort) (uint, error) {
	if len(dsts) == 0 {
		return 0, nil
	}
	ns, err := netns.GetFromPath(netnsPath)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("forget UDP flows in %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("forget UDP flows in %s: %w", netnsPath, err)
	}
	defer h.Close()
	byFamily := map[netlink.InetFamily][]netlink.CustomConntrackFilter{}
	for _, d := range dsts {
		ip := d.Addr().Unmap()
		f := &netlink.ConntrackFilter{}
		if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
			return 0, fmt.Errorf("forget UDP flows to %s: %w", d, err)
		}
		if err := f.AddIP(netlink.ConntrackOrigDstIP, ip.AsSlice()); err != nil {
			return 0, fmt.Errorf("forget UDP flows to %s: %w", d, err)
		}
		if err := f.AddPort(netlink.ConntrackOrigDstPort, d.Port()); err != nil {
			return 0, fmt.Errorf("forget UDP flows to %s: %w", d, err)
		}
		fam := netlink.InetFamily(unix.AF_INET)
		if ip.Is6() {
			fam = unix.AF_INET6
		}
		byFamily[fam] = append(byFamily[fam], f)
	}
	var n uint
	for fam, fs := range byFamily {
		k, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, fs...)
		n += k
		if err != nil {
			return n, fmt.Errorf("forget UDP flows in %s: %w", netnsPath, err)
		}
	}
	return n, nil
}
