// Command pause is the sandbox ("infra") container of every pod on the real-node substrate: it
// holds the pod's namespaces open and does nothing else, like registry.k8s.io/pause. As PID 1
// of a pod that shares its process namespace it reaps orphaned children. SIGINT and SIGTERM end
// it with status 0.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
