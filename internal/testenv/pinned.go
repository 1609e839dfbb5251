package testenv

import (
	"os/exec"
	"runtime"
)

// startPinned starts cmd from a goroutine locked to its OS thread, keeps that thread until the
// process exits (cmd.Wait), then calls after. Pdeathsig fires when the thread that forked the
// child exits, not the process, and Netns.Do / NewNetns discard the threads they lock: without
// pinning, a child forked from a thread that a later Netns.Do happens to reuse and discard is
// killed (seen as a kube-apiserver dying mid-test in cni's privileged tests).
func startPinned(cmd *exec.Cmd, after func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		_ = cmd.Wait()
		after()
	}()
	return <-errc
}
