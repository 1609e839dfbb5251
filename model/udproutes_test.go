package model

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"strings"
	"testing"
)

// TestUDPFrontends: each VIP of a frontend a UDPRoute is bound to gets a local port from the hash
// of "<VIP>:<port>", the same for the same set; a collision goes to the next free port, in
// VIP order; no UDPRoute, no frontend.
func TestUDPFrontends(t *testing.T) {
	if got := Assemble(1, l4Sources(t)).UDPFrontends(); got != nil {
		t.Errorf("no UDPRoute: %+v", got)
	}
	m := Assemble(1, l4Sources(t,
		l4Doc("UDPRoute", "shop", "dns", 0, `[{group: "", kind: Service, name: dns, port: 53}]`, "", `[{name: dns, port: 53, weight: 2}]`),
		l4Doc("UDPRoute", "shop", "imp", 0, `[{group: multicluster.x-k8s.io, kind: ServiceImport, name: pg, port: 53}]`, "", `[{name: dns, port: 53}]`),
	))
	hashed := func(s string) uint16 {
		h := fnv.New32a()
		h.Write([]byte(s))
		return uint16(UDPLocalPortBase + h.Sum32()%UDPLocalPorts)
	}
	var got []string
	for _, f := range m.UDPFrontends() {
		got = append(got, fmt.Sprintf("%s:%d->%d %s %s", f.VIP, f.Port, f.LocalPort, f.Frontend, f.Route.Route.Name))
	}
	want := []string{
		fmt.Sprintf("10.96.0.24:53->%d Service shop/dns:53 dns", hashed("10.96.0.24:53")),
		fmt.Sprintf("10.97.0.20:53->%d ServiceImport shop/pg:53 imp", hashed("10.97.0.20:53")),
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("frontends:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if again := m.UDPFrontends(); fmt.Sprint(again) != fmt.Sprint(m.UDPFrontends()) {
		t.Errorf("not deterministic: %v", again)
	}

	// A collision: the first in VIP order keeps its slot, the next takes the one after.
	col := &Mesh{L4Routing: &L4Routing{UDP: map[Frontend]*L4Port{}}, byKey: map[ServiceKey]*Service{}}
	target := hashed("10.0.0.1:53")
	var other netip.Addr
	for i := 2; i < 1<<16 && !other.IsValid(); i++ {
		a := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		if hashed(a.String()+":53") == target {
			other = a
		}
	}
	for i, vip := range []netip.Addr{other, netip.MustParseAddr("10.0.0.1")} {
		k := ServiceKey{Namespace: "ns", Name: fmt.Sprint("s", i)}
		col.byKey[k] = &Service{Key: k, VIPs: []netip.Addr{vip}}
		col.L4Routing.UDP[Frontend{Service: k, Port: 53}] = &L4Port{Routes: []L4Route{{Route: RouteRef{Kind: KindUDPRoute, Name: k.Name}}}}
	}
	fs := col.UDPFrontends()
	wantCol := (target-UDPLocalPortBase+1)%UDPLocalPorts + UDPLocalPortBase
	if len(fs) != 2 || fs[0].VIP.String() != "10.0.0.1" || fs[0].LocalPort != target || fs[1].VIP != other || fs[1].LocalPort != wantCol {
		t.Errorf("collision of 10.0.0.1 and %s on %d: %+v, want the second on %d", other, target, fs, wantCol)
	}
}
