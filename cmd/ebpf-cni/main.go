// Command ebpf-cni is the CNI plugin: runtimes exec it with CNI_* in the
// environment and the network configuration on stdin.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ebpf-cni/ebpf-cni/pkg/cni"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cni.Add,
		Del:    cni.Del,
		Check:  cni.Check,
		GC:     cni.GC,
		Status: cni.Status,
	}, version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), "ebpf-cni "+Version)
}
