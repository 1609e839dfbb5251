//go:build !linux

package testenv

import "os/exec"

// StartCmd starts cmd. Off Linux there is no parent-death signal: children are stopped by the
// tests' cleanups only.
func StartCmd(cmd *exec.Cmd) error { return cmd.Start() }
