package agent

import (
	"context"
	"log"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// nodeHooks is the node hook controller (Options.HostPorts): it sets the
// hooks up at start (as an ADD with portMappings or ipMasq would), follows
// the node's addresses and links (cni_node_ips, uplinks), and every prune
// interval drops the hostPort mappings and flows of pods whose host veth
// is gone; every FlowTimeoutClosing it deletes the hostPort flows idle
// past their timeout that no timer deleted.
type nodeHooks struct {
	dp         *datapath.Datapath
	cgroupRoot string
	prune      time.Duration
	lg         *log.Logger
	changed    chan struct{} // a link other than a host veth changed
}

func newNodeHooks(dp *datapath.Datapath, cgroupRoot string, prune time.Duration, lg *log.Logger, w *linkWatcher) *nodeHooks {
	h := &nodeHooks{dp: dp, cgroupRoot: cgroupRoot, prune: prune, lg: lg, changed: make(chan struct{}, 1)}
	w.handle(linkHandler{update: func(u netlink.LinkUpdate) {
		// Host veths come and go with pods; only other links matter.
		if !ourHostVeth(dp.Maps, u) {
			h.kick()
		}
	}, lost: h.kick})
	return h
}

func (h *nodeHooks) kick() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

func (h *nodeHooks) sync(why string) {
	opts := datapath.NodeHookOptions{CgroupRoot: h.cgroupRoot, MustRefresh: true}
	nh, err := h.dp.EnsureNodeHooks(opts)
	if nh == nil {
		h.lg.Printf("node hooks (%s): %v", why, err)
		return
	}
	if err != nil { // uplinks set up; the socket hooks could not be
		h.lg.Printf("node hooks (%s): %v", why, err)
	}
	h.lg.Printf("node hooks (%s): cgroup %s, uplinks %v, %d node addresses", why, nh.CgroupRoot, nh.Uplinks, len(nh.NodeIPs))
}

// Run returns when ctx ends.
func (h *nodeHooks) Run(ctx context.Context) error {
	h.sync("start")

	addrs := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.AddrSubscribe(addrs, done); err != nil {
		h.lg.Printf("hostPort: no address notifications (%v); relying on ADDs and the periodic sync", err)
	}
	tick := time.NewTicker(h.prune)
	defer tick.Stop()
	// Backstop for flow timers the kernel could not allocate (maps.ExpireCT).
	sweep := time.NewTicker(maps.FlowTimeoutClosing)
	defer sweep.Stop()
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-addrs:
			if !u.LinkAddress.IP.IsLinkLocalUnicast() {
				debounce = time.After(200 * time.Millisecond)
			}
		case <-h.changed:
			debounce = time.After(200 * time.Millisecond)
		case <-debounce:
			debounce = nil
			h.sync("addresses or links changed")
		case <-sweep.C:
			if _, err := h.dp.Maps.HostPorts().ExpireCT(); err != nil {
				h.lg.Printf("hostPort: expire flows: %v", err)
			}
		case <-tick.C:
			n, err := endpoint.PruneHostPorts(h.dp.Maps)
			if err != nil {
				h.lg.Printf("hostPort: prune: %v", err)
			} else if n > 0 {
				h.lg.Printf("hostPort: pruned %d entries of pods whose host veth is gone", n)
			}
			h.sync("periodic")
		}
	}
}
