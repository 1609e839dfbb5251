//go:build !linux

package testenv

import (
	"fmt"
	"os/exec"
)

// StartCmd starts cmd. Off Linux there is no parent-death signal: children are stopped by the
// tests' cleanups only.
func StartCmd(cmd *exec.Cmd) error { return cmd.Start() }

// StartCmdInCgroup is StartCmd; a non-empty cgroup is an error (cgroups are Linux's).
func StartCmdInCgroup(cmd *exec.Cmd, cgroup string) error {
	if cgroup != "" {
		return fmt.Errorf("start %s in cgroup %s: cgroups need Linux", cmd.Path, cgroup)
	}
	return cmd.Start()
}
