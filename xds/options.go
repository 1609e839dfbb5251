package xds

import (
	"fmt"
	"strconv"
)

// String names the mechanism as its Go constant ("CertSelector", "CertMatcher"), or
// "CertSelection(<n>)" for a value that is neither.
func (c CertSelection) String() string {
	switch c {
	case CertSelector:
		return "CertSelector"
	case CertMatcher:
		return "CertMatcher"
	}
	return "CertSelection(" + strconv.Itoa(int(c)) + ")"
}

// check refuses option values and combinations the builders do not implement: a CertSelection
// that is neither CertSelector nor CertMatcher, and EastWestWaypoint with CertMatcher. The
// waypoint's transport socket (SNI "<port>.<svc>.<ns>.<meshDomain>", chosen by the endpoint
// metadata envoy.transport_socket_match {waypoint: true}) exists only beside the certificate
// selector's single TLS context; CertMatcher's Cluster.transport_socket_matcher picks among one
// socket per local identity and would need a second set per identity for the waypoint, so
// instead of silently sending remote endpoints to pod IPs the combination is an error.
func (o Options) check() error {
	switch o.CertSelection {
	case CertSelector, CertMatcher:
	default:
		return fmt.Errorf("check options: CertSelection %s: want CertSelector or CertMatcher", o.CertSelection)
	}
	if o.EastWestWaypoint && o.CertSelection != CertSelector {
		return fmt.Errorf("check options: EastWestWaypoint needs CertSelection CertSelector, not %s: the waypoint transport socket is built only for the certificate selector", o.CertSelection)
	}
	return nil
}
