package endpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The pod's routes through a gateway point at a nexthop object of the pod
// netns (ip nexthop), one per interface and gateway, shared by the route in
// the interface's table and its twin in the main table. The kernel keeps a
// learned path MTU (a "fragmentation needed" / "packet too big" exception) on
// the next hop of the route that the error's quoted packet looks up: its
// source is the pod's address, so the rule "from <address> lookup <table>"
// sends it to the interface's table. An unbound socket's next datagrams look
// up with no source, in the main table. With a next hop of its own per route
// the exception sat where the pod's sends never looked and every oversized
// datagram was lost for good (TestTunnelUDPBeyondPathMTUHostPortAndPod, v4 and v6);
// a shared nexthop object holds one exception that both lookups see.

// Kernel uapi (linux/nexthop.h, linux/rtnetlink.h) that x/sys does not name.
const (
	nhaID      = 1  // NHA_ID
	nhaOIF     = 5  // NHA_OIF
	nhaGateway = 6  // NHA_GATEWAY
	rtaNhID    = 30 // RTA_NH_ID

	// nexthopsPerTable bounds the gateways an interface's routes use: its
	// nexthop ids are table*nexthopsPerTable + i.
	nexthopsPerTable = 64
)

// nhMsg is struct nhmsg.
type nhMsg struct {
	family   uint8
	protocol uint8 // RTPROT_BOOT on create; 0 on delete (the kernel refuses any other)
	flags    uint32
}

func (m *nhMsg) Len() int { return 8 }

func (m *nhMsg) Serialize() []byte {
	b := make([]byte, 8)
	b[0] = m.family
	b[2] = m.protocol
	binary.NativeEndian.PutUint32(b[4:], m.flags)
	return b
}

// podNexthops gives every distinct gateway of routes an id in table's
// range, and lists those gateways.
func podNexthops(table int, routes []*netlinkRoute) (map[string]uint32, []net.IP, error) {
	ids := map[string]uint32{}
	var gws []net.IP
	for _, rt := range routes {
		k := rt.gw.String()
		if _, ok := ids[k]; ok {
			continue
		}
		if len(gws) == nexthopsPerTable {
			return nil, nil, fmt.Errorf("the interface's routes use more than %d gateways", nexthopsPerTable)
		}
		id := uint64(table)*nexthopsPerTable + uint64(len(gws)) + 1
		if id > 1<<32-1 {
			return nil, nil, fmt.Errorf("nexthop id of table %d out of range", table)
		}
		ids[k] = uint32(id)
		gws = append(gws, rt.gw)
	}
	return ids, gws, nil
}

// addNexthop creates nexthop id via gw on ifindex, on-link as the pod's
// gateway is, in the calling thread's netns. The interface is new (ADD
// makes the veth; a nexthop goes with its device), so an id taken is
// another tool's: refused, never replaced (that would move its routes).
func addNexthop(id uint32, ifindex int, gw net.IP) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWNEXTHOP, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	m := &nhMsg{family: unix.AF_INET6, protocol: unix.RTPROT_BOOT, flags: unix.RTNH_F_ONLINK}
	if g4 := gw.To4(); g4 != nil {
		m.family, gw = unix.AF_INET, g4
	}
	req.AddData(m)
	req.AddData(nl.NewRtAttr(nhaID, nl.Uint32Attr(id)))
	req.AddData(nl.NewRtAttr(nhaOIF, nl.Uint32Attr(uint32(ifindex))))
	req.AddData(nl.NewRtAttr(nhaGateway, []byte(gw)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return &conflictError{fmt.Sprintf("nexthop id %d (via %s): the pod already has a nexthop object with that id, not ours; it is never replaced", id, gw)}
		}
		return fmt.Errorf("add nexthop %d via %s: %w", id, gw, err)
	}
	return nil
}

// addNexthopRoute adds dst through nexthop id to table (0: main), failing
// with EEXIST when table has a route to dst.
func addNexthopRoute(dst *net.IPNet, id uint32, table int) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	m := nl.NewRtMsg()
	ones, _ := dst.Mask.Size()
	ip := dst.IP.To4()
	m.Family = unix.AF_INET
	if ip == nil {
		ip, m.Family = dst.IP.To16(), unix.AF_INET6
	}
	m.Dst_len = uint8(ones)
	if table == 0 {
		table = unix.RT_TABLE_MAIN
	}
	m.Table = unix.RT_TABLE_UNSPEC
	req.AddData(m)
	if ones > 0 {
		req.AddData(nl.NewRtAttr(unix.RTA_DST, []byte(ip.Mask(dst.Mask))))
	}
	req.AddData(nl.NewRtAttr(unix.RTA_TABLE, nl.Uint32Attr(uint32(table))))
	req.AddData(nl.NewRtAttr(rtaNhID, nl.Uint32Attr(id)))
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// deleteNexthopsOn removes the nexthop objects on the pod interface with
// that ifindex, in the calling thread's netns (their routes go with them),
// and says how many. DEL calls it before the veth goes (issue 30): a
// nexthop object the veth's unregistering removes holds the device until
// an RCU callback frees it, and the unregistering waited for that
// reference, which ptp's plain routes do not make it do. Only objects the
// kernel would remove with the device anyway: those whose device it is.
func deleteNexthopsOn(ifindex int) int {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEXTHOP, unix.NLM_F_DUMP)
	req.AddData(&nhMsg{family: unix.AF_UNSPEC})
	req.AddData(nl.NewRtAttr(nhaOIF, nl.Uint32Attr(uint32(ifindex))))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEXTHOP)
	if err != nil {
		return 0 // the veth's deletion removes them, only slower
	}
	n := 0
	for _, m := range msgs {
		if len(m) < 8 {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[8:])
		if err != nil {
			continue
		}
		var id, oif uint32
		for _, a := range attrs {
			if len(a.Value) < 4 {
				continue
			}
			switch a.Attr.Type {
			case nhaID:
				id = binary.NativeEndian.Uint32(a.Value)
			case nhaOIF:
				oif = binary.NativeEndian.Uint32(a.Value)
			}
		}
		if id == 0 || oif != uint32(ifindex) {
			continue // a filter the kernel did not apply
		}
		del := nl.NewNetlinkRequest(unix.RTM_DELNEXTHOP, unix.NLM_F_ACK)
		del.AddData(&nhMsg{family: unix.AF_UNSPEC})
		del.AddData(nl.NewRtAttr(nhaID, nl.Uint32Attr(id)))
		if _, err := del.Execute(unix.NETLINK_ROUTE, 0); err == nil {
			n++
		}
	}
	return n
}
