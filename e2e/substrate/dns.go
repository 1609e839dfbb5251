package substrate

import (
	"net"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
)

// dnsTTL is the TTL of every stub answer, in seconds (kube-dns's default 30 s would only slow
// tests down after a change).
const dnsTTL = 5

// clusterView is what the stub kube-dns needs from a cluster: a Service by namespace and name,
// and the IPs of the ready pods a headless Service selects.
type clusterView interface {
	service(ns, name string) (*corev1.Service, bool)
	selectedPodIPs(ns string, selector map[string]string) []netip.Addr
}

// lookupCluster resolves a lower-case, fully qualified name the way kube-dns does for the records
// the substrate needs (Kubernetes DNS spec v1.1.0, section 2.3): <svc>.<ns>.svc.<zone> is the
// Service's ClusterIP, or its ready pods' IPs when it is headless; <a-b-c-d>.<ns>.pod.<zone> is
// that IPv4 address; static names come first. ok is false for names that do not exist; the
// zone apex, svc.<zone>, pod.<zone> and <ns>.svc.<zone> exist without addresses (empty
// non-terminals).
func lookupCluster(name, zone string, v clusterView, static map[string][]netip.Addr) (addrs []netip.Addr, ok bool) {
	if a, ok := static[name]; ok {
		return a, true
	}
	if name == zone {
		return nil, true
	}
	rel, found := strings.CutSuffix(name, "."+zone)
	if !found {
		return nil, false
	}
	labels := strings.Split(rel, ".")
	switch {
	case len(labels) == 1 && (labels[0] == "svc" || labels[0] == "pod"):
		return nil, true
	case len(labels) == 2 && (labels[1] == "svc" || labels[1] == "pod"):
		return nil, true
	case len(labels) == 3 && labels[2] == "svc":
		svc, ok := v.service(labels[1], labels[0])
		if !ok {
			return nil, false
		}
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			return v.selectedPodIPs(svc.Namespace, svc.Spec.Selector), true
		}
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil {
			return nil, true
		}
		return []netip.Addr{ip}, true
	case len(labels) == 3 && labels[2] == "pod":
		ip, err := netip.ParseAddr(strings.ReplaceAll(labels[0], "-", "."))
		if err != nil || !ip.Is4() {
			return nil, false
		}
		return []netip.Addr{ip}, true
	}
	return nil, false
}

// stubDNS is the per-cluster kube-dns stand-in: authoritative for the cluster zone, NXDOMAIN for
// everything else, so no query is ever forwarded off the machine.
type stubDNS struct {
	zone   string // fully qualified, lower case: "cluster.local."
	lookup func(name string) ([]netip.Addr, bool)
}

// answer builds the reply to req (pure): A records for existing names, NODATA with the zone's SOA
// for other types and for empty non-terminals (RFC 2308 section 2.2), NXDOMAIN with the SOA for
// unknown names in the zone (RFC 2308 section 2.1), and NXDOMAIN without authority outside it.
func (s *stubDNS) answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if !dns.IsSubDomain(s.zone, name) {
		m.Rcode = dns.RcodeNameError
		return m
	}
	m.Authoritative = true
	addrs, ok := s.lookup(name)
	if !ok {
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{s.soa()}
		return m
	}
	if q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY {
		for _, a := range addrs {
			if a.Is4() {
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
					A:   net.IP(a.AsSlice()),
				})
			}
		}
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{s.soa()}
	}
	return m
}

func (s *stubDNS) soa() dns.RR {
	return &dns.SOA{
		Hdr:     dns.RR_Header{Name: s.zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: dnsTTL},
		Ns:      "ns.dns." + s.zone,
		Mbox:    "hostmaster." + s.zone,
		Serial:  1,
		Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: dnsTTL,
	}
}

// ServeDNS implements dns.Handler.
func (s *stubDNS) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := s.answer(req)
	if _, isUDP := w.RemoteAddr().(*net.UDPAddr); isUDP {
		size := 512
		if o := req.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		m.Truncate(size)
	}
	_ = w.WriteMsg(m)
}
