//go:build !linux

package agent

import "errors"

var errNoBPF = errors.New("eBPF capture needs Linux")

// ensureBPFFS fails off Linux.
func ensureBPFFS(string) error { return errNoBPF }

// underCgroup fails off Linux.
func underCgroup(int, string) error { return errNoBPF }
