package agent

import (
	"k8s.io/client-go/rest"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/netpol"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// newPolicy is the NetworkPolicy controller (Options.NetworkPolicy) on the
// shared datapath's maps, told of host veths by the link watcher.
func newPolicy(o Options, dp *datapath.Datapath, kubeCfg *rest.Config, w *linkWatcher) *netpol.Controller {
	dir := o.PolicyStatusDir
	if dir == "" {
		dir = netpol.DefaultStatusDir
	}
	pw := dp.Maps.Policy().Writer()
	node := ""
	if o.Kube != nil {
		node = o.Kube.NodeName
	}
	c := netpol.New(netpol.Config{Kube: kubeCfg, StateDir: o.StateDir, StatusDir: dir, NodeName: node, Writer: pw, Sweep: pw.Sweep,
		Logf: o.Logger.Printf, Resync: o.ReconcileInterval})
	w.handle(linkHandler{update: c.LinkEvent, lost: c.LinksLost})
	return c
}
