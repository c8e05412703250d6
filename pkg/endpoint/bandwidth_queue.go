package endpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// The ingress queue of a pod with an ingress limit (why: bpf/lib/bandwidth.h,
// measurements: docs/bandwidth.md). An HTB on the host veth with one class at
// the rate, which the to-pod program's bucket feeds and mirrors:
//
//   - a size table with no overhead makes HTB count skb->len, as the bucket
//     and TCP pacing do (by default it counts every GSO segment's headers,
//     about 4% more, and the bucket would then see a backlog that is not
//     there, or miss one that is);
//   - the program admits into the queue what would wait at most its capacity
//     (queueDelay and the class's burst), drops the rest, and marks
//     ECN-capable packets CE beyond markDelay of backlog;
//   - the leaf's byte limit is only a backstop the bucket never lets fill.
const (
	queueHandle = 0x0001_0000 // 1:
	queueClass  = 0x0001_0010 // 1:10, HTB's default class
	queueLeaf   = 0x0010_0000 // 10:, the class's bfifo

	// classBurst is what the class may send at line rate after an idle
	// spell, over its rate: any 1 s interval carries at most the rate and this.
	classBurst = time.Millisecond
	// queueDelay is the queue's capacity: traffic TCP cannot slow down
	// (UDP, many flows at once) waits at most this long, the rest is dropped.
	queueDelay = 10 * time.Millisecond
	// markDelay is the backlog over which ECN-capable packets are marked CE,
	// so that ECN senders slow down before anything queues for long.
	markDelay = 2 * time.Millisecond
	// windowDelay sizes the pod's TCP receive window towards peers the node
	// does not pace: they keep that much of the rate in flight, which is the
	// queue they build.
	windowDelay = 2 * time.Millisecond
	// minWindowFrames keeps the window at two full segments at low rates
	// (a delayed ACK covers two): one frame of queue is 1.2 ms at 10 Mbit/s.
	minWindowFrames = 2
)

// ingressQueue is the qdisc set of one host veth.
type ingressQueue struct {
	rateBps    uint64 // bits per second
	burstBytes uint32 // the class's burst and cburst
	limitBytes uint32 // the leaf's limit
}

// bytesIn is d worth of rate, in bytes.
func bytesIn(rateBps uint64, d time.Duration) uint64 {
	return uint64(float64(rateBps) / 8 * d.Seconds())
}

// planIngressQueue sizes the queue of an ingress limit and the bucket that
// goes with it. frame is the host veth's largest frame (MTU + Ethernet header).
func planIngressQueue(l maps.Limit, frame int) (ingressQueue, maps.Limit) {
	f := uint64(frame)
	// The class's burst: at most the requested (capped) burst, at least two
	// frames (HTB sends whole packets).
	burst := max(min(bytesIn(l.RateBps, classBurst), l.BurstBits/8), 2*f)
	// The bucket also covers what the class sends at line rate.
	capacity := max(bytesIn(l.RateBps, queueDelay), 4*f) + burst
	mark := max(bytesIn(l.RateBps, markDelay), 2*f)
	// A GSO packet admitted while the backlog is just within the capacity
	// can add 64 KiB.
	limit := min(capacity+64<<10, math.MaxUint32)
	ns := func(bytes uint64) uint64 { return uint64(float64(bytes) * 8 * 1e9 / float64(l.RateBps)) }
	queued := l
	queued.QueueNs, queued.MarkNs = ns(capacity), ns(mark)
	return ingressQueue{rateBps: htbRate(l.RateBps), burstBytes: uint32(min(burst, math.MaxUint32)), limitBytes: uint32(limit)}, queued
}

// htbRate is the class rate for a limit of rateBps. The netlink library
// writes the low 32 bits of the rate in bytes/s into the legacy field beside
// TCA_HTB_RATE64, and the kernel refuses a class whose legacy rate is 0: an
// exact multiple of 2^32 bytes/s (32 Gibit/s, 64 Gibit/s, ...) runs one
// byte/s faster instead.
func htbRate(rateBps uint64) uint64 {
	if (rateBps/8)%(1<<32) == 0 {
		return rateBps + 8
	}
	return rateBps
}

// podRcvWnd is the receive window clamp of the TCP sockets of a pod with this
// ingress rate; mtu is its interface's.
func podRcvWnd(rateBps uint64, mtu int) uint32 {
	return uint32(min(max(bytesIn(rateBps, windowDelay), minWindowFrames*uint64(mtu)), math.MaxInt32))
}

// errNoQueue: the kernel has no HTB (or no qdiscs); the bucket polices alone.
var errNoQueue = errors.New("the kernel has no sch_htb")

// queueUnsupported tells a kernel without the qdisc kinds (ENOENT: unknown
// kind; EOPNOTSUPP: no traffic control at all) from other failures.
func queueUnsupported(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP)
}

// installIngressQueue puts the queue on a freshly created host veth. It
// returns errNoQueue when the kernel lacks HTB; the veth's deletion removes
// the queue, so a failed ADD has nothing more to undo.
func installIngressQueue(link netlink.Link, q ingressQueue) error {
	idx := link.Attrs().Index
	if err := addQdisc(idx, queueHandle, netlink.HANDLE_ROOT, "htb", htbOptions(), true); err != nil {
		if queueUnsupported(err) {
			return errNoQueue
		}
		return fmt.Errorf("add htb qdisc to %s: %w", link.Attrs().Name, err)
	}
	class := netlink.NewHtbClass(
		netlink.ClassAttrs{LinkIndex: idx, Parent: queueHandle, Handle: queueClass},
		netlink.HtbClassAttrs{Rate: q.rateBps, Ceil: q.rateBps, Buffer: q.burstBytes, Cbuffer: q.burstBytes,
			// One class: the quantum only silences the kernel's warning
			// about the one it would derive from the rate.
			Quantum: 60000})
	if err := netlink.ClassAdd(class); err != nil {
		if queueUnsupported(err) {
			return errNoQueue
		}
		return fmt.Errorf("add htb class %s to %s: %w", netlink.HandleStr(queueClass), link.Attrs().Name, err)
	}
	limit := make([]byte, 4) // struct tc_fifo_qopt
	binary.NativeEndian.PutUint32(limit, q.limitBytes)
	if err := addQdisc(idx, queueLeaf, queueClass, "bfifo", nl.NewRtAttr(nl.TCA_OPTIONS, limit), false); err != nil {
		return fmt.Errorf("add bfifo qdisc to %s: %w", link.Attrs().Name, err)
	}
	return nil
}

func htbOptions() *nl.RtAttr {
	opts := nl.NewRtAttr(nl.TCA_OPTIONS, nil)
	glob := nl.TcHtbGlob{Version: 3, Rate2Quantum: 10, Defcls: queueClass & 0xffff}
	opts.AddRtAttr(nl.TCA_HTB_INIT, glob.Serialize())
	return opts
}

// sizeTable is TCA_STAB with a struct tc_sizespec of no overhead and no
// table: the qdisc then counts skb->len.
func sizeTable() *nl.RtAttr {
	const tcaStabBase = 1
	spec := make([]byte, 24)                   // cell_log, size_log, cell_align, overhead, linklayer, mpu, mtu, tsize
	binary.NativeEndian.PutUint32(spec[8:], 1) // TC_LINKLAYER_ETHERNET
	stab := nl.NewRtAttr(nl.TCA_STAB, nil)
	stab.AddRtAttr(tcaStabBase, spec)
	return stab
}

// addQdisc creates a qdisc (netlink has no size tables, hence by hand).
func addQdisc(ifindex int, handle, parent uint32, kind string, opts *nl.RtAttr, stab bool) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWQDISC, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex), Handle: handle, Parent: parent})
	req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated(kind)))
	req.AddData(opts)
	if stab {
		req.AddData(sizeTable())
	}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// rootQdisc is what CHECK reads of a host veth's root qdisc.
type rootQdisc struct {
	kind      string
	handle    uint32
	sizeTable bool // a size table without overhead or cells
}

// readRootQdisc dumps the qdiscs of a link and returns its root one.
func readRootQdisc(ifindex int) (*rootQdisc, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETQDISC, unix.NLM_F_DUMP)
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex)})
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWQDISC)
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		msg := nl.DeserializeTcMsg(m)
		if int(msg.Ifindex) != ifindex || msg.Parent != netlink.HANDLE_ROOT {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[msg.Len():])
		if err != nil {
			return nil, err
		}
		q := &rootQdisc{handle: msg.Handle}
		for _, a := range attrs {
			switch a.Attr.Type {
			case nl.TCA_KIND:
				q.kind = string(a.Value[:max(len(a.Value)-1, 0)])
			case nl.TCA_STAB:
				nested, err := nl.ParseRouteAttr(a.Value)
				if err != nil {
					return nil, err
				}
				for _, n := range nested {
					if n.Attr.Type == 1 && len(n.Value) >= 24 {
						overhead := int32(binary.NativeEndian.Uint32(n.Value[4:]))
						tsize := binary.NativeEndian.Uint32(n.Value[20:])
						q.sizeTable = overhead == 0 && tsize == 0
					}
				}
			}
		}
		return q, nil
	}
	return nil, nil
}

// checkIngressQueue tells whether the host veth has the queue, and fails
// when it has one that differs from q.
func checkIngressQueue(link netlink.Link, q ingressQueue) (bool, error) {
	name := link.Attrs().Name
	root, err := readRootQdisc(link.Attrs().Index)
	if err != nil {
		return false, fmt.Errorf("read the qdiscs of %s: %w", name, err)
	}
	if root == nil || root.kind != "htb" || root.handle != queueHandle {
		return false, nil
	}
	if !root.sizeTable {
		return true, fmt.Errorf("the htb ingress queue of %s counts GSO headers (no size table), the bucket does not", name)
	}
	// netlinksafe has no ClassList: retry an interrupted dump here, as it would.
	var classes []netlink.Class
	for try := 0; try < 5; try++ {
		// lint:raw-netlink-dump: retried on ErrDumpInterrupted in this loop.
		if classes, err = netlink.ClassList(link, queueHandle); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return true, fmt.Errorf("read the htb classes of %s: %w", name, err)
	}
	for _, c := range classes {
		h, ok := c.(*netlink.HtbClass)
		if !ok || h.Handle != queueClass {
			continue
		}
		if h.Rate != q.rateBps/8 || h.Ceil != q.rateBps/8 {
			return true, fmt.Errorf("htb class %s of %s runs at %d bit/s (ceil %d), want %d bit/s",
				netlink.HandleStr(queueClass), name, h.Rate*8, h.Ceil*8, q.rateBps)
		}
		return true, nil
	}
	return true, fmt.Errorf("the htb ingress queue of %s has no class %s", name, netlink.HandleStr(queueClass))
}
