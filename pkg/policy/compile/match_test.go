package compile

import (
	"net/netip"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// Match is the reference reading of policy.Rules, what the datapath must
// answer: is traffic with the peer address addr, protocol proto and
// (destination) port allowed in this direction?
func Match(r policy.Rules, addr netip.Addr, proto uint8, port uint16) bool {
	if !r.Isolated {
		return true
	}
	addr = addr.Unmap()
	best := -1
	for i, a := range r.Allows {
		if a.Prefix.Contains(addr) && (best < 0 || a.Prefix.Bits() > r.Allows[best].Prefix.Bits()) {
			best = i
		}
	}
	if best < 0 {
		return false
	}
	a := r.Allows[best]
	return a.AllPorts || portSet{ranges: a.Ports}.allows(proto, port)
}

func (p portSet) allows(proto uint8, port uint16) bool {
	if p.all {
		return true
	}
	for _, r := range p.ranges {
		if r.Proto == proto && r.First <= port && port <= r.Last {
			return true
		}
	}
	return false
}
