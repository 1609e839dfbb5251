package dnsd

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/miekg/dns"

	"github.com/aethermesh/aether/model"
)

// Defaults for IndexOptions.
const (
	// DefaultTTL is the TTL, in seconds, of the A and AAAA records of mesh names (the same as
	// CoreDNS's kubernetes plugin, so a VIP change reaches clients as fast as kube-dns's would).
	DefaultTTL = 5
	// DefaultNegativeTTL is the SOA MINIMUM and SOA TTL, in seconds, and so the time a resolver
	// may cache NXDOMAIN and NODATA answers (RFC 2308 section 5: the lesser of the two).
	DefaultNegativeTTL = 5
	// DefaultClusterDomain is the Kubernetes cluster domain whose search-list expansions
	// (<name>.<ns>.svc.<clusterDomain>) the resolver answers for mesh names.
	DefaultClusterDomain = "cluster.local"
)

// IndexOptions tune NewIndex. The zero value uses the defaults above.
type IndexOptions struct {
	// TTL is the TTL of address records, seconds (0: DefaultTTL).
	TTL uint32
	// NegativeTTL is the SOA TTL and MINIMUM, seconds (0: DefaultNegativeTTL).
	NegativeTTL uint32
	// ClusterDomain is the cluster domain of the pods' search list ("": DefaultClusterDomain).
	ClusterDomain string
}

// Index is an immutable view of one mesh model, built for lookups: every authoritative answer
// is prepared in wire form when the index is built, so answering a query is a map lookup and a
// copy. Build one with NewIndex; never change it afterwards (the resolver swaps whole indexes).
type Index struct {
	// Version is the mesh model version the index was built from.
	Version uint64

	meshZone string // "mesh." lower-case FQDN
	csZone   string // "svc.clusterset.local."
	csuffix  string // ".svc.cluster.local."

	mesh zone
	cs   zone

	// names maps a lower-case FQDN (mesh names, clusterset names, zone apexes) to its answers.
	names map[string]*nameAnswers
	// ents holds the empty non-terminals of both zones (RFC 8020: NODATA, never NXDOMAIN).
	ents map[string]*zone
	// podNamespace maps a local pod's address to its namespace, for search-list expansions.
	podNamespace map[netip.Addr]string
}

// zone holds the prepared negative answers of one authoritative zone.
type zone struct {
	apex     string
	soa      *dns.SOA
	nodata   prepared
	nxdomain prepared
}

// nameAnswers are the prepared answers of one existing name, by query type; expansion* answer
// the same name reached through a search-list expansion (a CNAME to the name, then its records).
// A name's answers are prepared when it is first asked (answers, from in), not when the index is
// built: the index is rebuilt on every model change, and most names are not asked between two.
type nameAnswers struct {
	once                          sync.Once
	in                            nameInput // cleared once prepared
	a, aaaa, srv, any, soa, other prepared
	expA, expAAAA, expSRV, expAny prepared
	expOther                      prepared
	expandable                    bool
}

// nameInput is what a name's answers are prepared from.
type nameInput struct {
	fqdn string
	z    *zone
	vips []netip.Addr
	srvs []srvRecord
	ttl  uint32
}

// prepared is an authoritative answer without header and question: the packed answer,
// authority and additional sections, whose compression pointers refer only to the question name
// at offset 12. An OPT record, when the query had one, is written after body (ar counts the
// additional records in body only).
type prepared struct {
	rcode      int
	an, ns, ar uint16
	body       []byte
}

// NewIndex builds the lookup index for m. It returns an error naming the service when a
// service's name does not make a valid DNS name (it never happens for valid Kubernetes names,
// but the model is input).
func NewIndex(m *model.Mesh, o IndexOptions) (*Index, error) {
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.NegativeTTL == 0 {
		o.NegativeTTL = DefaultNegativeTTL
	}
	if o.ClusterDomain == "" {
		o.ClusterDomain = DefaultClusterDomain
	}
	meshDomain := m.MeshDomain
	if meshDomain == "" {
		meshDomain = model.DefaultMeshDomain
	}
	meshZone := dns.CanonicalName(meshDomain)
	if !validName(meshZone) {
		return nil, fmt.Errorf("build dns index: mesh domain %q is not a domain name", meshDomain)
	}
	idx := &Index{
		Version:      m.Version,
		meshZone:     meshZone,
		csZone:       dns.CanonicalName(model.ClustersetDomain),
		csuffix:      ".svc." + dns.CanonicalName(o.ClusterDomain),
		names:        make(map[string]*nameAnswers, 2*len(m.Services)),
		ents:         map[string]*zone{},
		podNamespace: map[netip.Addr]string{},
	}
	serial := uint32(m.Version)
	idx.mesh = newZone(idx.meshZone, serial, o.NegativeTTL)
	idx.cs = newZone(idx.csZone, serial, o.NegativeTTL)
	idx.names[idx.meshZone] = apexAnswers(&idx.mesh)
	idx.names[idx.csZone] = apexAnswers(&idx.cs)

	// add adds name with its address records and SRV records (srvs, owned by the name; each
	// port's also under _<port>._<proto>.<name>), and marks its ancestors as empty non-terminals.
	add := func(name string, z *zone, vips []netip.Addr, srvs []srvRecord) error {
		fqdn := dns.CanonicalName(name)
		if !validName(fqdn) {
			return fmt.Errorf("build dns index: name %q is not a domain name", name)
		}
		if _, dup := idx.names[fqdn]; dup {
			return nil
		}
		idx.names[fqdn] = newNameAnswers(fqdn, z, vips, srvs, o.TTL)
		// Every ancestor up to the apex is an empty non-terminal (unless it is a name itself,
		// which the names map answers first).
		for p := parent(fqdn); p != "" && p != z.apex && len(p) > len(z.apex); p = parent(p) {
			idx.ents[p] = z
		}
		for _, label := range srvLabels(srvs) {
			owner := label + fqdn
			if !validName(owner) {
				continue // a port name no Kubernetes API server accepts, or a name too long
			}
			idx.names[owner] = newNameAnswers(owner, z, nil, srvsOf(srvs, label), o.TTL)
			idx.ents[parent(owner)] = z
		}
		return nil
	}
	for _, s := range m.Services {
		vips := s.VIPs
		var ready []model.Endpoint // a local headless Service's ready endpoints here
		switch {
		case !s.Local:
			vips = s.ClustersetVIPs
		case s.Headless:
			ready = readyHere(m, s.Key)
			vips = headlessAddrs(ready)
		}
		if s.Local || s.Imported {
			fqdn := dns.CanonicalName(m.FQDN(s.Key))
			var srvs []srvRecord
			if s.Local && s.Headless {
				srvs = headlessSRV(s, ready, m.Cluster, fqdn)
			} else {
				srvs = vipSRV(s.Ports, fqdn, vips)
			}
			if err := add(fqdn, &idx.mesh, vips, srvs); err != nil {
				return nil, fmt.Errorf("service %s: %w", s.Key, err)
			}
			if s.Local && s.Headless {
				// <pod>.<svc>.<ns>.<meshDomain>: each ready pod's own addresses, as kube-dns's
				// <hostname>.<svc>.<ns>.svc.<zone> for a StatefulSet's pods. A pod name that is
				// not one DNS label (it may hold dots), or that makes the name too long, gets none.
				for _, e := range ready {
					name, ok := podName(e, fqdn)
					if !ok {
						continue
					}
					if err := add(name, &idx.mesh, meshAddr(e), nil); err != nil {
						return nil, fmt.Errorf("service %s: %w", s.Key, err)
					}
				}
			}
			if short := m.ShortName(s.Key); short != "" {
				if !s.Headless {
					// The short name's SRV records point at the short name (the headless ones
					// at the pods' names, which exist only under the namespaced name).
					srvs = vipSRV(s.Ports, dns.CanonicalName(short), vips)
				}
				if err := add(short, &idx.mesh, vips, srvs); err != nil {
					return nil, fmt.Errorf("service %s: %w", s.Key, err)
				}
			}
		}
		if s.Imported {
			cs := dns.CanonicalName(model.ClustersetName(s.Key))
			if err := add(cs, &idx.cs, s.ClustersetVIPs, vipSRV(s.Ports, cs, s.ClustersetVIPs)); err != nil {
				return nil, fmt.Errorf("service %s: %w", s.Key, err)
			}
		}
	}
	for _, p := range m.Pods {
		for _, ip := range p.IPs {
			idx.podNamespace[ip.Unmap()] = strings.ToLower(p.Namespace)
		}
	}
	return idx, nil
}

// srvRecord is one SRV record of a service name: the port's owner label ("_<port>._<proto>.",
// empty for an unnamed port, which has no owner of its own), the port, the target FQDN and the
// target's addresses (the additional section).
type srvRecord struct {
	label  string
	port   uint32
	target string
	addrs  []netip.Addr
}

// srvLabel returns the owner label of a named Service port's SRV records, "_<name>._<proto>."
// (Kubernetes DNS specification 2.4.1: TCP or UDP; every mesh protocol but UDP runs over TCP),
// or "" for an unnamed port.
func srvLabel(sp model.ServicePort) string {
	if sp.Name == "" {
		return ""
	}
	proto := "_tcp."
	if sp.Protocol == model.ProtocolUDP {
		proto = "_udp."
	}
	return "_" + strings.ToLower(sp.Name) + "." + proto
}

// vipSRV returns the SRV records of a service reached through a VIP (local or clusterset): one
// per port, the Service port on target, the name itself (Kubernetes DNS specification 2.4.1 and
// the MCS DNS specification for clusterset names); none while the service has no VIP.
func vipSRV(ports []model.ServicePort, target string, vips []netip.Addr) []srvRecord {
	if len(vips) == 0 {
		// No VIP yet (an import waiting for its clusterset VIP, a Service without ClusterIP):
		// an SRV target must have addresses (RFC 2782).
		return nil
	}
	var out []srvRecord
	for _, sp := range ports {
		out = append(out, srvRecord{label: srvLabel(sp), port: sp.Port, target: target, addrs: vips})
	}
	return out
}

// headlessSRV returns the SRV records of a local headless Service s (fqdn its namespaced name)
// whose ready endpoints in cluster are ready (readyHere): per port, one per pod with a name
// (podName) that serves the port, on the pod's own target port, pointing at the pod's name
// (Kubernetes DNS specification 2.4.1, records for a headless Service), in ready's order.
func headlessSRV(s *model.Service, ready []model.Endpoint, cluster, fqdn string) []srvRecord {
	var out []srvRecord
	for _, sp := range s.Ports {
		for i := range ready {
			name, ok := podName(ready[i], fqdn)
			if !ok || len(meshAddr(ready[i])) == 0 {
				continue
			}
			if ep, ok := sp.EndpointPort(&ready[i], cluster); ok {
				out = append(out, srvRecord{label: srvLabel(sp), port: ep.Port, target: name, addrs: meshAddr(ready[i])})
			}
		}
	}
	return out
}

// podName returns the name of endpoint e of the headless service named fqdn,
// "<pod>.<fqdn>", or false when the pod name is not one DNS label or the name is too long.
func podName(e model.Endpoint, fqdn string) (string, bool) {
	name := dns.CanonicalName(e.PodName + "." + fqdn)
	if strings.Contains(e.PodName, ".") || !validName(name) {
		return "", false
	}
	return name, true
}

// srvLabels returns the distinct non-empty labels of srvs, in order.
func srvLabels(srvs []srvRecord) []string {
	var out []string
	for _, r := range srvs {
		if r.label != "" && !slices.Contains(out, r.label) {
			out = append(out, r.label)
		}
	}
	return out
}

// srvsOf returns the records of srvs with label.
func srvsOf(srvs []srvRecord, label string) []srvRecord {
	var out []srvRecord
	for _, r := range srvs {
		if r.label == label {
			out = append(out, r)
		}
	}
	return out
}

// headlessAddrs returns the addresses a headless Service's mesh name answers: the address the
// mesh carries (meshAddr) of each of its ready endpoints in this cluster (ready, from
// readyHere), sorted, each once. This is what kube-dns answers for a headless Service
// (Kubernetes DNS specification 2.4.1, ready endpoints only).
func headlessAddrs(ready []model.Endpoint) []netip.Addr {
	var out []netip.Addr
	for _, e := range ready {
		out = append(out, meshAddr(e)...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// readyHere returns the ready (Healthy) endpoints of service k in this cluster; endpoints in other
// clusters are left out, as their pod IPs need not be routable from here.
func readyHere(m *model.Mesh, k model.ServiceKey) []model.Endpoint {
	var out []model.Endpoint
	for _, e := range m.Endpoints[k] {
		if e.Cluster == m.Cluster && e.Healthy {
			out = append(out, e)
		}
	}
	return out
}

// meshAddr returns the address of e that the mesh carries (model.MeshAddr: the one the pod's
// inbound mTLS listener binds), as IPv4 when IPv4-mapped; none when e has no address. A
// dual-stack pod's other address is not answered: a connection to it would be passed through
// in plaintext, which the destination's strict inbound refuses.
func meshAddr(e model.Endpoint) []netip.Addr {
	if ip, ok := model.MeshAddr(e.IPs); ok {
		return []netip.Addr{ip.Unmap()}
	}
	return nil
}

// validName reports whether lower-case FQDN is made of host-name labels (RFC 1123 section 2.1:
// letters, digits, hyphens; underscores too, as in SRV owner names), each 1 to 63 bytes, 253
// bytes in all.
func validName(fqdn string) bool {
	if len(fqdn) < 2 || len(fqdn) > 254 || fqdn[len(fqdn)-1] != '.' {
		return false
	}
	label := 0 // length of the current label
	for i := 0; i < len(fqdn); i++ {
		c := fqdn[i]
		switch {
		case c == '.':
			if label == 0 || label > 63 {
				return false
			}
			label = 0
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_':
			label++
		default:
			return false
		}
	}
	return true
}

// parent returns the FQDN without its first label ("" for the root).
func parent(fqdn string) string {
	i := strings.IndexByte(fqdn, '.')
	if i < 0 || i == len(fqdn)-1 {
		return ""
	}
	return fqdn[i+1:]
}

// soaRR returns the synthetic SOA of zone apex. RFC 2308 section 3: the SOA in a negative answer
// carries the negative TTL as its TTL and MINIMUM.
func soaRR(apex string, serial, negTTL uint32) *dns.SOA {
	return &dns.SOA{
		Hdr:     dns.RR_Header{Name: apex, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: negTTL},
		Ns:      "ns.dns." + apex,
		Mbox:    "hostmaster." + apex,
		Serial:  serial,
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  negTTL,
	}
}

func newZone(apex string, serial, negTTL uint32) zone {
	soa := soaRR(apex, serial, negTTL)
	return zone{
		apex:     apex,
		soa:      soa,
		nodata:   mustPrepare(dns.RcodeSuccess, nil, []dns.RR{soa}, nil),
		nxdomain: mustPrepare(dns.RcodeNameError, nil, []dns.RR{soa}, nil),
	}
}

// apexAnswers answers the zone apex: its SOA for SOA queries, NODATA otherwise. The apex is not
// expandable through the search list.
func apexAnswers(z *zone) *nameAnswers {
	soa := dns.Copy(z.soa)
	soa.Header().Name = "." // the question name (see mustPrepare)
	a := &nameAnswers{a: z.nodata, aaaa: z.nodata, srv: z.nodata, any: z.nodata, other: z.nodata}
	a.soa = mustPrepare(dns.RcodeSuccess, []dns.RR{soa}, nil, nil)
	a.any = a.soa
	a.once.Do(func() {}) // prepared now
	return a
}

// newNameAnswers returns the answers of an existing name with the given VIPs and SRV records,
// prepared when first asked (answers). The slices must not change afterwards.
func newNameAnswers(fqdn string, z *zone, vips []netip.Addr, srvs []srvRecord, ttl uint32) *nameAnswers {
	return &nameAnswers{expandable: true, in: nameInput{fqdn: fqdn, z: z, vips: vips, srvs: srvs, ttl: ttl}}
}

// answers returns n with every answer prepared, preparing them on the first call.
func (n *nameAnswers) answers() *nameAnswers {
	n.once.Do(n.prepare)
	return n
}

// prepare packs every answer of the name from n.in. SRV records are written as CoreDNS's
// kubernetes plugin does: priority 0, weight 100 divided among the records, the targets'
// addresses in the additional section (RFC 2782).
func (n *nameAnswers) prepare() {
	fqdn, z, vips, srvs, ttl := n.in.fqdn, n.in.z, n.in.vips, n.in.srvs, n.in.ttl
	n.in = nameInput{}
	a4, a6 := addrRRs(".", vips, ttl)
	var srvRRs, extra []dns.RR
	for _, r := range srvs {
		srvRRs = append(srvRRs, &dns.SRV{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: ttl},
			Priority: 0, Weight: uint16(100 / len(srvs)), Port: uint16(r.port), Target: r.target})
		if slices.ContainsFunc(srvs[:len(srvRRs)-1], func(o srvRecord) bool { return o.target == r.target }) {
			continue // the target's addresses are there already
		}
		t4, t6 := addrRRs(r.target, r.addrs, ttl)
		extra = append(append(extra, t4...), t6...)
	}
	n.other, n.soa = z.nodata, z.nodata
	n.a = answerOrNodata(a4, nil, z)
	n.aaaa = answerOrNodata(a6, nil, z)
	n.srv = answerOrNodata(srvRRs, extra, z)

	// Search-list expansions: CNAME from the question to the mesh name, then the mesh name's
	// records (owned by the mesh name itself) or, when it has none of that type, the SOA.
	cname := &dns.CNAME{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl}, Target: fqdn}
	own := func(rrs []dns.RR) []dns.RR {
		out := []dns.RR{cname}
		for _, rr := range rrs {
			c := dns.Copy(rr)
			c.Header().Name = fqdn
			out = append(out, c)
		}
		return out
	}
	// Answers with the same records share one prepared body: a name has about ten answers, and
	// the index is rebuilt on every model change.
	n.expOther = mustPrepare(dns.RcodeSuccess, own(nil), []dns.RR{z.soa}, nil)
	expansion := func(rrs, extra []dns.RR) prepared {
		if len(rrs) == 0 {
			return n.expOther
		}
		return mustPrepare(dns.RcodeSuccess, own(rrs), nil, extra)
	}
	n.expA = expansion(a4, nil)
	n.expAAAA = expansion(a6, nil)
	n.expSRV = expansion(srvRRs, extra)
	// ANY: the address records, or the SRV records of a name without any (RFC 8482 section 4.2
	// allows a subset).
	switch {
	case len(a4) > 0 && len(a6) > 0:
		n.any = answerOrNodata(slices.Concat(a4, a6), nil, z)
		n.expAny = expansion(slices.Concat(a4, a6), nil)
	case len(a4) > 0:
		n.any, n.expAny = n.a, n.expA
	case len(a6) > 0:
		n.any, n.expAny = n.aaaa, n.expAAAA
	default:
		n.any, n.expAny = n.srv, n.expSRV
	}
}

// addrRRs returns the A and the AAAA records of owner for addrs.
func addrRRs(owner string, addrs []netip.Addr, ttl uint32) (a4, a6 []dns.RR) {
	for _, ip := range addrs {
		hdr := dns.RR_Header{Name: owner, Class: dns.ClassINET, Ttl: ttl}
		if ip.Is4() || ip.Is4In6() {
			hdr.Rrtype = dns.TypeA
			a4 = append(a4, &dns.A{Hdr: hdr, A: ip.Unmap().AsSlice()})
		} else {
			hdr.Rrtype = dns.TypeAAAA
			a6 = append(a6, &dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
		}
	}
	return a4, a6
}

func answerOrNodata(rrs, extra []dns.RR, z *zone) prepared {
	if len(rrs) == 0 {
		return z.nodata
	}
	return mustPrepare(dns.RcodeSuccess, rrs, nil, extra)
}

// mustPrepare packs answer, authority and additional records. A record whose owner is "." is owned by the
// question name: its owner is written as a compression pointer to offset 12 (RFC 1035 section
// 4.1.4), so the answer keeps the case the client asked with. Every other name is written in
// full, so the body does not depend on the question. It panics on a record that does not pack,
// which only a bug in this package can produce.
func mustPrepare(rcode int, answer, authority, additional []dns.RR) prepared {
	p := prepared{rcode: rcode, an: uint16(len(answer)), ns: uint16(len(authority)), ar: uint16(len(additional))}
	size := 0
	for _, rrs := range [3][]dns.RR{answer, authority, additional} {
		for _, rr := range rrs {
			size += dns.Len(rr) + 1 // a "." owner (1 byte) becomes a 2-byte pointer
		}
	}
	// One allocation per body, packed in place: bodies live as long as the index, and there are
	// about ten per name.
	buf := make([]byte, size)
	off := 0
	for _, rrs := range [3][]dns.RR{answer, authority, additional} {
		for _, rr := range rrs {
			pointer := rr.Header().Name == "."
			start := off
			if pointer {
				start++ // the root owner byte lands on the pointer's second byte, overwritten below
			}
			n, err := dns.PackRR(rr, buf, start, nil, false)
			if err != nil {
				panic(fmt.Sprintf("dnsd: pack %s: %v", rr, err))
			}
			if pointer {
				buf[off], buf[off+1] = 0xC0, 12
			}
			off = n
		}
	}
	p.body = buf[:off:off]
	return p
}
