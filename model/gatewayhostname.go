package model

import (
	"cmp"
	"strings"
)

// Hostnames as Gateway API v1.6.3 compares them (the "Hostnames" concept document, and
// Listener.hostname): a precise name matches itself; a wildcard "*.d" matches every name (and
// every narrower wildcard) ending in ".d" with one or more labels before it, never "d" itself; ""
// (no hostname) and "*" match every host.

// anyHost reports whether h matches every host.
func anyHost(h string) bool { return h == "" || h == "*" }

// coversHostname reports whether every host b matches is matched by a.
func coversHostname(a, b string) bool {
	switch {
	case anyHost(a) || a == b:
		return true
	case anyHost(b) || !strings.HasPrefix(a, "*."):
		return false
	}
	suffix := a[1:] // ".d"
	return len(b) > len(suffix) && strings.HasSuffix(b, suffix)
}

// intersectHostnames is the intersected hostname of a listener's hostname l and a route's
// hostname r: the narrower of the two when one covers the other ("*" when both match every
// host); ok is false when they share no host. Two wildcards where neither covers the other
// ("*.a.com", "*.b.com") share none.
func intersectHostnames(l, r string) (string, bool) {
	switch {
	case anyHost(l) && anyHost(r):
		return "*", true
	case coversHostname(l, r):
		return r, true
	case coversHostname(r, l):
		return l, true
	}
	return "", false
}

// overlapHostnames reports whether a and b share a host.
func overlapHostnames(a, b string) bool {
	_, ok := intersectHostnames(a, b)
	return ok
}

// compareHostnames orders hostnames most specific first, as listeners and virtual hosts are
// matched (GatewaySpec.listeners, "Listeners that are distinct only by Hostname"): precise names,
// then wildcards with more labels after the "*", then "" or "*"; ties by length, then name.
func compareHostnames(a, b string) int {
	rank := func(h string) int {
		switch {
		case anyHost(h):
			return 2
		case strings.HasPrefix(h, "*."):
			return 1
		}
		return 0
	}
	return cmp.Or(
		cmp.Compare(rank(a), rank(b)),
		cmp.Compare(strings.Count(b, "."), strings.Count(a, ".")),
		cmp.Compare(len(b), len(a)),
		cmp.Compare(a, b),
	)
}
