package dnsd

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

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
type nameAnswers struct {
	a, aaaa, any, soa, other prepared
	expA, expAAAA, expAny    prepared
	expOther                 prepared
	expandable               bool
}

// prepared is an authoritative answer without header and question: the packed answer and
// authority sections, whose compression pointers refer only to the question name at offset 12.
type prepared struct {
	rcode  int
	an, ns uint16
	body   []byte
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
		names:        map[string]*nameAnswers{},
		ents:         map[string]*zone{},
		podNamespace: map[netip.Addr]string{},
	}
	serial := uint32(m.Version)
	idx.mesh = newZone(idx.meshZone, serial, o.NegativeTTL)
	idx.cs = newZone(idx.csZone, serial, o.NegativeTTL)
	idx.names[idx.meshZone] = apexAnswers(&idx.mesh)
	idx.names[idx.csZone] = apexAnswers(&idx.cs)

	add := func(name string, z *zone, vips []netip.Addr) error {
		fqdn := dns.CanonicalName(name)
		if !validName(fqdn) {
			return fmt.Errorf("build dns index: name %q is not a domain name", name)
		}
		if _, dup := idx.names[fqdn]; dup {
			return nil
		}
		idx.names[fqdn] = newNameAnswers(fqdn, z, vips, o.TTL)
		// Every ancestor up to the apex is an empty non-terminal (unless it is a name itself,
		// which the names map answers first).
		for p := parent(fqdn); p != "" && p != z.apex && len(p) > len(z.apex); p = parent(p) {
			idx.ents[p] = z
		}
		return nil
	}
	for _, s := range m.Services {
		vips := s.VIPs
		switch {
		case !s.Local:
			vips = s.ClustersetVIPs
		case s.Headless:
			vips = headlessAddrs(m, s.Key)
		}
		if s.Local || s.Imported {
			if err := add(m.FQDN(s.Key), &idx.mesh, vips); err != nil {
				return nil, fmt.Errorf("service %s: %w", s.Key, err)
			}
			if s.Local && s.Headless {
				// <pod>.<svc>.<ns>.<meshDomain>: each ready pod's own addresses, as kube-dns's
				// <hostname>.<svc>.<ns>.svc.<zone> for a StatefulSet's pods. A pod name that is
				// not one DNS label (it may hold dots), or that makes the name too long, gets none.
				for _, e := range readyHere(m, s.Key) {
					name := e.PodName + "." + m.FQDN(s.Key)
					if strings.Contains(e.PodName, ".") || !validName(dns.CanonicalName(name)) {
						continue
					}
					if err := add(name, &idx.mesh, meshAddr(e)); err != nil {
						return nil, fmt.Errorf("service %s: %w", s.Key, err)
					}
				}
			}
			if short := m.ShortName(s.Key); short != "" {
				if err := add(short, &idx.mesh, vips); err != nil {
					return nil, fmt.Errorf("service %s: %w", s.Key, err)
				}
			}
		}
		if s.Imported {
			if err := add(model.ClustersetName(s.Key), &idx.cs, s.ClustersetVIPs); err != nil {
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

// headlessAddrs returns the addresses a headless Service's mesh name answers: the address the
// mesh carries (meshAddr) of each of its ready endpoints in this cluster (readyHere), sorted,
// each once. This is what kube-dns answers
// for a headless Service (Kubernetes DNS specification 2.4.1, ready endpoints only).
func headlessAddrs(m *model.Mesh, k model.ServiceKey) []netip.Addr {
	var out []netip.Addr
	for _, e := range readyHere(m, k) {
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
	for _, l := range strings.Split(fqdn[:len(fqdn)-1], ".") {
		if len(l) == 0 || len(l) > 63 {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
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
		nodata:   mustPrepare(dns.RcodeSuccess, nil, []dns.RR{soa}),
		nxdomain: mustPrepare(dns.RcodeNameError, nil, []dns.RR{soa}),
	}
}

// apexAnswers answers the zone apex: its SOA for SOA queries, NODATA otherwise. The apex is not
// expandable through the search list.
func apexAnswers(z *zone) *nameAnswers {
	soa := dns.Copy(z.soa)
	soa.Header().Name = "." // the question name (see mustPrepare)
	a := &nameAnswers{a: z.nodata, aaaa: z.nodata, any: z.nodata, other: z.nodata}
	a.soa = mustPrepare(dns.RcodeSuccess, []dns.RR{soa}, nil)
	a.any = a.soa
	return a
}

// newNameAnswers prepares every answer of an existing name with the given VIPs.
func newNameAnswers(fqdn string, z *zone, vips []netip.Addr, ttl uint32) *nameAnswers {
	var a4, a6 []dns.RR
	for _, ip := range vips {
		hdr := dns.RR_Header{Name: ".", Class: dns.ClassINET, Ttl: ttl}
		if ip.Is4() || ip.Is4In6() {
			hdr.Rrtype = dns.TypeA
			a4 = append(a4, &dns.A{Hdr: hdr, A: ip.Unmap().AsSlice()})
		} else {
			hdr.Rrtype = dns.TypeAAAA
			a6 = append(a6, &dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
		}
	}
	soa := z.nodata
	n := &nameAnswers{expandable: true, other: soa, soa: soa}
	n.a = answerOrNodata(a4, z)
	n.aaaa = answerOrNodata(a6, z)
	n.any = answerOrNodata(append(append([]dns.RR(nil), a4...), a6...), z)

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
	soaRRs := []dns.RR{z.soa}
	expansion := func(rrs []dns.RR) prepared {
		if len(rrs) == 0 {
			return mustPrepare(dns.RcodeSuccess, own(nil), soaRRs)
		}
		return mustPrepare(dns.RcodeSuccess, own(rrs), nil)
	}
	n.expA = expansion(a4)
	n.expAAAA = expansion(a6)
	n.expAny = expansion(append(append([]dns.RR(nil), a4...), a6...))
	n.expOther = expansion(nil)
	return n
}

func answerOrNodata(rrs []dns.RR, z *zone) prepared {
	if len(rrs) == 0 {
		return z.nodata
	}
	return mustPrepare(dns.RcodeSuccess, rrs, nil)
}

// mustPrepare packs answer and authority records. A record whose owner is "." is owned by the
// question name: its owner is written as a compression pointer to offset 12 (RFC 1035 section
// 4.1.4), so the answer keeps the case the client asked with. Every other name is written in
// full, so the body does not depend on the question. It panics on a record that does not pack,
// which only a bug in this package can produce.
func mustPrepare(rcode int, answer, authority []dns.RR) prepared {
	p := prepared{rcode: rcode, an: uint16(len(answer)), ns: uint16(len(authority))}
	buf := make([]byte, 0, 512)
	for _, rr := range append(append([]dns.RR(nil), answer...), authority...) {
		tmp := make([]byte, dns.Len(rr)+2)
		n, err := dns.PackRR(rr, tmp, 0, nil, false)
		if err != nil {
			panic(fmt.Sprintf("dnsd: pack %s: %v", rr, err))
		}
		tmp = tmp[:n]
		if rr.Header().Name == "." {
			buf = append(buf, 0xC0, 12)
			buf = append(buf, tmp[1:]...)
		} else {
			buf = append(buf, tmp...)
		}
	}
	p.body = buf
	return p
}
