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
	nhaID        = 1  // NHA_ID
	nhaOIF       = 5  // NHA_OIF
	nhaGateway   = 6  // NHA_GATEWAY
	rtaNhID      = 30 // RTA_NH_ID
	nhaBlackhole = 4  // NHA_BLACKHOLE (a flag)

	// nexthopsPerTable bounds the gateways an interface's routes use: its
	// nexthop ids are table*nexthopsPerTable + i.
	nexthopsPerTable = 64

	// parkedProtocol marks a nexthop object parkNexthopsOn made a
	// blackhole: ebpf-cni's rtnetlink protocol number, as on the agent's
	// routes (datapath.PeerRouteProtocol).
	parkedProtocol = 199
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
func addNexthop(r *rtnl, id uint32, ifindex int, gw net.IP) error {
	req := r.request(unix.RTM_NEWNEXTHOP, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
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
func addNexthopRoute(r *rtnl, dst *net.IPNet, id uint32, table int) error {
	req := r.request(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
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

// podNexthop is a nexthop object of the pod netns as a dump gives it.
type podNexthop struct {
	id, oif          uint32
	family, protocol uint8
	blackhole        bool
}

// parked says that nh is one parkNexthopsOn made a blackhole: a blackhole
// of its protocol (another tool's have their own, and are never touched).
func (nh podNexthop) parked() bool { return nh.blackhole && nh.protocol == parkedProtocol }

// listNexthops dumps the nexthop objects of r's netns (nil: the calling
// thread's; a pod's: a few).
func listNexthops(r *rtnl) ([]podNexthop, error) {
	req := r.request(unix.RTM_GETNEXTHOP, unix.NLM_F_DUMP)
	req.AddData(&nhMsg{family: unix.AF_UNSPEC})
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEXTHOP)
	if err != nil {
		return nil, err
	}
	var nhs []podNexthop
	for _, m := range msgs {
		if len(m) < 8 {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[8:])
		if err != nil {
			continue
		}
		nh := podNexthop{family: m[0], protocol: m[2]} // struct nhmsg: family, scope, protocol
		for _, a := range attrs {
			switch {
			case a.Attr.Type == nhaBlackhole:
				nh.blackhole = true
			case len(a.Value) < 4:
			case a.Attr.Type == nhaID:
				nh.id = binary.NativeEndian.Uint32(a.Value)
			case a.Attr.Type == nhaOIF:
				nh.oif = binary.NativeEndian.Uint32(a.Value)
			}
		}
		if nh.id != 0 {
			nhs = append(nhs, nh)
		}
	}
	return nhs, nil
}

// deleteNexthop removes nexthop object id (its routes go with it).
func deleteNexthop(r *rtnl, id uint32) error {
	del := r.request(unix.RTM_DELNEXTHOP, unix.NLM_F_ACK)
	del.AddData(&nhMsg{family: unix.AF_UNSPEC})
	del.AddData(nl.NewRtAttr(nhaID, nl.Uint32Attr(id)))
	_, err := del.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// parkNexthopsOn is DEL's step before the veth goes when the pod's lo is
// up (loUp): each nexthop object on the interface ifindex becomes a
// blackhole one of the same id (NLM_F_REPLACE), its routes now through lo.
// The replace queues the release of the old next hop's hold on the veth as
// one RCU callback at once, which the veth's unregistering waits for with
// the barrier it makes anyway. Deleted instead, an object's routes free
// their fib_info in one callback, which then queues the one that drops the
// veth: the unregistering waited for a second rcu_barrier (issue 30,
// docs/performance.md round 14). The kernel binds a blackhole to lo and
// refuses it while lo is down: then, or when a replace fails, the object
// is deleted as before. Says whether objects of the interface's table are
// blackholes now (parked here, or by a DEL killed before it swept them):
// sweepParked removes them once the veth is gone.
func parkNexthopsOn(r *rtnl, ifindex int, loUp bool) (parked bool) {
	nhs, err := listNexthops(r)
	if err != nil {
		return false // the veth's deletion removes them, only slower
	}
	for _, nh := range nhs {
		switch {
		case nh.oif == uint32(ifindex) && loUp && replaceByBlackhole(r, nh) == nil:
			parked = true
		case nh.oif == uint32(ifindex):
			_ = deleteNexthop(r, nh.id)
		case nh.parked() && nexthopTable(nh.id) == podTable(ifindex):
			// Parked by a DEL killed before its sweep, whatever lo is
			// now (the pod may have brought it down since: attack18).
			parked = true
		}
	}
	return parked
}

// replaceByBlackhole makes nexthop object nh a blackhole of its family.
func replaceByBlackhole(r *rtnl, nh podNexthop) error {
	req := r.request(unix.RTM_NEWNEXTHOP, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
	req.AddData(&nhMsg{family: nh.family, protocol: parkedProtocol})
	req.AddData(nl.NewRtAttr(nhaID, nl.Uint32Attr(nh.id)))
	req.AddData(nl.NewRtAttr(nhaBlackhole, nil))
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// nexthopTable is the pod table whose range (podNexthops) holds id.
func nexthopTable(id uint32) int { return int((uint64(id) - 1) / nexthopsPerTable) }

// sweepParked deletes, in r's netns (nil: the calling thread's), the parked nexthop
// objects (and their routes) of pod tables whose interface is gone
// (parkNexthopsOn's, once the veth went; an interface still there is
// another DEL's to sweep). Left, they would blackhole the pod's routes in
// a netns that outlives the interface (a second network's DEL, podman's
// network disconnect), and a later ADD's nexthop id could meet them.
func sweepParked(r *rtnl) error {
	nhs, err := listNexthops(r)
	if err != nil {
		return fmt.Errorf("list the pod's nexthop objects: %w", err)
	}
	links, err := r.orEach().LinkList()
	if err != nil {
		return fmt.Errorf("list the pod's links: %w", err)
	}
	present := map[int]bool{}
	for _, l := range links {
		present[podTable(l.Attrs().Index)] = true
	}
	var errs error
	for _, nh := range nhs {
		if t := nexthopTable(nh.id); nh.parked() && t > podTableBase && !present[t] {
			if err := deleteNexthop(r, nh.id); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = errors.Join(errs, fmt.Errorf("delete blackhole nexthop %d: %w", nh.id, err))
			}
		}
	}
	return errs
}
