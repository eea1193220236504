// Command pause is the Pod sandbox's process for the one-node cluster (tests/cluster/): the
// image the container runtime starts first in every Pod to hold its namespaces. It does what
// upstream's pause container is documented to do: sleep until SIGINT or SIGTERM (then exit 0)
// and, as PID 1 of a Pod sharing its process namespace, reap every child that exits.
// Built static (CGO off) by build.sh and packed into an OCI archive by tests/cluster/cluster.sh.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		os.Stderr.WriteString("pause: warning: not PID 1\n")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
