// Command ebpf-cni is the CNI plugin: runtimes exec it with CNI_* in the
// environment and the network configuration on stdin.
package main

import (
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ebpf-cni/ebpf-cni/pkg/cni"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

// gcLimit bounds the heap of a verb that runs without the collector: a
// verb lives some milliseconds and allocates a few MB (a DEL scanning the
// stack-flow tables of many pods more), so a collection only costs it time;
// past this the collector runs again, as for a long-lived process.
const gcLimit = 256 << 20

func main() {
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(gcLimit)
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cni.Add,
		Del:    cni.Del,
		Check:  cni.Check,
		GC:     cni.GC,
		Status: cni.Status,
	}, version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), "ebpf-cni "+Version)
}
