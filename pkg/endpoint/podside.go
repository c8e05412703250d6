package endpoint

import (
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// podSide is the part of a teardown inside the pod's netns: it removes the
// interface's policy routing rules (rules outlive the interface they were
// made for) and tells which cni_netns entry DEL may delete: none while the
// pod keeps another interface on this node's datapath (isOurs(peer ifindex)),
// since the entry is the pod's, not the interface's. handOff takes the
// interface out of service for the agent to delete (handoff.go).
//
// sweep says that the pod's nexthop objects were parked (parkNexthopsOn):
// sweepParkedIn must remove them once the veth is gone.
func podSide(netnsPath, ifname string, recCookie uint64, hostIfindex, table int, isOurs func(int) bool, handOff bool) (deleteCookie uint64, sweep bool) {
	if netnsPath == "" {
		return recCookie, false
	}
	netns, err := ns.GetNS(netnsPath)
	if err != nil {
		return recCookie, false // the netns is gone, and with it whoever used the entry
	}
	defer netns.Close()
	if isOwnNetns(int(netns.Fd())) {
		return recCookie, false // a DEL naming the node's netns: no pod's rules there
	}
	_ = netns.Do(func(ns.NetNS) error {
		// An ADD that recorded no cookie (no pacing, no SO_NETNS_COOKIE)
		// registered no cni_netns entry: nothing to compare or delete.
		var cookie uint64
		var err error
		if recCookie != 0 || datapath.NetnsCookieCheap() {
			cookie, err = datapath.NetnsCookie()
		}
		if err != nil {
			deleteCookie = recCookie
			return nil
		}
		if recCookie != 0 && cookie != recCookie {
			// The path names another netns now: the recorded one is gone.
			deleteCookie = recCookie
			return nil
		}
		links, _ := netlinksafe.LinkList()
		var found bool
		found, sweep = podSideLink(links, ifname, hostIfindex, &table, handOff)
		if !found && !handOff {
			// The veth is gone (a retry): what a DEL killed before its
			// sweep parked goes now.
			sweep = sweepParked() != nil // failed: teardown tries again, and says why
		}
		if table != 0 {
			deleteRules(table)
		}
		deleteCookie = cookie
		for _, l := range links {
			p := l.Attrs().ParentIndex // a veth's peer, in the node's netns
			if l.Type() != "veth" || p == 0 || (hostIfindex != 0 && p == hostIfindex) {
				continue // not a veth, or the interface being deleted
			}
			if isOurs(p) {
				deleteCookie = 0 // another attachment of the pod still uses it
				break
			}
		}
		return nil
	})
	return deleteCookie, sweep
}

// podSideLink finds the pod end of the host veth hostIfindex among links,
// sets *table from it when unknown, and hands it off or parks its nexthop
// objects (sweep: parked).
func podSideLink(links []netlink.Link, ifname string, hostIfindex int, table *int, handOff bool) (found, sweep bool) {
	if hostIfindex == 0 {
		return false, false
	}
	loUp := false
	for _, l := range links {
		if l.Attrs().Name == "lo" {
			loUp = l.Attrs().Flags&net.FlagUp != 0
		}
	}
	for _, l := range links {
		if l.Attrs().Name != ifname || l.Attrs().ParentIndex != hostIfindex {
			continue
		}
		found = true
		if *table == 0 {
			*table = podTable(l.Attrs().Index)
		}
		if handOff {
			handOffPod(l, hostIfindex)
		} else {
			// Before the veth goes (see parkNexthopsOn). Handed off,
			// the agent deletes the veth, off the verb's clock.
			sweep = parkNexthopsOn(l.Attrs().Index, loUp) || sweep
		}
	}
	return found, sweep
}

// sweepParkedIn runs sweepParked in the pod's netns, once the veth is gone.
func sweepParkedIn(netnsPath string) error {
	netns, err := ns.GetNS(netnsPath)
	if err != nil {
		return nil // gone, and the parked objects with it
	}
	defer netns.Close()
	return netns.Do(func(ns.NetNS) error { return sweepParked() })
}
