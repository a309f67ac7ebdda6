// Command pause is the pod sandbox ("pause") process for the containerd tests.
//
// There is no image registry on the test machines, so the sandbox image is
// built locally from this program: a static binary that holds the pod's
// namespaces open, reaps the zombies left by processes that share its PID
// namespace, and exits 0 on SIGINT or SIGTERM. The container runtime stops a
// sandbox with SIGTERM, and as PID 1 of a namespace a process gets no default
// action for it, so the handler is what makes stop fast.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every exited child without blocking (wait4(-1, WNOHANG)).
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
