package dnsd

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// Action says what the resolver does with a query after the index has seen it.
type Action int

// The actions of Index.Respond.
const (
	// Answered: the returned wire message is the complete answer.
	Answered Action = iota
	// Forward: the name is not the resolver's; forward the query to the upstreams.
	Forward
	// ForwardClusterset: a name under svc.clusterset.local that no local ServiceImport
	// answers; forward it, and when no upstream serves it answer the NXDOMAIN that
	// Index.ClustersetNXDOMAIN returns.
	ForwardClusterset
)

// String returns the action's name, for logs and tests.
func (a Action) String() string {
	switch a {
	case Answered:
		return "answered"
	case Forward:
		return "forward"
	case ForwardClusterset:
		return "forward-clusterset"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// ednsUDPSize is the UDP payload size the resolver advertises in its own OPT records (the DNS
// flag day 2020 value, which avoids IP fragmentation).
const ednsUDPSize = 1232

// MaxUDPSize returns the largest UDP response req's sender accepts, in bytes: its EDNS0 UDP
// payload size (RFC 6891 section 6.2.3), never below 512 (RFC 1035 section 2.3.4).
func MaxUDPSize(req *dns.Msg) int {
	if opt := req.IsEdns0(); opt != nil && opt.UDPSize() > dns.MinMsgSize {
		return int(opt.UDPSize())
	}
	return dns.MinMsgSize
}

// Respond answers req, asked from src, from the index. It appends the wire response to buf
// (which it may reallocate) and returns it with Answered, or returns Forward or
// ForwardClusterset with no message when the upstreams must answer. maxSize is the largest
// response the transport carries (MaxUDPSize for UDP, dns.MaxMsgSize for TCP); a longer answer
// is truncated with TC set (RFC 2181 section 9). rcode is the response code written.
//
// Rules: a name of the index answers its A/AAAA records (NODATA with the zone's SOA in
// authority for any other type, RFC 2308 section 2.2); an empty non-terminal answers NODATA
// (RFC 8020); any other name in the mesh zone answers NXDOMAIN with the SOA (RFC 2308 section
// 2.1); <mesh name>.<ns>.svc.<clusterDomain>, where ns is the namespace of the pod at src,
// answers a CNAME to the mesh name and its records (the first search-list expansion that glibc
// and musl try with ndots=5); every answer has AA set. Malformed or unsupported queries get
// FORMERR (also for more than one OPT, RFC 6891 section 6.1.1), NOTIMP, REFUSED or BADVERS.
func (idx *Index) Respond(buf []byte, req *dns.Msg, src netip.Addr, maxSize int) (wire []byte, rcode int, act Action) {
	if req.Opcode != dns.OpcodeQuery {
		return errorReply(buf, req, dns.RcodeNotImplemented), dns.RcodeNotImplemented, Answered
	}
	if len(req.Question) != 1 || req.Response {
		return errorReply(buf, req, dns.RcodeFormatError), dns.RcodeFormatError, Answered
	}
	opt := req.IsEdns0()
	if opt != nil && countOPT(req.Extra) > 1 {
		// RFC 6891 section 6.1.1: more than one OPT is FORMERR.
		return errorReply(buf, req, dns.RcodeFormatError), dns.RcodeFormatError, Answered
	}
	if opt != nil && opt.Version() != 0 {
		// RFC 6891 section 6.1.3: an unsupported EDNS version answers BADVERS.
		return errorReply(buf, req, dns.RcodeBadVers), dns.RcodeBadVers, Answered
	}
	q := req.Question[0]
	qname := strings.ToLower(q.Name)
	p, act := idx.lookup(qname, q.Qtype, src)
	if act != Answered {
		return buf, 0, act
	}
	if q.Qclass != dns.ClassINET {
		return errorReply(buf, req, dns.RcodeRefused), dns.RcodeRefused, Answered
	}
	if q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
		// No zone transfers: the zones are synthesised from the model.
		return errorReply(buf, req, dns.RcodeRefused), dns.RcodeRefused, Answered
	}
	wire, err := appendPrepared(buf, req, q, opt, p)
	if err != nil {
		return errorReply(buf[:0], req, dns.RcodeFormatError), dns.RcodeFormatError, Answered
	}
	if len(wire) > maxSize {
		wire = truncateWire(wire[:0], wire, maxSize)
	}
	return wire, p.rcode, Answered
}

// countOPT returns the number of OPT records in rrs.
func countOPT(rrs []dns.RR) int {
	n := 0
	for _, rr := range rrs {
		if rr.Header().Rrtype == dns.TypeOPT {
			n++
		}
	}
	return n
}

// ClustersetNXDOMAIN returns the NXDOMAIN answer, with the clusterset zone's SOA, for a
// ForwardClusterset query that no upstream served.
func (idx *Index) ClustersetNXDOMAIN(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeNameError)
	m.Authoritative = true
	m.RecursionAvailable = true
	m.Ns = []dns.RR{dns.Copy(idx.cs.soa)}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(ednsUDPSize, opt.Do())
	}
	return m
}

// lookup finds the prepared answer of lower-case FQDN qname.
func (idx *Index) lookup(qname string, qtype uint16, src netip.Addr) (*prepared, Action) {
	if n := idx.names[qname]; n != nil {
		return n.pick(qtype, false), Answered
	}
	if z := idx.ents[qname]; z != nil {
		return &z.nodata, Answered
	}
	if inZone(qname, idx.meshZone) {
		return &idx.mesh.nxdomain, Answered
	}
	if inZone(qname, idx.csZone) {
		return nil, ForwardClusterset
	}
	if strings.HasSuffix(qname, idx.csuffix) && src.IsValid() {
		// <target>.<ns>.svc.<clusterDomain>. with ns the asking pod's namespace.
		ns, ok := idx.podNamespace[src.Unmap()]
		rest := qname[:len(qname)-len(idx.csuffix)]
		if ok && len(rest) > len(ns)+1 && strings.HasSuffix(rest, ns) && rest[len(rest)-len(ns)-1] == '.' {
			target := rest[:len(rest)-len(ns)]
			if n := idx.names[target]; n != nil && n.expandable {
				return n.pick(qtype, true), Answered
			}
		}
	}
	return nil, Forward
}

// inZone reports whether FQDN name is zone apex or below it.
func inZone(name, apex string) bool {
	if len(name) == len(apex) {
		return name == apex
	}
	return len(name) > len(apex) && name[len(name)-len(apex)-1] == '.' && strings.HasSuffix(name, apex)
}

func (n *nameAnswers) pick(qtype uint16, expansion bool) *prepared {
	n = n.answers()
	if expansion {
		switch qtype {
		case dns.TypeA:
			return &n.expA
		case dns.TypeAAAA:
			return &n.expAAAA
		case dns.TypeSRV:
			return &n.expSRV
		case dns.TypeANY:
			return &n.expAny
		}
		return &n.expOther
	}
	switch qtype {
	case dns.TypeA:
		return &n.a
	case dns.TypeAAAA:
		return &n.aaaa
	case dns.TypeSRV:
		return &n.srv
	case dns.TypeANY:
		return &n.any
	case dns.TypeSOA:
		return &n.soa
	}
	return &n.other
}

// appendPrepared writes header, the question as asked (same case), the prepared body and, when
// the query had one, an OPT record (RFC 6891 section 7: a responder includes OPT when the
// request did; the DO bit is copied, RFC 3225 section 3).
func appendPrepared(buf []byte, req *dns.Msg, q dns.Question, opt *dns.OPT, p *prepared) ([]byte, error) {
	need := 12 + len(q.Name) + 2 + 4 + len(p.body) + optLen
	if cap(buf) < need {
		buf = make([]byte, 0, need)
	}
	b := buf[:need]
	putHeader(b, req.Id, req.RecursionDesired, req.CheckingDisabled, opt != nil, p)
	off, err := dns.PackDomainName(q.Name, b, 12, nil, false)
	if err != nil {
		return nil, fmt.Errorf("pack question %q: %w", q.Name, err)
	}
	b[off], b[off+1], b[off+2], b[off+3] = byte(q.Qtype>>8), byte(q.Qtype), byte(q.Qclass>>8), byte(q.Qclass)
	off += 4
	off += copy(b[off:], p.body)
	if opt != nil {
		off += putOPT(b[off:], opt.Do())
	}
	return b[:off], nil
}

// optLen is the length of the OPT record putOPT writes, in bytes.
const optLen = 11

// putHeader writes the 12-byte header of prepared answer p to the query with id, RD and CD into
// b: QR, AA and RA set, opcode QUERY, one question, ARCOUNT p's additional records plus 1 when
// an OPT follows.
func putHeader(b []byte, id uint16, rd, cd, edns bool, p *prepared) {
	b[0], b[1] = byte(id>>8), byte(id)
	flags1 := byte(0x80 | 0x04) // QR, AA; opcode QUERY
	if rd {
		flags1 |= 0x01
	}
	flags2 := byte(0x80) | byte(p.rcode&0x0F) // RA
	if cd {
		flags2 |= 0x10
	}
	b[2], b[3] = flags1, flags2
	b[4], b[5] = 0, 1
	b[6], b[7] = byte(p.an>>8), byte(p.an)
	b[8], b[9] = byte(p.ns>>8), byte(p.ns)
	ar := p.ar
	if edns {
		ar++
	}
	b[10], b[11] = byte(ar>>8), byte(ar)
}

// putOPT writes the resolver's OPT record (root owner, UDP size ednsUDPSize, extended rcode 0,
// version 0, DO as given, no options) into b and returns its length, optLen.
func putOPT(b []byte, do bool) int {
	var flags byte
	if do {
		flags = 0x80
	}
	return copy(b, []byte{0, 0, 41, byte(ednsUDPSize >> 8), byte(ednsUDPSize & 0xFF), 0, 0, flags, 0, 0, 0})
}

// edeLen is the length of an Extended DNS Error option without EXTRA-TEXT, in bytes (RFC 8914
// section 2: OPTION-CODE, OPTION-LENGTH, INFO-CODE).
const edeLen = 6

// putEDE adds an Extended DNS Error option with code (RFC 8914 section 2; no EXTRA-TEXT, which
// is optional) to the OPT record putOPT wrote at the start of opt, which must hold optLen+edeLen
// bytes: it sets the OPT's RDLENGTH and writes the option after it.
func putEDE(opt []byte, code uint16) {
	opt[9], opt[10] = 0, edeLen
	opt[11], opt[12] = byte(dns.EDNS0EDE>>8), byte(dns.EDNS0EDE&0xFF)
	opt[13], opt[14] = 0, 2
	opt[15], opt[16] = byte(code>>8), byte(code)
}

// truncateWire re-encodes a too long answer within maxSize (truncate).
func truncateWire(buf, wire []byte, maxSize int) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(wire); err != nil {
		panic(fmt.Sprintf("dnsd: unpack own answer: %v", err))
	}
	truncate(m, maxSize)
	out, err := m.PackBuffer(buf)
	if err != nil {
		panic(fmt.Sprintf("dnsd: pack truncated answer: %v", err))
	}
	return out
}

// truncate cuts m to maxSize with miekg/dns's truncation (whole records dropped, OPT kept) and
// sets TC only when the answer or authority section lost records. When only additional records
// do not fit, the additional section is dropped whole but for the OPT, so no partial RRset is
// left, and TC stays clear: RFC 2181 section 9, "The TC bit should not be set merely because
// some extra information could have been included, for which there was insufficient room. This
// includes the results of additional section processing." (an SRV answer's target addresses).
// A TC bit m already carries (an upstream's truncated answer, forwarded as is) stays set: that
// answer is incomplete whatever this cut drops.
func truncate(m *dns.Msg, maxSize int) {
	an, ns, tc := len(m.Answer), len(m.Ns), m.Truncated
	m.Truncate(maxSize)
	if m.Truncated && !tc && len(m.Answer) == an && len(m.Ns) == ns {
		m.Extra = slices.DeleteFunc(m.Extra, func(rr dns.RR) bool { return rr.Header().Rrtype != dns.TypeOPT })
		m.Truncated = false
	}
}

// errorReply packs an empty answer with rcode (and an OPT when the query had one, which also
// carries the upper bits of an extended rcode such as BADVERS).
func errorReply(buf []byte, req *dns.Msg, rcode int) []byte {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	if len(req.Question) > 1 {
		m.Question = req.Question[:1]
	}
	if opt := req.IsEdns0(); opt != nil || rcode > 0x0F {
		do := opt != nil && opt.Do()
		m.SetEdns0(ednsUDPSize, do)
	}
	out, err := m.PackBuffer(buf)
	if err != nil {
		// A question that does not pack: answer without it.
		m.Question = nil
		out, err = m.PackBuffer(buf)
		if err != nil {
			panic(fmt.Sprintf("dnsd: pack error reply: %v", err))
		}
	}
	return out
}
