//go:build linux

package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// spawnReq asks the spawner thread to start a command.
type spawnReq struct {
	cmd  *exec.Cmd
	errc chan error
}

var spawnCh = func() chan spawnReq {
	ch := make(chan spawnReq)
	go func() {
		// This goroutine never returns, so its locked OS thread lives as long as the test binary.
		runtime.LockOSThread()
		for r := range ch {
			r.errc <- r.cmd.Start()
		}
	}()
	return ch
}()

// StartCmd starts cmd with SIGKILL as its parent-death signal, from a dedicated OS thread that
// lives as long as the test binary. The kernel sends the parent-death signal when the *thread*
// that forked the child exits (prctl(2), PR_SET_PDEATHSIG); Go ends the threads that NewNetns
// and Netns.Do lock, so a child forked from an ordinary goroutine could be killed whenever its
// forking thread later ran such work. From the spawner thread, children die only with the test
// process.
func StartCmd(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	errc := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, errc: errc}
	return <-errc
}

// StartCmdInCgroup is StartCmd with cmd born in the cgroup v2 directory cgroup (clone3
// CLONE_INTO_CGROUP, Linux 5.7): nothing the child does precedes its move, so every socket it
// makes belongs to that cgroup. An empty cgroup is StartCmd.
func StartCmdInCgroup(cmd *exec.Cmd, cgroup string) error {
	if cgroup == "" {
		return StartCmd(cmd)
	}
	cg, err := os.Open(cgroup)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", cgroup, err)
	}
	defer cg.Close()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(cg.Fd())
	return StartCmd(cmd)
}
