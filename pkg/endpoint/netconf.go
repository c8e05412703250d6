package endpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/linkconf"
)

// The per-ADD settings below go through netlink, not /proc/sys, wherever
// the kernel offers it. Every network namespace that has looked a path up
// under /proc/sys/net holds a "net" dentry of its own in one dcache hash
// chain, and every later lookup under /proc/sys/net, from any namespace,
// walks that chain, taking the global sysctl lock per entry. When each pod
// netns wrote arp_notify through /proc, reading ip_forward on the node took
// 1.15 ms at 1000 pods (0.02 ms at 1; EBPF_CNI_TRACE in `go run ./test/bench
// -parts scale`), for this plugin and for every other process on the node.

// Values of linux/netconf.h and linux/ip.h that x/sys/unix lacks.
const (
	netconfaIfindex    = 1  // NETCONFA_IFINDEX
	netconfaForwarding = 2  // NETCONFA_FORWARDING
	netconfaIfindexAll = -1 // NETCONFA_IFINDEX_ALL: the "all" settings
)

// netconfMsg is struct netconfmsg, padded to the netlink alignment.
type netconfMsg struct{ family uint8 }

func (m netconfMsg) Len() int          { return 4 }
func (m netconfMsg) Serialize() []byte { return []byte{m.family, 0, 0, 0} }

// forwarding reads the "all" forwarding setting of r's netns (nil: the
// calling thread's) for family (unix.AF_INET or unix.AF_INET6).
func forwarding(r *rtnl, family uint8) (bool, error) {
	req := r.request(unix.RTM_GETNETCONF, 0)
	req.AddData(netconfMsg{family})
	all := int32(netconfaIfindexAll)
	req.AddData(nl.NewRtAttr(netconfaIfindex, nl.Uint32Attr(uint32(all))))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNETCONF)
	if err != nil {
		return false, err
	}
	for _, m := range msgs {
		if len(m) < 4 {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[4:])
		if err != nil {
			return false, err
		}
		for _, a := range attrs {
			if a.Attr.Type == netconfaForwarding && len(a.Value) >= 4 {
				return binary.NativeEndian.Uint32(a.Value) != 0, nil
			}
		}
	}
	return false, errors.New("no forwarding attribute in the kernel's answer")
}

// enableForwarding turns on IP forwarding for pods to leave the node, as ptp
// does. It reads by netlink (see above); only a node with forwarding off
// pays a write through /proc/sys.
func enableForwarding(r *rtnl, v4, v6 bool) error {
	for _, f := range []struct {
		on     bool
		family uint8
		path   string
	}{{v4, unix.AF_INET, "/proc/sys/net/ipv4/ip_forward"}, {v6, unix.AF_INET6, "/proc/sys/net/ipv6/conf/all/forwarding"}} {
		if !f.on {
			continue
		}
		if on, err := forwarding(r, f.family); err == nil && on {
			continue
		}
		if err := os.WriteFile(f.path, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding (%s): %w", f.path, err)
		}
	}
	return nil
}

// upAnnouncing brings the pod's interface up, made to tell the host veth
// when its MAC changes (a chained tuning plugin, the workload), so the
// datapath learns the new MAC at once instead of at the pod's next packet.
// It runs in the pod's netns, before the addresses are added. With an IPv4
// address that is arp_notify, set by netlink in the same RTM_SETLINK as
// IFF_UP (issue 30: each request takes RTNL, which every verb of the node
// queues for; the kernel sets the flags first, and with no address yet
// there is nothing to announce at up): the gratuitous ARP teaches the
// link's MAC for both families. Without one, ndisc_notify (unsolicited
// neighbour advertisements), which the kernel lets be set through
// /proc/sys only.
func upAnnouncing(r *rtnl, l netlink.Link, ifname string, hasV4 bool) error {
	if hasV4 {
		if err := linkconf.SetIPv4UpOn(r.sockets(), l.Attrs().Index, linkconf.ARPNotify, 1); err != nil {
			return fmt.Errorf("set arp_notify on %s and bring it up: %w", ifname, err)
		}
		return nil
	}
	// Absent with IPv6 disabled in the pod: nothing to announce then.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+ifname+"/ndisc_notify", []byte("1"), 0o644)
	if err := r.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", ifname, err)
	}
	return nil
}

// disableIPv6 switches IPv6 off on a host veth whose pod has IPv4 addresses
// only, before it comes up: the link then carries no IPv6 the node would
// act on (the node's router solicitations and MLD reports into the pod;
// link-local ND, MLD and the like from the pod, which from_container hands
// to the stack), and adds no routes to the node's IPv6 table, which every
// state change of an IPv6 link walks (rt6_sync_up). A speed-up was the
// reason first given; `go run ./test/stepbench -parts population` (commit 41b58f6,
// docs/archive.md) measures
// none in the median (the pod's end up beside 1000 IPv6 host veths 0.09 ms,
// beside 1000 IPv6-less ones 0.10; p90 0.45 and 0.17). Nothing is lost: a
// pod without an IPv6 address has no IPv6 to route.
// The kernel offers no netlink attribute for it: /proc/sys it is, in the
// node's netns (one "net" dentry, see above). Writing 0 to the node's
// net.ipv6.conf.all.disable_ipv6 switches it back on for every link.
func disableIPv6(hostIf string) error {
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+hostIf+"/disable_ipv6", []byte("1"), 0o644)
	if errors.Is(err, os.ErrNotExist) {
		return nil // IPv6 is off in the node already
	}
	return err
}
