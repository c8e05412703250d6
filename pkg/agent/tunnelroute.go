package agent

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// tunnelEncap is the route-level tunnel key of a route into the tunnel
// device (lightweight tunnel "encap ip"/"encap ip6": `ip route ... encap
// ip id 1 dst <node> ttl 64 dev ebpf-tun`). The collect_md device reads
// the destination node from the route, and the packet keeps its route:
// a smaller path MTU the device learns is recorded on it, and the stack
// tells the sender ("fragmentation needed", "packet too big"). A program
// setting the key (bpf_skb_set_tunnel_key) would replace the route with
// the key's, and the path MTU would be lost (docs/tunnel.md).
type tunnelEncap struct {
	Dst net.IP // the node's address, IPv4 or IPv6
}

// The attributes of LWTUNNEL_ENCAP_IP and _IP6 (linux/lwtunnel.h): ID,
// DST, SRC, TTL/HOPLIMIT, TOS/TC, FLAGS share their numbers.
const (
	lwtIPID    = 1
	lwtIPDst   = 2
	lwtIPTTL   = 4
	lwtIPFlags = 6
	// tunnelDontFragment is TUNNEL_DONT_FRAGMENT (big endian on the wire):
	// DF on the outer IPv4 header, so a smaller link answers with
	// "fragmentation needed" rather than fragmenting every packet.
	tunnelDontFragment = 0x0100
	// tunnelCsum is TUNNEL_CSUM: a checksum in the outer UDP header.
	// Asked for over IPv6 only: a VXLAN socket (udp6zerocsumrx off, as
	// IPv6 requires of UDP, and so do middleboxes) drops IPv6 datagrams
	// without one as Udp6InCsumErrors. It costs little: the outer sum is
	// derived from the inner's (local checksum offload). IPv4 may go
	// without (RFC 768), which saves even that.
	tunnelCsum = 0x0001
	tunnelVNI  = 1 // bpf/lib/tunnel.h TUN_VNI
)

func (e *tunnelEncap) Type() int {
	if e.Dst.To4() != nil {
		return nl.LWTUNNEL_ENCAP_IP
	}
	return nl.LWTUNNEL_ENCAP_IP6
}

func (e *tunnelEncap) Decode([]byte) error { return nil }

func (e *tunnelEncap) Encode() ([]byte, error) {
	dst := e.Dst.To4()
	if dst == nil {
		dst = e.Dst.To16()
	}
	if dst == nil {
		return nil, fmt.Errorf("tunnel endpoint %v is not an IP address", e.Dst)
	}
	id := make([]byte, 8)
	binary.BigEndian.PutUint64(id, tunnelVNI)
	flags := make([]byte, 2)
	f := uint16(tunnelDontFragment)
	if len(dst) == net.IPv6len {
		f |= tunnelCsum
	}
	binary.BigEndian.PutUint16(flags, f)
	var out []byte
	for _, a := range []*nl.RtAttr{
		nl.NewRtAttr(lwtIPID, id),
		nl.NewRtAttr(lwtIPDst, dst),
		nl.NewRtAttr(lwtIPTTL, []byte{64}),
		nl.NewRtAttr(lwtIPFlags, flags),
	} {
		out = append(out, a.Serialize()...)
	}
	return out, nil
}

func (e *tunnelEncap) String() string { return fmt.Sprintf("encap ip id %d dst %s", tunnelVNI, e.Dst) }

func (e *tunnelEncap) Equal(x netlink.Encap) bool {
	o, ok := x.(*tunnelEncap)
	return ok && o.Dst.Equal(e.Dst)
}

// tunnelRoute is the route of a pod CIDR into the tunnel toward node.
func tunnelRoute(dst *net.IPNet, node net.IP, ifindex int) netlink.Route {
	return netlink.Route{Dst: dst, LinkIndex: ifindex, Scope: netlink.SCOPE_LINK, Protocol: RouteProtocol,
		Encap: &tunnelEncap{Dst: node}}
}
