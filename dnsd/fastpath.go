package dnsd

import (
	"net/netip"
	"unsafe"

	"github.com/miekg/dns"
)

// maxNameWire is the longest domain name in wire form, in bytes (RFC 1035 section 3.1).
const maxNameWire = 255

// RespondWire answers the query whose wire form is q, asked from src over UDP, without
// unpacking it into a dns.Msg: the server's fast path. It answers only the common case and
// returns ok false for every other query, which the caller then unpacks and passes to Respond
// (the slow path). For every query it answers, its answer is byte for byte the one Respond
// gives for the unpacked query with maxSize MaxUDPSize (TestRespondWireMatchesRespond).
//
// The common case: a query (QR clear, opcode QUERY) with one question, no answer or authority
// records, and either no additional record or exactly one OPT record of EDNS version 0 without
// options (RFC 6891 section 6.1.2); the question name uncompressed, made of letters, digits,
// hyphens and underscores, class IN, type not AXFR or IXFR; a name the index answers itself
// (not forwarded); and an answer that fits the client's UDP size (no truncation). It appends
// the answer to buf (which it may reallocate) and returns it with the query type and the rcode
// written, for the metrics.
func (idx *Index) RespondWire(buf, q []byte, src netip.Addr) (wire []byte, qtype uint16, rcode int, ok bool) {
	var wq wireQuery
	if !wq.parse(q) {
		return buf, 0, 0, false
	}
	wire, rcode, _, ok = idx.respondWire(buf, q, &wq, src)
	return wire, wq.qtype, rcode, ok
}

// wireQuery is a query in the common case RespondWire takes, parsed from its wire form.
type wireQuery struct {
	// key holds the question name lower-cased in presentation form ("web.mesh."), key[:n],
	// with room after it for the suffix of a cache key (cacheKeySuffix bytes).
	key [maxNameWire + cacheKeySuffix]byte
	n   int
	// qend is the offset just past the question in the query.
	qend  int
	qtype uint16
	// edns is whether the query had an OPT record, do its DO bit; maxSize is the largest UDP
	// answer the client accepts (MaxUDPSize).
	edns, do bool
	maxSize  int
}

// name returns the lower-case question name, without copying it: valid while wq is.
func (wq *wireQuery) name() string { return unsafe.String(&wq.key[0], wq.n) }

// parse reads the query q of the common case into wq (no allocation) and reports whether q is
// one.
func (wq *wireQuery) parse(q []byte) bool {
	// Header (RFC 1035 section 4.1.1): QR and opcode are the top five bits of byte 2.
	if len(q) < 12+1+4 || q[2]&0xF8 != 0 {
		return false
	}
	if q[4] != 0 || q[5] != 1 || q[6]|q[7]|q[8]|q[9]|q[10] != 0 || q[11] > 1 {
		return false
	}
	// The question name, lower-cased into presentation form ("web.mesh.") for the lookup.
	n, off := 0, 12
	for {
		if off >= len(q) {
			return false
		}
		l := int(q[off])
		if l == 0 {
			off++
			break
		}
		// l > 63 also rejects compression pointers and extended labels (top bits set).
		if l > 63 || off+1+l >= len(q) || off+1+l+1-12 > maxNameWire {
			return false
		}
		for _, c := range q[off+1 : off+1+l] {
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c >= 'A' && c <= 'Z':
				c += 'a' - 'A'
			default:
				// Anything else is escaped in presentation form: leave it to the slow path.
				return false
			}
			wq.key[n] = c
			n++
		}
		wq.key[n] = '.'
		n++
		off += 1 + l
	}
	if n == 0 || off+4 > len(q) {
		return false // the root name or no room for type and class
	}
	qtype := uint16(q[off])<<8 | uint16(q[off+1])
	if q[off+2] != 0 || q[off+3] != byte(dns.ClassINET) || qtype == dns.TypeAXFR || qtype == dns.TypeIXFR {
		return false
	}
	qend := off + 4
	edns, do, maxSize := false, false, dns.MinMsgSize
	switch {
	case q[11] == 0 && qend == len(q):
	case q[11] == 1 && qend+optLen == len(q):
		// OPT (RFC 6891 section 6.1.2): root owner, TYPE 41, CLASS = UDP payload size, TTL =
		// extended rcode, version, DO and Z; RDLEN 0.
		o := q[qend:]
		if o[0] != 0 || o[1] != 0 || o[2] != byte(dns.TypeOPT) || o[6] != 0 || o[9] != 0 || o[10] != 0 {
			return false
		}
		edns, do = true, o[7]&0x80 != 0
		if size := int(o[3])<<8 | int(o[4]); size > dns.MinMsgSize {
			maxSize = size
		}
	default:
		return false
	}
	wq.n, wq.qend, wq.qtype, wq.edns, wq.do, wq.maxSize = n, qend, qtype, edns, do, maxSize
	return true
}

// respondWire is RespondWire for the parsed query wq: ok is true with the answer, or false with
// the index's action (Forward, ForwardClusterset; or Answered when the answer does not fit
// and needs the slow path's truncation).
func (idx *Index) respondWire(buf, q []byte, wq *wireQuery, src netip.Addr) (wire []byte, rcode int, act Action, ok bool) {
	p, act := idx.lookup(wq.name(), wq.qtype, src)
	if act != Answered {
		return buf, 0, act, false
	}
	need := wq.qend + len(p.body)
	if wq.edns {
		need += optLen
	}
	if need > wq.maxSize {
		return buf, 0, Answered, false // truncation is the slow path's
	}
	if cap(buf) < need {
		buf = make([]byte, 0, need)
	}
	b := buf[:need]
	putHeader(b, uint16(q[0])<<8|uint16(q[1]), q[2]&0x01 != 0, q[3]&0x10 != 0, wq.edns, p)
	// The question as asked: same case, same bytes as dns.PackDomainName writes for these names.
	off := 12 + copy(b[12:], q[12:wq.qend])
	off += copy(b[off:], p.body)
	if wq.edns {
		putOPT(b[off:], wq.do)
	}
	return b, p.rcode, Answered, true
}
