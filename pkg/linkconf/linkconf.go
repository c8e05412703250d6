// Package linkconf sets a link's per-device IPv4 settings (the
// net.ipv4.conf.<link>.* sysctls) by netlink rather than /proc/sys: /proc/sys
// is read-only in the agent's container, and each pod netns that writes it
// costs every later /proc/sys/net lookup on the node (pkg/endpoint/netconf.go).
package linkconf

import (
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// IPV4_DEVCONF_* of linux/ip.h (one more than the sysctl's index).
const (
	RPFilter  = 8  // IPV4_DEVCONF_RP_FILTER: 0 off, 1 strict, 2 loose
	ARPNotify = 22 // IPV4_DEVCONF_ARP_NOTIFY
)

// SetIPv4 sets one IPV4_DEVCONF_* value of the link with that ifindex
// (RTM_SETLINK, IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF), in the calling
// thread's netns.
func SetIPv4(ifindex int, key int, value uint32) error {
	return setIPv4(nil, ifindex, key, value, false)
}

// SetIPv4UpOn is SetIPv4 that also brings the link up, in the same request:
// the kernel applies the flags, then the value, in one hold of RTNL, which
// every link change of the node queues for. sockets, when not nil, are kept
// netlink sockets to send it on (their netns's link, not the thread's).
func SetIPv4UpOn(sockets map[int]*nl.SocketHandle, ifindex int, key int, value uint32) error {
	return setIPv4(sockets, ifindex, key, value, true)
}

func setIPv4(sockets map[int]*nl.SocketHandle, ifindex int, key int, value uint32, up bool) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = sockets
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	if up {
		msg.Flags, msg.Change = unix.IFF_UP, unix.IFF_UP
	}
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	conf := spec.AddRtAttr(unix.AF_INET, nil).AddRtAttr(unix.IFLA_INET_CONF, nil)
	conf.AddRtAttr(key, nl.Uint32Attr(value))
	req.AddData(spec)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}
