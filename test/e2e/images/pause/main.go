// Command pause is the e2e suite's pod sandbox image: it holds the pod's
// namespaces, reaps orphans (it is PID 1 of the pod) and exits 0 on SIGTERM
// or SIGINT. Built static (CGO_ENABLED=0) and packed into an OCI image by
// mkimage, so the suite needs no registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
