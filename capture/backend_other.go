//go:build !linux

package capture

import (
	"errors"
	"net/netip"
)

// errUnsupported is what every backend returns off Linux: network namespaces, nftables and
// iptables exist only there.
var errUnsupported = errors.New("capture: pod netns rules need Linux")

// NFTables is the nftables backend; off Linux every method fails.
type NFTables struct{}

// Apply fails off Linux.
func (NFTables) Apply(string, RuleSet) (bool, error) { return false, errUnsupported }

// Check fails off Linux.
func (NFTables) Check(string, RuleSet) error { return errUnsupported }

// Teardown fails off Linux.
func (NFTables) Teardown(string) error { return errUnsupported }

// IPTablesMode is the node's iptables backend (see the Linux build).
type IPTablesMode string

// IPTables is the iptables backend; off Linux every method fails.
type IPTables struct{ Mode IPTablesMode }

// Apply fails off Linux.
func (IPTables) Apply(string, RuleSet) (bool, error) { return false, errUnsupported }

// Check fails off Linux.
func (IPTables) Check(string, RuleSet) error { return errUnsupported }

// Teardown fails off Linux.
func (IPTables) Teardown(string) error { return errUnsupported }

// NewBackend fails off Linux.
func NewBackend(string) (Backend, error) { return nil, errUnsupported }

// NFTGuard is the node source guard; off Linux every method fails.
type NFTGuard struct{ NetnsPath string }

// Apply fails off Linux.
func (NFTGuard) Apply([]netip.Addr) (bool, error) { return false, errUnsupported }

// Check fails off Linux.
func (NFTGuard) Check([]netip.Addr) error { return errUnsupported }

// Teardown fails off Linux.
func (NFTGuard) Teardown() error { return errUnsupported }

// ForgetUDPFlows fails off Linux.
func ForgetUDPFlows(string, []netip.AddrPort) (uint, error) { return 0, errUnsupported }

// CutRefused fails off Linux (see the Linux build).
func CutRefused(string, RuleSet) (int, error) { return 0, errUnsupported }
