package capture

import (
	"net/netip"
	"slices"
)

// RefusesTCP reports whether the input chain of rs refuses (rejects or drops) a TCP packet a
// caller at src sends to dst:port in the original direction (a caller's packet, not a reply to
// the pod's own connection) on a device other than loopback: the decision the live rules make
// on a caller's connection, new or already accepted. It reads the rules themselves, first match
// wins, the chain's policy (accept) last, so it cannot disagree with what Build wrote.
func (rs RuleSet) RefusesTCP(src, dst netip.Addr, port uint16) bool {
	src, dst = src.Unmap(), dst.Unmap()
	fam := familyOf(dst)
	for _, ch := range rs.Chains {
		if ch.Hook != HookInputFilter {
			continue
		}
		for _, r := range ch.Rules {
			if !r.matchesCallerTCP(fam, src, dst, port) {
				continue
			}
			switch r.Verdict.Kind {
			case VerdictReject, VerdictDrop:
				return true
			case VerdictAccept, VerdictReturn:
				return false
			}
		}
	}
	return false
}

// matchesCallerTCP reports whether r matches a caller's TCP packet (original direction, not on
// loopback, no mark) of family fam from src to dst:port.
func (r Rule) matchesCallerTCP(fam Family, src, dst netip.Addr, port uint16) bool {
	switch {
	case r.Reply, r.IIFLoopback, r.OIFLoopback, r.Mark != 0:
		return false
	case r.Family != FamilyAny && r.Family != fam:
		return false
	case r.L4 != 0 && r.L4 != protoTCP:
		return false
	case r.Src.IsValid() && !r.Src.Contains(src):
		return false
	case r.Dst.IsValid() && !r.Dst.Contains(dst):
		return false
	case len(r.DstPorts) > 0 && !slices.Contains(r.DstPorts, port):
		return false
	}
	return true
}
