package agent

import (
	"context"
	"errors"
	"log"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// Option changes what Run does.
type Option func(*runConfig)

type runConfig struct {
	hostPorts  bool
	cgroupRoot string
	pruneEvery time.Duration
}

// WithHostPorts makes Run own the node-level hostPort hooks: set them up at
// start (as an ADD with portMappings would), follow the node's addresses
// and links (cni_node_ips, uplinks), and prune the mappings and flows of
// pods whose host veth is gone. cgroupRoot "" finds the cgroup2 mount.
func WithHostPorts(cgroupRoot string) Option {
	return func(c *runConfig) {
		c.hostPorts = true
		c.cgroupRoot = cgroupRoot
	}
}

// runHostPorts is Run's hostPort loop; it returns when ctx ends.
func runHostPorts(ctx context.Context, dp *datapath.Datapath, c *runConfig, logger *log.Logger) {
	opts := datapath.NodeHookOptions{CgroupRoot: c.cgroupRoot, MustRefresh: true}
	sync := func(why string) {
		h, err := dp.EnsureNodeHooks(opts)
		if h == nil {
			logger.Printf("hostPort hooks (%s): %v", why, err)
			return
		}
		if err != nil { // uplinks set up; the socket hooks could not be
			logger.Printf("hostPort hooks (%s): %v", why, err)
		}
		logger.Printf("hostPort hooks (%s): cgroup %s, uplinks %v, %d node addresses", why, h.CgroupRoot, h.Uplinks, len(h.NodeIPs))
	}
	sync("start")

	addrs := make(chan netlink.AddrUpdate, 64)
	links := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.AddrSubscribe(addrs, done); err != nil {
		logger.Printf("hostPort: no address notifications (%v); relying on ADDs and the periodic sync", err)
	}
	if err := netlink.LinkSubscribe(links, done); err != nil {
		logger.Printf("hostPort: no link notifications (%v); relying on ADDs and the periodic sync", err)
	}
	every := c.pruneEvery
	if every == 0 {
		every = time.Minute
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-addrs:
			if !u.LinkAddress.IP.IsLinkLocalUnicast() {
				debounce = time.After(200 * time.Millisecond)
			}
		case u := <-links:
			// Host veths ("ebpf" + hash) come and go with pods; only other links matter.
			if u.Link == nil || !strings.HasPrefix(u.Link.Attrs().Name, "ebpf") {
				debounce = time.After(200 * time.Millisecond)
			}
		case <-debounce:
			debounce = nil
			sync("addresses or links changed")
		case <-tick.C:
			n, err := dp.Maps.PruneHostPorts(func(ifindex int) bool {
				if ifindex == 0 {
					return false
				}
				_, err := netlink.LinkByIndex(ifindex)
				var nf netlink.LinkNotFoundError
				return !errors.As(err, &nf)
			})
			if err != nil {
				logger.Printf("hostPort: prune: %v", err)
			} else if n > 0 {
				logger.Printf("hostPort: pruned %d entries of pods whose host veth is gone", n)
			}
			sync("periodic")
		}
	}
}
