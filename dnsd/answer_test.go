package dnsd

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/aethermesh/aether/model"
)

var (
	shopPod    = netip.MustParseAddr("10.244.0.5")
	defaultPod = netip.MustParseAddr("10.244.0.6")
	strangerIP = netip.MustParseAddr("10.244.9.9")
)

// testMesh is the model the table tests answer from:
//   - default/web: local, dual-stack VIPs, oldest "web" (owns web.mesh); ports http (80) and
//     GRPC (9090, a port name in upper case);
//   - shop/web: local, newer (no short name);
//   - shop/cart: local and imported (clusterset VIP), IPv4 only; one unnamed port 8080;
//   - remote/pay: imported only (not local: its mesh name answers the clusterset VIP); UDP port
//     dns (53);
//   - default/headless: local without VIP and not headless (as an ExternalName Service), port
//     http (80);
//   - default/db: headless (clusterIP None), with ready pods db-0, db-1 (dual-stack), db.x (a pod
//     name with a dot) and db-6 (IPv6 only), an unready db-2 here, and a ready db-3 in cluster c2;
//     port pg (5432), a named targetPort that db-1 serves on 5433 and the others on 5432.
func testMesh() *model.Mesh {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ips := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	svcs := []*model.Service{
		{Key: model.ServiceKey{Namespace: "default", Name: "web"}, Local: true, VIPs: ips("10.96.0.20", "fd00::20"), Created: t0,
			Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP}, {Name: "GRPC", Port: 9090, TargetPort: 9090, Protocol: model.ProtocolGRPC}}},
		{Key: model.ServiceKey{Namespace: "shop", Name: "web"}, Local: true, VIPs: ips("10.96.1.20"), Created: t0.Add(time.Hour)},
		{Key: model.ServiceKey{Namespace: "shop", Name: "cart"}, Local: true, VIPs: ips("10.96.1.30"), Imported: true, ClustersetVIPs: ips("10.97.0.30"), Created: t0,
			Ports: []model.ServicePort{{Port: 8080, TargetPort: 8080, Protocol: model.ProtocolTCP}}},
		{Key: model.ServiceKey{Namespace: "remote", Name: "pay"}, Imported: true, ClustersetVIPs: ips("10.97.0.40"),
			Ports: []model.ServicePort{{Name: "dns", Port: 53, TargetPort: 5353, Protocol: model.ProtocolUDP, FromImport: true}}},
		{Key: model.ServiceKey{Namespace: "default", Name: "headless"}, Local: true, Created: t0,
			Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP}}},
		{Key: model.ServiceKey{Namespace: "default", Name: "db"}, Local: true, Headless: true, Created: t0,
			Ports: []model.ServicePort{{Name: "pg", Port: 5432, TargetPort: 5432, TargetPortName: "pg", Protocol: model.ProtocolTCP}}},
	}
	pg := func(port uint32) []model.EndpointPort {
		return []model.EndpointPort{{Name: "pg", Port: port, Protocol: model.ProtocolTCP}}
	}
	db := model.ServiceKey{Namespace: "default", Name: "db"}
	eps := map[model.ServiceKey][]model.Endpoint{db: {
		{Service: db, Cluster: "c1", PodUID: "d1", PodName: "db-0", IPs: ips("10.244.1.7"), Healthy: true, Ports: pg(5432)},
		{Service: db, Cluster: "c1", PodUID: "d2", PodName: "db-1", IPs: ips("10.244.1.5", "fd00:244::5"), Healthy: true, Ports: pg(5433)},
		{Service: db, Cluster: "c1", PodUID: "d3", PodName: "db-2", IPs: ips("10.244.1.6"), Healthy: false, Ports: pg(5432)},
		{Service: db, Cluster: "c1", PodUID: "d5", PodName: "db.x", IPs: ips("10.244.1.8"), Healthy: true, Ports: pg(5432)},
		{Service: db, Cluster: "c1", PodUID: "d6", PodName: "db-6", IPs: ips("fd00:244::6"), Healthy: true, Ports: pg(5432)},
		{Service: db, Cluster: "c2", PodUID: "d4", PodName: "db-3", IPs: ips("10.245.0.8"), Healthy: true, Ports: pg(5432)},
	}}
	pods := []*model.LocalPod{
		{UID: "u1", Namespace: "shop", Name: "client", IPs: []netip.Addr{shopPod}},
		{UID: "u2", Namespace: "default", Name: "client", IPs: []netip.Addr{defaultPod}},
	}
	return model.New(7, "c1", "", "", model.Node{Name: "n1"}, svcs, eps, pods)
}

func meshSOA() string {
	return "mesh.\t5\tIN\tSOA\tns.dns.mesh. hostmaster.mesh. 7 7200 1800 86400 5"
}

func csSOA() string {
	return "svc.clusterset.local.\t5\tIN\tSOA\tns.dns.svc.clusterset.local. hostmaster.svc.clusterset.local. 7 7200 1800 86400 5"
}

func rr(name, typ, data string) string { return name + "\t5\tIN\t" + typ + "\t" + data }

// dnsCase is one query and the answer the index must give.
type dnsCase struct {
	name  string
	qname string
	qtype uint16
	src   netip.Addr
	edit  func(m *dns.Msg) // changes the query before it is asked

	act    Action
	rcode  int
	answer []string
	ns     []string
	extra  []string // the additional section without OPT
	noAA   bool
	check  func(t *testing.T, m *dns.Msg)
}

func TestRespond(t *testing.T) {
	idx, err := NewIndex(testMesh(), IndexOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range respondCases() {
		t.Run(tc.name, func(t *testing.T) {
			runCase(t, idx, tc)
		})
	}
}

// respondCases are the DNS rules as data, answered from testMesh (TestRespond); the fast path
// is compared with the slow path over the same cases (TestRespondWireMatchesRespond).
func respondCases() []dnsCase {
	nx := []string{meshSOA()}
	return []dnsCase{
		{name: "namespaced name A", qname: "web.default.mesh.", qtype: dns.TypeA,
			answer: []string{rr("web.default.mesh.", "A", "10.96.0.20")}},
		{name: "namespaced name AAAA from IPv6 VIP", qname: "web.default.mesh.", qtype: dns.TypeAAAA,
			answer: []string{rr("web.default.mesh.", "AAAA", "fd00::20")}},
		{name: "ANY gives both address records", qname: "web.default.mesh.", qtype: dns.TypeANY,
			answer: []string{rr("web.default.mesh.", "A", "10.96.0.20"), rr("web.default.mesh.", "AAAA", "fd00::20")}},
		{name: "case of the question is kept", qname: "WeB.DeFault.MESH.", qtype: dns.TypeA,
			answer: []string{rr("WeB.DeFault.MESH.", "A", "10.96.0.20")}},
		{name: "short name owned by the oldest service", qname: "web.mesh.", qtype: dns.TypeA,
			answer: []string{rr("web.mesh.", "A", "10.96.0.20")}},
		{name: "clash loser keeps its namespaced name", qname: "web.shop.mesh.", qtype: dns.TypeA,
			answer: []string{rr("web.shop.mesh.", "A", "10.96.1.20")}},
		{name: "unambiguous short name", qname: "cart.mesh.", qtype: dns.TypeA,
			answer: []string{rr("cart.mesh.", "A", "10.96.1.30")}},
		{name: "mesh name of a local and imported service answers the local VIP", qname: "cart.shop.mesh.", qtype: dns.TypeA,
			answer: []string{rr("cart.shop.mesh.", "A", "10.96.1.30")}},
		{name: "AAAA without IPv6 VIP is NODATA with SOA", qname: "cart.shop.mesh.", qtype: dns.TypeAAAA, ns: nx},
		{name: "other type is NODATA with SOA", qname: "web.default.mesh.", qtype: dns.TypeMX, ns: nx},
		{name: "TXT is NODATA with SOA", qname: "web.default.mesh.", qtype: dns.TypeTXT, ns: nx},
		{name: "HTTPS is NODATA with SOA", qname: "web.mesh.", qtype: dns.TypeHTTPS, ns: nx},
		{name: "service without VIP is NODATA", qname: "headless.default.mesh.", qtype: dns.TypeA, ns: nx},
		{name: "headless service A: this cluster's ready pods", qname: "db.default.mesh.", qtype: dns.TypeA,
			answer: []string{rr("db.default.mesh.", "A", "10.244.1.5"), rr("db.default.mesh.", "A", "10.244.1.7"), rr("db.default.mesh.", "A", "10.244.1.8")}},
		{name: "headless service's pod by name", qname: "db-0.db.default.mesh.", qtype: dns.TypeA,
			answer: []string{rr("db-0.db.default.mesh.", "A", "10.244.1.7")}},
		{name: "headless service's dual-stack pod: only the address the mesh carries (IPv4)", qname: "db-1.db.default.mesh.", qtype: dns.TypeAAAA, ns: nx},
		{name: "headless service's IPv6-only pod AAAA", qname: "db-6.db.default.mesh.", qtype: dns.TypeAAAA,
			answer: []string{rr("db-6.db.default.mesh.", "AAAA", "fd00:244::6")}},
		{name: "headless service's unready pod has no name", qname: "db-2.db.default.mesh.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: nx},
		{name: "headless service's pod in another cluster has no name", qname: "db-3.db.default.mesh.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: nx},
		{name: "headless service's pod named with a dot has no name", qname: "x.db.default.mesh.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: nx},
		{name: "headless service AAAA: IPv6-only pods (a dual-stack pod is answered by its IPv4 address)", qname: "db.default.mesh.", qtype: dns.TypeAAAA,
			answer: []string{rr("db.default.mesh.", "AAAA", "fd00:244::6")}},
		{name: "headless short name", qname: "db.mesh.", qtype: dns.TypeA,
			answer: []string{rr("db.mesh.", "A", "10.244.1.5"), rr("db.mesh.", "A", "10.244.1.7"), rr("db.mesh.", "A", "10.244.1.8")}},
		{name: "search expansion of a headless name", qname: "db.mesh.default.svc.cluster.local.", qtype: dns.TypeA, src: defaultPod,
			answer: []string{rr("db.mesh.default.svc.cluster.local.", "CNAME", "db.mesh."), rr("db.mesh.", "A", "10.244.1.5"), rr("db.mesh.", "A", "10.244.1.7"), rr("db.mesh.", "A", "10.244.1.8")}},
		{name: "SRV of a named port (Kubernetes DNS spec 2.4.1), the target's addresses in additional", qname: "_http._tcp.web.default.mesh.", qtype: dns.TypeSRV,
			answer: []string{rr("_http._tcp.web.default.mesh.", "SRV", "0 100 80 web.default.mesh.")},
			extra:  []string{rr("web.default.mesh.", "A", "10.96.0.20"), rr("web.default.mesh.", "AAAA", "fd00::20")}},
		{name: "SRV owner label is the port name in lower case", qname: "_grpc._tcp.web.default.mesh.", qtype: dns.TypeSRV,
			answer: []string{rr("_grpc._tcp.web.default.mesh.", "SRV", "0 100 9090 web.default.mesh.")},
			extra:  []string{rr("web.default.mesh.", "A", "10.96.0.20"), rr("web.default.mesh.", "AAAA", "fd00::20")}},
		{name: "SRV at the service name: every port, weight shared, each target's addresses once", qname: "web.default.mesh.", qtype: dns.TypeSRV,
			answer: []string{rr("web.default.mesh.", "SRV", "0 50 80 web.default.mesh."), rr("web.default.mesh.", "SRV", "0 50 9090 web.default.mesh.")},
			extra:  []string{rr("web.default.mesh.", "A", "10.96.0.20"), rr("web.default.mesh.", "AAAA", "fd00::20")}},
		{name: "ANY at a service name gives its addresses, not its SRV records", qname: "web.shop.mesh.", qtype: dns.TypeANY,
			answer: []string{rr("web.shop.mesh.", "A", "10.96.1.20")}},
		{name: "ANY at a port's SRV name gives the SRV records", qname: "_http._tcp.web.default.mesh.", qtype: dns.TypeANY,
			answer: []string{rr("_http._tcp.web.default.mesh.", "SRV", "0 100 80 web.default.mesh.")},
			extra:  []string{rr("web.default.mesh.", "A", "10.96.0.20"), rr("web.default.mesh.", "AAAA", "fd00::20")}},
		{name: "A at a port's SRV name is NODATA", qname: "_http._tcp.web.default.mesh.", qtype: dns.TypeA, ns: nx},
		{name: "the protocol label is an empty non-terminal", qname: "_tcp.web.default.mesh.", qtype: dns.TypeSRV, ns: nx},
		{name: "SRV of a port under the wrong protocol is NXDOMAIN", qname: "_http._udp.web.default.mesh.", qtype: dns.TypeSRV, rcode: dns.RcodeNameError, ns: nx},
		{name: "SRV of an unknown port is NXDOMAIN", qname: "_nope._tcp.web.default.mesh.", qtype: dns.TypeSRV, rcode: dns.RcodeNameError, ns: nx},
		{name: "SRV under the short name points at the short name", qname: "_http._tcp.web.mesh.", qtype: dns.TypeSRV,
			answer: []string{rr("_http._tcp.web.mesh.", "SRV", "0 100 80 web.mesh.")},
			extra:  []string{rr("web.mesh.", "A", "10.96.0.20"), rr("web.mesh.", "AAAA", "fd00::20")}},
		{name: "an unnamed port has SRV only at the service name", qname: "cart.shop.mesh.", qtype: dns.TypeSRV,
			answer: []string{rr("cart.shop.mesh.", "SRV", "0 100 8080 cart.shop.mesh.")},
			extra:  []string{rr("cart.shop.mesh.", "A", "10.96.1.30")}},
		{name: "a service without VIP has no SRV records (RFC 2782: a target has addresses)", qname: "headless.default.mesh.", qtype: dns.TypeSRV, ns: nx},
		{name: "nor SRV names", qname: "_http._tcp.headless.default.mesh.", qtype: dns.TypeSRV, rcode: dns.RcodeNameError, ns: nx},
		{name: "SRV of a UDP port of an imported service", qname: "_dns._udp.pay.remote.mesh.", qtype: dns.TypeSRV,
			answer: []string{rr("_dns._udp.pay.remote.mesh.", "SRV", "0 100 53 pay.remote.mesh.")},
			extra:  []string{rr("pay.remote.mesh.", "A", "10.97.0.40")}},
		{name: "clusterset SRV (MCS DNS specification): the Service port on the clusterset name", qname: "_dns._udp.pay.remote.svc.clusterset.local.", qtype: dns.TypeSRV,
			answer: []string{rr("_dns._udp.pay.remote.svc.clusterset.local.", "SRV", "0 100 53 pay.remote.svc.clusterset.local.")},
			extra:  []string{rr("pay.remote.svc.clusterset.local.", "A", "10.97.0.40")}},
		{name: "clusterset protocol label is an empty non-terminal", qname: "_udp.pay.remote.svc.clusterset.local.", qtype: dns.TypeSRV, ns: []string{csSOA()}},
		{name: "headless SRV: each named ready pod here on its own target port", qname: "_pg._tcp.db.default.mesh.", qtype: dns.TypeSRV,
			answer: []string{rr("_pg._tcp.db.default.mesh.", "SRV", "0 33 5432 db-0.db.default.mesh."), rr("_pg._tcp.db.default.mesh.", "SRV", "0 33 5433 db-1.db.default.mesh."),
				rr("_pg._tcp.db.default.mesh.", "SRV", "0 33 5432 db-6.db.default.mesh.")},
			extra: []string{rr("db-0.db.default.mesh.", "A", "10.244.1.7"), rr("db-1.db.default.mesh.", "A", "10.244.1.5"), rr("db-6.db.default.mesh.", "AAAA", "fd00:244::6")}},
		{name: "headless SRV under the short name points at the pods' names", qname: "_pg._tcp.db.mesh.", qtype: dns.TypeSRV,
			answer: []string{rr("_pg._tcp.db.mesh.", "SRV", "0 33 5432 db-0.db.default.mesh."), rr("_pg._tcp.db.mesh.", "SRV", "0 33 5433 db-1.db.default.mesh."),
				rr("_pg._tcp.db.mesh.", "SRV", "0 33 5432 db-6.db.default.mesh.")},
			extra: []string{rr("db-0.db.default.mesh.", "A", "10.244.1.7"), rr("db-1.db.default.mesh.", "A", "10.244.1.5"), rr("db-6.db.default.mesh.", "AAAA", "fd00:244::6")}},
		{name: "search expansion of an SRV name", qname: "_http._tcp.web.mesh.shop.svc.cluster.local.", qtype: dns.TypeSRV, src: shopPod,
			answer: []string{rr("_http._tcp.web.mesh.shop.svc.cluster.local.", "CNAME", "_http._tcp.web.mesh."), rr("_http._tcp.web.mesh.", "SRV", "0 100 80 web.mesh.")},
			extra:  []string{rr("web.mesh.", "A", "10.96.0.20"), rr("web.mesh.", "AAAA", "fd00::20")}},
		{name: "search expansion of an SRV name asked for A is CNAME and NODATA", qname: "_http._tcp.web.mesh.shop.svc.cluster.local.", qtype: dns.TypeA, src: shopPod,
			answer: []string{rr("_http._tcp.web.mesh.shop.svc.cluster.local.", "CNAME", "_http._tcp.web.mesh.")}, ns: nx},
		{name: "imported-only service answers its clusterset VIP", qname: "pay.remote.mesh.", qtype: dns.TypeA,
			answer: []string{rr("pay.remote.mesh.", "A", "10.97.0.40")}},
		{name: "imported-only service has no short name", qname: "pay.mesh.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: nx},
		{name: "unknown name is NXDOMAIN with SOA", qname: "nope.default.mesh.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: nx},
		{name: "unknown namespace is NXDOMAIN", qname: "web.nope.mesh.", qtype: dns.TypeAAAA, rcode: dns.RcodeNameError, ns: nx},
		{name: "below an existing name is NXDOMAIN", qname: "x.web.default.mesh.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: nx},
		{name: "empty non-terminal is NODATA (RFC 8020)", qname: "default.mesh.", qtype: dns.TypeA, ns: nx},
		{name: "empty non-terminal AAAA is NODATA", qname: "shop.mesh.", qtype: dns.TypeAAAA, ns: nx},
		{name: "namespace with only imported services is an empty non-terminal", qname: "remote.mesh.", qtype: dns.TypeA, ns: nx},
		{name: "apex SOA", qname: "mesh.", qtype: dns.TypeSOA, answer: []string{meshSOA()}},
		{name: "apex A is NODATA", qname: "mesh.", qtype: dns.TypeA, ns: nx},
		{name: "clusterset name A", qname: "cart.shop.svc.clusterset.local.", qtype: dns.TypeA,
			answer: []string{rr("cart.shop.svc.clusterset.local.", "A", "10.97.0.30")}},
		{name: "clusterset name of an imported-only service", qname: "pay.remote.svc.clusterset.local.", qtype: dns.TypeA,
			answer: []string{rr("pay.remote.svc.clusterset.local.", "A", "10.97.0.40")}},
		{name: "clusterset AAAA is NODATA with the clusterset SOA", qname: "cart.shop.svc.clusterset.local.", qtype: dns.TypeAAAA,
			ns: []string{csSOA()}},
		{name: "clusterset empty non-terminal is NODATA", qname: "shop.svc.clusterset.local.", qtype: dns.TypeA, ns: []string{csSOA()}},
		{name: "clusterset apex SOA", qname: "svc.clusterset.local.", qtype: dns.TypeSOA, answer: []string{csSOA()}},
		{name: "clusterset name without ServiceImport is forwarded", qname: "web.default.svc.clusterset.local.", qtype: dns.TypeA, act: ForwardClusterset},
		{name: "clusterset.local outside svc is forwarded", qname: "foo.clusterset.local.", qtype: dns.TypeA, act: Forward},
		{name: "search expansion of a short name from the pod's namespace", qname: "web.mesh.shop.svc.cluster.local.", qtype: dns.TypeA, src: shopPod,
			answer: []string{rr("web.mesh.shop.svc.cluster.local.", "CNAME", "web.mesh."), rr("web.mesh.", "A", "10.96.0.20")}},
		{name: "search expansion AAAA", qname: "web.mesh.shop.svc.cluster.local.", qtype: dns.TypeAAAA, src: shopPod,
			answer: []string{rr("web.mesh.shop.svc.cluster.local.", "CNAME", "web.mesh."), rr("web.mesh.", "AAAA", "fd00::20")}},
		{name: "search expansion AAAA without IPv6 VIP is CNAME and NODATA", qname: "cart.mesh.shop.svc.cluster.local.", qtype: dns.TypeAAAA, src: shopPod,
			answer: []string{rr("cart.mesh.shop.svc.cluster.local.", "CNAME", "cart.mesh.")}, ns: nx},
		{name: "search expansion of a namespaced name", qname: "cart.shop.mesh.default.svc.cluster.local.", qtype: dns.TypeA, src: defaultPod,
			answer: []string{rr("cart.shop.mesh.default.svc.cluster.local.", "CNAME", "cart.shop.mesh."), rr("cart.shop.mesh.", "A", "10.96.1.30")}},
		{name: "search expansion of a clusterset name", qname: "cart.shop.svc.clusterset.local.shop.svc.cluster.local.", qtype: dns.TypeA, src: shopPod,
			answer: []string{rr("cart.shop.svc.clusterset.local.shop.svc.cluster.local.", "CNAME", "cart.shop.svc.clusterset.local."),
				rr("cart.shop.svc.clusterset.local.", "A", "10.97.0.30")}},
		{name: "search expansion keeps the question's case", qname: "Web.Mesh.Shop.Svc.Cluster.Local.", qtype: dns.TypeA, src: shopPod,
			answer: []string{rr("Web.Mesh.Shop.Svc.Cluster.Local.", "CNAME", "web.mesh."), rr("web.mesh.", "A", "10.96.0.20")}},
		{name: "search expansion for another namespace than the pod's is forwarded", qname: "web.mesh.default.svc.cluster.local.", qtype: dns.TypeA, src: shopPod, act: Forward},
		{name: "search expansion from an unknown source is forwarded", qname: "web.mesh.shop.svc.cluster.local.", qtype: dns.TypeA, src: strangerIP, act: Forward},
		{name: "search expansion of an unknown mesh name is forwarded", qname: "nope.mesh.shop.svc.cluster.local.", qtype: dns.TypeA, src: shopPod, act: Forward},
		{name: "search expansion of an empty non-terminal is forwarded", qname: "shop.mesh.shop.svc.cluster.local.", qtype: dns.TypeA, src: shopPod, act: Forward},
		{name: "second search domain is kube-dns's", qname: "web.mesh.svc.cluster.local.", qtype: dns.TypeA, src: shopPod, act: Forward},
		{name: "cluster name is kube-dns's", qname: "web.shop.svc.cluster.local.", qtype: dns.TypeA, src: shopPod, act: Forward},
		{name: "other names are forwarded", qname: "example.org.", qtype: dns.TypeA, act: Forward},
		{name: "suffix lookalike is forwarded", qname: "notmesh.", qtype: dns.TypeA, act: Forward},
		{name: "non-IN class in the zone is REFUSED", qname: "web.mesh.", qtype: dns.TypeA, rcode: dns.RcodeRefused, noAA: true,
			edit: func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }},
		{name: "non-IN class elsewhere is forwarded", qname: "version.bind.", qtype: dns.TypeTXT, act: Forward,
			edit: func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }},
		{name: "zone transfer is REFUSED", qname: "mesh.", qtype: dns.TypeAXFR, rcode: dns.RcodeRefused, noAA: true},
		{name: "NOTIFY is NOTIMP", qname: "mesh.", qtype: dns.TypeSOA, rcode: dns.RcodeNotImplemented, noAA: true,
			edit: func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify }},
		{name: "two questions is FORMERR", qname: "web.mesh.", qtype: dns.TypeA, rcode: dns.RcodeFormatError, noAA: true,
			edit: func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }},
		{name: "no question is FORMERR", qname: "web.mesh.", qtype: dns.TypeA, rcode: dns.RcodeFormatError, noAA: true,
			edit: func(m *dns.Msg) { m.Question = nil }},
		{name: "EDNS version 1 is BADVERS (RFC 6891 6.1.3)", qname: "web.mesh.", qtype: dns.TypeA, rcode: dns.RcodeBadVers, noAA: true,
			edit: func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) }},
		{name: "two OPT records is FORMERR (RFC 6891 6.1.1)", qname: "web.mesh.", qtype: dns.TypeA, rcode: dns.RcodeFormatError, noAA: true,
			edit: func(m *dns.Msg) { m.SetEdns0(1232, false); m.SetEdns0(1232, false) }},
		{name: "EDNS query gets OPT with DO copied", qname: "web.mesh.", qtype: dns.TypeA,
			edit:   func(m *dns.Msg) { m.SetEdns0(4096, true) },
			answer: []string{rr("web.mesh.", "A", "10.96.0.20")},
			check: func(t *testing.T, m *dns.Msg) {
				opt := m.IsEdns0()
				if opt == nil || !opt.Do() || opt.UDPSize() != ednsUDPSize || opt.Version() != 0 {
					t.Errorf("OPT = %v, want version 0, DO, size %d", opt, ednsUDPSize)
				}
			}},
		{name: "non-EDNS query gets no OPT", qname: "nope.mesh.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: nx,
			check: func(t *testing.T, m *dns.Msg) {
				if m.IsEdns0() != nil {
					t.Errorf("OPT present in answer to a query without one")
				}
			}},
		{name: "RD and CD copied, RA set", qname: "web.mesh.", qtype: dns.TypeA,
			edit:   func(m *dns.Msg) { m.RecursionDesired = true; m.CheckingDisabled = true },
			answer: []string{rr("web.mesh.", "A", "10.96.0.20")},
			check: func(t *testing.T, m *dns.Msg) {
				if !m.RecursionDesired || !m.CheckingDisabled || !m.RecursionAvailable {
					t.Errorf("flags RD=%v CD=%v RA=%v, want all set", m.RecursionDesired, m.CheckingDisabled, m.RecursionAvailable)
				}
			}},
	}
}

// TestRespondClusterDomain: with IndexOptions.ClusterDomain set (a cluster whose kubelet's
// clusterDomain is not cluster.local), the first search-list expansion under that domain is
// answered, and the same name under cluster.local is kube-dns's like any other name.
func TestRespondClusterDomain(t *testing.T) {
	idx, err := NewIndex(testMesh(), IndexOptions{ClusterDomain: "Corp.Example"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []dnsCase{
		{name: "expansion under the cluster domain", qname: "web.mesh.shop.svc.corp.example.", qtype: dns.TypeA, src: shopPod,
			answer: []string{rr("web.mesh.shop.svc.corp.example.", "CNAME", "web.mesh."), rr("web.mesh.", "A", "10.96.0.20")}},
		{name: "expansion of a namespaced name, mixed case", qname: "Cart.Shop.Mesh.Default.Svc.Corp.Example.", qtype: dns.TypeA, src: defaultPod,
			answer: []string{rr("Cart.Shop.Mesh.Default.Svc.Corp.Example.", "CNAME", "cart.shop.mesh."), rr("cart.shop.mesh.", "A", "10.96.1.30")}},
		{name: "cluster.local expansion is forwarded", qname: "web.mesh.shop.svc.cluster.local.", qtype: dns.TypeA, src: shopPod, act: Forward},
		{name: "second search domain is kube-dns's", qname: "web.mesh.svc.corp.example.", qtype: dns.TypeA, src: shopPod, act: Forward},
	} {
		t.Run(tc.name, func(t *testing.T) { runCase(t, idx, tc) })
	}
}

func runCase(t *testing.T, idx *Index, tc dnsCase) {
	t.Helper()
	req := new(dns.Msg)
	req.SetQuestion(tc.qname, tc.qtype)
	req.RecursionDesired = false
	req.Id = 4242
	if tc.edit != nil {
		tc.edit(req)
	}
	wire, rcode, act := idx.Respond(nil, req, tc.src, dns.MinMsgSize)
	if act != tc.act {
		t.Fatalf("action = %v, want %v", act, tc.act)
	}
	if act != Answered {
		return
	}
	if rcode != tc.rcode {
		t.Errorf("returned rcode = %s, want %s", dns.RcodeToString[rcode], dns.RcodeToString[tc.rcode])
	}
	m := new(dns.Msg)
	if err := m.Unpack(wire); err != nil {
		t.Fatalf("unpack answer: %v\n% x", err, wire)
	}
	if m.Id != req.Id || !m.Response || m.Opcode != req.Opcode {
		t.Errorf("header id=%d qr=%v opcode=%d, want id=%d qr=true opcode=%d", m.Id, m.Response, m.Opcode, req.Id, req.Opcode)
	}
	if m.Rcode != tc.rcode {
		t.Errorf("rcode = %s, want %s", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode])
	}
	if m.Authoritative == tc.noAA {
		t.Errorf("AA = %v, want %v", m.Authoritative, !tc.noAA)
	}
	if len(req.Question) == 1 && (len(m.Question) != 1 || m.Question[0] != req.Question[0]) {
		t.Errorf("question = %v, want %v", m.Question, req.Question)
	}
	if got := rrStrings(m.Answer); !slices.Equal(got, tc.answer) {
		t.Errorf("answer:\n got %q\nwant %q", got, tc.answer)
	}
	if got := rrStrings(m.Ns); !slices.Equal(got, tc.ns) {
		t.Errorf("authority:\n got %q\nwant %q", got, tc.ns)
	}
	extra := slices.DeleteFunc(slices.Clone(m.Extra), func(r dns.RR) bool { return r.Header().Rrtype == dns.TypeOPT })
	if got := rrStrings(extra); !slices.Equal(got, tc.extra) {
		t.Errorf("additional:\n got %q\nwant %q", got, tc.extra)
	}
	if tc.check != nil {
		tc.check(t, m)
	}
}

func rrStrings(rrs []dns.RR) []string {
	var out []string
	for _, r := range rrs {
		out = append(out, r.String())
	}
	return out
}

// TestRespondTruncates: an authoritative answer longer than the client's UDP size is cut at a
// record boundary with TC set (RFC 2181 section 9); the same query over TCP gets every record.
func TestRespondTruncates(t *testing.T) {
	var vips []netip.Addr
	for i := range 60 {
		vips = append(vips, netip.AddrFrom4([4]byte{10, 96, 2, byte(i)}))
	}
	m := model.New(1, "c1", "", "", model.Node{}, []*model.Service{
		{Key: model.ServiceKey{Namespace: "big", Name: "many"}, Local: true, VIPs: vips},
	}, nil, nil)
	idx, err := NewIndex(m, IndexOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		edns    uint16
		maxSize int
		wantTC  bool
	}{
		{name: "UDP without EDNS", maxSize: 512, wantTC: true},
		{name: "UDP with EDNS 1232", edns: 1232, maxSize: 1232},
		{name: "UDP with EDNS 600", edns: 600, maxSize: 600, wantTC: true},
		{name: "TCP", maxSize: dns.MaxMsgSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := new(dns.Msg)
			req.SetQuestion("many.big.mesh.", dns.TypeA)
			if tc.edns != 0 {
				req.SetEdns0(tc.edns, false)
			}
			if tc.maxSize != dns.MaxMsgSize && MaxUDPSize(req) != tc.maxSize {
				t.Fatalf("MaxUDPSize = %d, want %d", MaxUDPSize(req), tc.maxSize)
			}
			wire, _, _ := idx.Respond(nil, req, netip.Addr{}, tc.maxSize)
			if len(wire) > tc.maxSize {
				t.Errorf("answer is %d bytes, limit %d", len(wire), tc.maxSize)
			}
			resp := new(dns.Msg)
			if err := resp.Unpack(wire); err != nil {
				t.Fatal(err)
			}
			if resp.Truncated != tc.wantTC {
				t.Errorf("TC = %v, want %v", resp.Truncated, tc.wantTC)
			}
			if !tc.wantTC && len(resp.Answer) != 60 {
				t.Errorf("got %d records, want 60", len(resp.Answer))
			}
			if tc.wantTC && len(resp.Answer) >= 60 {
				t.Errorf("truncated answer has all %d records", len(resp.Answer))
			}
			if (tc.edns != 0) != (resp.IsEdns0() != nil) {
				t.Errorf("OPT presence = %v, want %v", resp.IsEdns0() != nil, tc.edns != 0)
			}
		})
	}
}

// TestRespondTruncatesAdditional: an SRV answer (28 pods) whose records fit but whose targets' addresses
// (the additional section) do not is sent without the additional records and without TC (RFC
// 2181 section 9: TC is not set for additional section processing), so the client does not
// retry over TCP; when the SRV records themselves do not fit, TC is set.
func TestRespondTruncatesAdditional(t *testing.T) {
	db := model.ServiceKey{Namespace: "big", Name: "db"}
	var eps []model.Endpoint
	for i := range 28 {
		eps = append(eps, model.Endpoint{Service: db, Cluster: "c1", PodUID: fmt.Sprint(i), PodName: fmt.Sprintf("db-%d", i), Healthy: true,
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 3, byte(i)})}, Ports: []model.EndpointPort{{Name: "pg", Port: 5432}}})
	}
	m := model.New(1, "c1", "", "", model.Node{}, []*model.Service{{Key: db, Local: true, Headless: true,
		Ports: []model.ServicePort{{Name: "pg", Port: 5432, TargetPort: 5432, Protocol: model.ProtocolTCP}}}},
		map[model.ServiceKey][]model.Endpoint{db: eps}, nil)
	idx, err := NewIndex(m, IndexOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		edns          uint16
		maxSize       int
		wantTC        bool
		answer, extra int
	}{
		{name: "every record fits (TCP)", maxSize: dns.MaxMsgSize, answer: 28, extra: 28},
		{name: "SRV records fit, addresses do not (EDNS 1232)", edns: 1232, maxSize: 1232, answer: 28},
		{name: "SRV records do not fit (512)", maxSize: 512, wantTC: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := new(dns.Msg)
			req.SetQuestion("_pg._tcp.db.big.mesh.", dns.TypeSRV)
			if tc.edns != 0 {
				req.SetEdns0(tc.edns, false)
			}
			wire, _, _ := idx.Respond(nil, req, netip.Addr{}, tc.maxSize)
			resp := new(dns.Msg)
			if err := resp.Unpack(wire); err != nil {
				t.Fatal(err)
			}
			if len(wire) > tc.maxSize {
				t.Errorf("answer is %d bytes, limit %d", len(wire), tc.maxSize)
			}
			extra := slices.DeleteFunc(slices.Clone(resp.Extra), func(r dns.RR) bool { return r.Header().Rrtype == dns.TypeOPT })
			if resp.Truncated != tc.wantTC || (!tc.wantTC && (len(resp.Answer) != tc.answer || len(extra) != tc.extra)) {
				t.Errorf("TC %v, %d SRV and %d address records; want TC %v, %d and %d", resp.Truncated, len(resp.Answer), len(extra), tc.wantTC, tc.answer, tc.extra)
			}
			if (tc.edns != 0) != (resp.IsEdns0() != nil) {
				t.Errorf("OPT presence = %v, want %v", resp.IsEdns0() != nil, tc.edns != 0)
			}
		})
	}
}

// TestNewIndexUpdateIsIndependent: a new index reflects the new model; the old one is unchanged.
func TestNewIndexUpdateIsIndependent(t *testing.T) {
	r, err := NewResolver(nil, ResolverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Update(testMesh()); err != nil {
		t.Fatal(err)
	}
	old := r.Index()
	m2 := model.New(8, "c1", "", "", model.Node{}, []*model.Service{
		{Key: model.ServiceKey{Namespace: "default", Name: "web"}, Local: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.9.9")}},
	}, nil, nil)
	if err := r.Update(m2); err != nil {
		t.Fatal(err)
	}
	runCase(t, r.Index(), dnsCase{qname: "web.mesh.", qtype: dns.TypeA, answer: []string{rr("web.mesh.", "A", "10.96.9.9")}})
	runCase(t, r.Index(), dnsCase{qname: "cart.mesh.", qtype: dns.TypeA, rcode: dns.RcodeNameError,
		ns: []string{strings.Replace(meshSOA(), " 7 ", " 8 ", 1)}})
	runCase(t, old, dnsCase{qname: "web.mesh.", qtype: dns.TypeA, answer: []string{rr("web.mesh.", "A", "10.96.0.20")}})
}

func TestNewIndexRejectsBadNames(t *testing.T) {
	m := model.New(1, "c1", "bad..domain", "", model.Node{}, nil, nil, nil)
	if _, err := NewIndex(m, IndexOptions{}); err == nil || !strings.Contains(err.Error(), "bad..domain") {
		t.Errorf("NewIndex(mesh domain bad..domain) error = %v, want one naming the domain", err)
	}
	m = model.New(1, "c1", "", "", model.Node{}, []*model.Service{
		{Key: model.ServiceKey{Namespace: "ns", Name: "a b"}, Local: true},
	}, nil, nil)
	_, err := NewIndex(m, IndexOptions{})
	if err == nil || !strings.Contains(err.Error(), "ns/a b") {
		t.Errorf("NewIndex(service \"a b\") error = %v, want one naming the service", err)
	}
}

// TestNewIndexSkipsPodNamesTooLong: a headless Service's per-pod name that would pass 253 bytes
// is left out; the index still builds and the Service's own name answers.
func TestNewIndexSkipsPodNamesTooLong(t *testing.T) {
	l40 := strings.Repeat("a", 40)
	domain := strings.Join([]string{l40, l40, l40, l40}, ".") // 163 bytes
	k := model.ServiceKey{Namespace: strings.Repeat("n", 40), Name: strings.Repeat("s", 40)}
	ip := netip.MustParseAddr("10.244.0.9")
	m := model.New(1, "c1", domain, "", model.Node{}, []*model.Service{{Key: k, Local: true, Headless: true}},
		map[model.ServiceKey][]model.Endpoint{k: {{Service: k, Cluster: "c1", PodName: strings.Repeat("p", 40), IPs: []netip.Addr{ip}, Healthy: true}}}, nil)
	idx, err := NewIndex(m, IndexOptions{})
	if err != nil {
		t.Fatalf("NewIndex: %v", err)
	}
	svc := dns.CanonicalName(m.FQDN(k))
	runCase(t, idx, dnsCase{name: "service", qname: svc, qtype: dns.TypeA, answer: []string{rr(svc, "A", "10.244.0.9")}})
	if n := idx.names[strings.Repeat("p", 40)+"."+svc]; n != nil {
		t.Errorf("per-pod name of %d bytes is in the index", len(strings.Repeat("p", 40)+"."+svc))
	}
}

func TestValidName(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"web.mesh.", true},
		{"_http._tcp.web.mesh.", true},
		{"a-1.b2.", true},
		{long + ".mesh.", true},
		{long + "a.mesh.", false}, // a 64-byte label
		{strings.Repeat(long+".", 3) + strings.Repeat("a", 61) + ".", true}, // 254 bytes with the root
		{strings.Repeat(long+".", 3) + strings.Repeat("a", 62) + ".", false},
		{"web.mesh", false}, // not fully qualified
		{"web..mesh.", false},
		{".mesh.", false},
		{"Web.mesh.", false}, // index names are lower case
		{"we b.mesh.", false},
		{"web*.mesh.", false},
		{".", false},
	} {
		if got := validName(tc.name); got != tc.want {
			t.Errorf("validName(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestIndexAnswersPreparedOnceUnderConcurrency: a name's answers are prepared when first asked;
// many lookups racing on a fresh index all get the same, complete answer (run with -race).
func TestIndexAnswersPreparedOnceUnderConcurrency(t *testing.T) {
	idx, err := NewIndex(testMesh(), IndexOptions{})
	if err != nil {
		t.Fatal(err)
	}
	req := new(dns.Msg)
	req.SetQuestion("_pg._tcp.db.default.mesh.", dns.TypeSRV)
	want, _, _ := func() ([]byte, int, Action) {
		fresh, err := NewIndex(testMesh(), IndexOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return fresh.Respond(nil, req, netip.Addr{}, dns.MaxMsgSize)
	}()
	const n = 16
	got := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], _, _ = idx.Respond(nil, req, netip.Addr{}, dns.MaxMsgSize) })
	}
	wg.Wait()
	for i, g := range got {
		if !slices.Equal(g, want) {
			t.Fatalf("lookup %d got a different answer:\n% x\nwant\n% x", i, g, want)
		}
	}
	m := new(dns.Msg)
	if err := m.Unpack(want); err != nil || len(m.Answer) != 3 || len(m.Extra) != 3 {
		t.Fatalf("answer %v (err %v), want 3 SRV records and 3 address records", m, err)
	}
}

// TestTruncateKeepsUpstreamTC: truncate clears TC only when it set it itself for additional
// records that did not fit (RFC 2181 section 9); a TC bit the message already carried (an
// upstream's truncated answer, passed on as is) stays set, whatever truncate drops.
func TestTruncateKeepsUpstreamTC(t *testing.T) {
	for _, tc := range []struct {
		name    string
		preset  bool
		wantTC  bool
		wantAdd int
	}{
		{name: "additional dropped, no TC before", preset: false, wantTC: false},
		// The additional records that fit stay (miekg/dns's cut): the client retries over
		// TCP anyway.
		{name: "additional cut, TC from the upstream", preset: true, wantTC: true, wantAdd: 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion("_pg._tcp.db.example.", dns.TypeSRV)
			m.Response, m.Truncated = true, tc.preset
			for i := range 20 {
				target := fmt.Sprintf("db-%02d.db.example.", i)
				m.Answer = append(m.Answer, &dns.SRV{Hdr: dns.RR_Header{Name: "_pg._tcp.db.example.", Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 5},
					Priority: 0, Weight: 100, Port: 5432, Target: target})
				m.Extra = append(m.Extra, &dns.AAAA{Hdr: dns.RR_Header{Name: target, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 5},
					AAAA: netip.AddrFrom16([16]byte{0xfd, 15: byte(i)}).AsSlice()})
			}
			m.Compress = true
			truncate(m, 1232)
			if m.Len() > 1232 {
				t.Fatalf("truncated message is %d bytes, limit 1232", m.Len())
			}
			if len(m.Answer) != 20 {
				t.Fatalf("%d answer records, want all 20 (they fit)", len(m.Answer))
			}
			if m.Truncated != tc.wantTC || len(m.Extra) != tc.wantAdd {
				t.Errorf("TC %v with %d additional records; want TC %v with %d", m.Truncated, len(m.Extra), tc.wantTC, tc.wantAdd)
			}
		})
	}
}
