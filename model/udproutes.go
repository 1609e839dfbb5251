package model

import (
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strconv"
)

// The local ports of the routed UDP frontends (UDPFrontends): [UDPLocalPortBase,
// UDPLocalPortBase+UDPLocalPorts).
const (
	UDPLocalPortBase = 15100
	UDPLocalPorts    = 2000
)

// UDPFrontend is one VIP and UDP port a UDPRoute is bound to: the pods' capture redirects
// datagrams to VIP:Port to LocalPort in the pod's netns (REDIRECT keeps no original destination
// a UDP socket can read, so each routed frontend has a listener of its own on 127.0.0.1 or ::1,
// LocalPort), where the node Envoy's UDP listener of that frontend sends them on to Route's
// backends.
type UDPFrontend struct {
	VIP       netip.Addr
	Port      uint16
	LocalPort uint16
	Frontend  Frontend
	Route     L4Route
}

// UDPFrontends returns the routed UDP frontends of the mesh (L4Routing.UDP, one per VIP of each
// bound frontend: the Service's cluster IPs, a ServiceImport's clusterset IPs), sorted by VIP
// then port, each with its local port: UDPLocalPortBase + FNV-1a("<VIP>:<port>") mod
// UDPLocalPorts, or, when an earlier frontend in that order has the number, the next free one
// (wrapping in the range). The number is a function of the set alone, so every node and every
// restart of the agent gives a frontend the same port, and a frontend keeps its port while the
// set changes unless a new one collides with it and sorts before it (about n²/4000 for n
// frontends). A VIP and port held by two frontends (a clash the model already reports) goes to
// the first in Frontend order; frontends beyond UDPLocalPorts are left out. Nil without
// UDPRoutes.
func (m *Mesh) UDPFrontends() []UDPFrontend {
	if m.L4Routing == nil || len(m.L4Routing.UDP) == 0 {
		return nil
	}
	type key struct {
		vip  netip.Addr
		port uint16
	}
	byKey := map[key]UDPFrontend{}
	for _, fe := range slices.SortedFunc(maps.Keys(m.L4Routing.UDP), Frontend.Compare) {
		routes := m.L4Routing.UDP[fe].Routes
		s := m.Service(fe.Service)
		if s == nil || len(routes) == 0 || fe.Port == 0 || fe.Port > 65535 {
			continue
		}
		vips := s.VIPs
		if fe.Import {
			vips = s.ClustersetVIPs
		}
		for _, vip := range vips {
			k := key{vip, uint16(fe.Port)}
			if _, ok := byKey[k]; !ok {
				byKey[k] = UDPFrontend{VIP: vip, Port: uint16(fe.Port), Frontend: fe, Route: routes[0]}
			}
		}
	}
	keys := slices.SortedFunc(maps.Keys(byKey), func(a, b key) int {
		if c := a.vip.Compare(b.vip); c != 0 {
			return c
		}
		return int(a.port) - int(b.port)
	})
	taken := map[uint16]bool{}
	out := make([]UDPFrontend, 0, len(keys))
	for _, k := range keys {
		if len(taken) == UDPLocalPorts {
			break
		}
		h := fnv.New32a()
		h.Write([]byte(k.vip.String() + ":" + strconv.Itoa(int(k.port))))
		slot := h.Sum32() % UDPLocalPorts
		for taken[uint16(slot)] {
			slot = (slot + 1) % UDPLocalPorts
		}
		taken[uint16(slot)] = true
		f := byKey[k]
		f.LocalPort = uint16(UDPLocalPortBase + slot)
		out = append(out, f)
	}
	return out
}
