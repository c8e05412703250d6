package endpoint

import (
	"net"
	"os"
	"runtime"

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
// sweepPod must remove them once the veth is gone. Its requests go through
// one rtnetlink socket pair opened in the pod's netns (rtnl.go), returned
// in podNL (nil when the netns was not entered) for the sweep, which the
// caller closes: a socket acts in the netns it was made in, so the sweep
// needs no second netns switch.
//
// The look at the pod's other interfaces is under the netns's lock
// (lockNetns, among pinDir's locks), returned in held with the netns (nil
// when the netns was not opened): the caller closes it once its veth is gone, so that a teardown of another
// interface of the pod looks either before it or after its veth went.
func podSide(pinDir, netnsPath, ifname string, recCookie uint64, hostIfindex, table int, isOurs func(int) bool, handOff bool) (deleteCookie uint64, sweep bool, podNL *rtnl, held *netnsHold) {
	if netnsPath == "" {
		return recCookie, false, nil, nil
	}
	netns, err := ns.GetNS(netnsPath)
	if err != nil {
		return recCookie, false, nil, nil // the netns is gone, and with it whoever used the entry
	}
	if isOwnNetns(int(netns.Fd())) {
		netns.Close()
		return recCookie, false, nil, nil // a DEL naming the node's netns: no pod's rules there
	}
	held = &netnsHold{netns: netns, release: lockNetns(pinDir, netns)}
	nodeNS := openNodeNetns() // before entering the pod's
	defer func() {
		if nodeNS != nil {
			nodeNS.Close()
		}
	}()
	_ = netns.Do(func(ns.NetNS) error {
		podNL = openRTNLOrEach()
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
		links, _ := podNL.LinkList()
		var found bool
		found, sweep = podSideLink(podNL, links, ifname, hostIfindex, &table, handOff)
		if !found && !handOff {
			// The veth is gone (a retry): what a DEL killed before its
			// sweep parked goes now.
			sweep = sweepParked(podNL) != nil // failed: teardown tries again, and says why
		}
		if table != 0 {
			deleteRules(podNL, table)
		}
		deleteCookie = cookie
		if otherAttachment(podNL, nodeNS, links, ifname, hostIfindex, isOurs) {
			deleteCookie = 0 // another attachment of the pod still uses it
		}
		return nil
	})
	return deleteCookie, sweep, podNL, held
}

// otherAttachment tells whether the pod's links hold another attachment of
// the node's datapath than ifname's (its host veth hostIfindex): a veth
// whose peer is in the node's netns at an ifindex of ours (isOurs). A veth
// pair the pod made inside its own netns has its peer's index there, which
// may be any node ifindex of ours (attack30: its peer at another pod's host
// veth index kept the pod's netns entry past its last DEL). The node's
// netns is known by the id the pod's netns gives it (nodeNetnsID, asked
// through r, the pod's sockets, after the links were listed), not by the
// interface being deleted, whose name and place are the pod's to change:
// a pod that renamed its eth0 and put a veth's peer into a netns of its own
// at another pod's host veth index kept its entry (attack30b). Only when
// that id is unknown does the interface being deleted tell it (the netns
// of its peer, else any other than the pod's).
func otherAttachment(r *rtnl, nodeNS *os.File, links []netlink.Link, ifname string, hostIfindex int, isOurs func(int) bool) bool {
	node, err := nodeNetnsID(r, nodeNS)
	if err != nil {
		node = -1
		for _, l := range links {
			if a := l.Attrs(); hostIfindex != 0 && a.Name == ifname && a.ParentIndex == hostIfindex {
				node = a.NetNsID
			}
		}
	} else if node < 0 {
		return false // no link of the pod has its peer in the node's netns
	}
	for _, l := range links {
		a := l.Attrs()
		p := a.ParentIndex // a veth's peer
		if l.Type() != "veth" || p == 0 || (hostIfindex != 0 && p == hostIfindex) {
			continue // not a veth, or the interface being deleted
		}
		if a.NetNsID < 0 || (node >= 0 && a.NetNsID != node) {
			continue // its peer is not in the node's netns
		}
		if isOurs(p) {
			return true
		}
	}
	return false
}

// nodeNetnsID is the id the pod's netns (r's sockets) gives the node's
// netns, node (openNodeNetns): -1 when it gives none, and then no link of
// the pod has its peer there (listing the links gives one to each netns a
// peer is in). No pod can set it: the id is set once, by a holder of the
// node's netns.
func nodeNetnsID(r *rtnl, node *os.File) (int, error) {
	if node == nil {
		return 0, os.ErrInvalid
	}
	return r.GetNetNsIdByFd(int(node.Fd()))
}

// openNodeNetns opens the plugin's own netns, the node's, from a thread
// of its own (ns.Do moves only the thread it locks into a pod's netns, and
// that may be the process's first, which /proc/self names). Called outside
// any ns.Do; nil when it cannot be opened.
func openNodeNetns() *os.File {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil
	}
	return f
}

// podSideLink finds the pod end of the host veth hostIfindex among links,
// sets *table from it when unknown, and hands it off or parks its nexthop
// objects (sweep: parked), through r, the pod's sockets.
func podSideLink(r *rtnl, links []netlink.Link, ifname string, hostIfindex int, table *int, handOff bool) (found, sweep bool) {
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
			handOffPod(r, l, hostIfindex)
		} else {
			// Before the veth goes (see parkNexthopsOn). Handed off,
			// the agent deletes the veth, off the verb's clock.
			sweep = parkNexthopsOn(r, l.Attrs().Index, loUp) || sweep
		}
	}
	return found, sweep
}

// sweepPod runs sweepParked in the pod's netns, once the veth is gone:
// through podNL when its sockets were made there (podSide), else inside
// the netns, entered again.
func sweepPod(podNL *rtnl, netnsPath string) error {
	if podNL.kept() {
		return sweepParked(podNL)
	}
	netns, err := ns.GetNS(netnsPath)
	if err != nil {
		return nil // gone, and the parked objects with it
	}
	defer netns.Close()
	return netns.Do(func(ns.NetNS) error { return sweepParked(nil) })
}
