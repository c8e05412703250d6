package endpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Which node ports masquerade allocates from (cni_masq_config). A
// masqueraded flow is (node address, port, peer, peer port, protocol) on
// the wire: the node's own connections must never get the same tuple, and
// the kernel knows nothing of BPF's ports. So the default is every port from
// 1024 but the node's ephemeral range (ip_local_port_range, where its own
// connections' ports come from) and Kubernetes' default NodePort range;
// with the kernel's default 32768-60999 that is 1024-29999 and 61000-65535,
// 33512 ports per destination. The BPF side also skips a port a node
// socket is bound to, and the node's hostPorts.
//
// A node whose ephemeral range leaves fewer than masqMinPorts (1024-65535,
// say) gets masqFallback instead, and ADD adds it to the node's
// ip_local_reserved_ports: the kernel then never picks those ports for the
// node's own connections (bind and listen on them explicitly still work,
// and the BPF side skips a port a node socket holds), so they cannot
// collide with masqueraded flows. A configured range may overlap the
// ephemeral range only where the node reserved the ports.

const (
	masqPortFloor    = 1024  // below: privileged ports, as MASQUERADE keeps them
	nodePortLo       = 30000 // Kubernetes' default --service-node-port-range
	nodePortHi       = 32767
	masqMinPorts     = 1024 // fewer: refuse, rather than masquerade a busy node into drops
	masqPodShareDiv  = 8    // default pod limit: an eighth of the ports per destination
	ephemeralSysctl  = "/proc/sys/net/ipv4/ip_local_port_range"
	reservedSysctl   = "/proc/sys/net/ipv4/ip_local_reserved_ports"
	masqPortRangeKey = "ipMasqPortRange"
	masqPodLimitKey  = "ipMasqPodPortLimit"
)

// parsePortRange parses "lo-hi".
func parsePortRange(s string) ([2]uint16, error) {
	lo, hi, ok := strings.Cut(strings.TrimSpace(s), "-")
	a, err1 := strconv.Atoi(strings.TrimSpace(lo))
	b, err2 := strconv.Atoi(strings.TrimSpace(hi))
	if !ok || err1 != nil || err2 != nil {
		return [2]uint16{}, ConfError("%s: %q is not a port range (want \"first-last\", e.g. \"40000-60000\")", masqPortRangeKey, s)
	}
	if a < masqPortFloor || b > 65535 || a > b {
		return [2]uint16{}, ConfError("%s: %q is out of range (%d-65535, first <= last)", masqPortRangeKey, s, masqPortFloor)
	}
	return [2]uint16{uint16(a), uint16(b)}, nil
}

// nodeEphemeralPorts reads the node's ip_local_port_range (the calling
// thread's netns: ADD runs in the node's).
func nodeEphemeralPorts() ([2]int, error) {
	b, err := os.ReadFile(ephemeralSysctl)
	if err != nil {
		return [2]int{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return [2]int{}, fmt.Errorf("%s: unexpected %q", ephemeralSysctl, b)
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo > hi {
		return [2]int{}, fmt.Errorf("%s: unexpected %q", ephemeralSysctl, b)
	}
	return [2]int{lo, hi}, nil
}

// masqFallback is the default of a node whose ephemeral range leaves too few
// ports outside it: the top of the port space (what the programs use
// without a configuration), reserved from the kernel's ephemeral choice.
var masqFallback = [2]int{61000, 65535}

// NodePorts is what the node's kernel allocates its own connections' ports
// from: ip_local_port_range but ip_local_reserved_ports (the calling
// thread's netns).
type NodePorts struct {
	Ephemeral [2]int
	Reserved  [][2]int
}

// ReadNodePorts reads the node's NodePorts.
func ReadNodePorts() (NodePorts, error) {
	eph, err := nodeEphemeralPorts()
	if err != nil {
		return NodePorts{}, err
	}
	b, err := os.ReadFile(reservedSysctl)
	if err != nil {
		return NodePorts{}, err
	}
	res, err := parsePortList(string(b))
	if err != nil {
		return NodePorts{}, fmt.Errorf("%s: %w", reservedSysctl, err)
	}
	return NodePorts{Ephemeral: eph, Reserved: res}, nil
}

// parsePortList parses ip_local_reserved_ports' "a-b,c" (empty: none).
func parsePortList(s string) ([][2]int, error) {
	var out [][2]int
	for _, f := range strings.Split(strings.TrimSpace(s), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		lo, hi, ok := strings.Cut(f, "-")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a > b {
			return nil, fmt.Errorf("unexpected %q", s)
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

// Unreserved is how many ports of [lo, hi] the kernel may pick for the
// node's own connections: in the ephemeral range and not reserved.
func (n NodePorts) Unreserved(lo, hi int) int {
	lo, hi = max(lo, n.Ephemeral[0]), min(hi, n.Ephemeral[1])
	if lo > hi {
		return 0
	}
	rs := [][2]int{{lo, hi}}
	for _, r := range n.Reserved {
		rs = subtract(rs, r[0], r[1])
	}
	c := 0
	for _, r := range rs {
		c += r[1] - r[0] + 1
	}
	return c
}

// MasqOverlap is how many ports of p the node's kernel may pick for its own
// connections (each may collide with a masqueraded flow to the same peer).
func (n NodePorts) MasqOverlap(p maps.MasqPorts) int {
	c := 0
	for _, r := range p.Ranges {
		c += n.Unreserved(int(r[0]), int(r[1]))
	}
	return c
}

// reserve adds [lo, hi] to the node's ip_local_reserved_ports (the kernel
// merges what is listed twice; two ADDs writing at once write the same).
func reserve(n NodePorts, r [2]int) error {
	list := make([]string, 0, len(n.Reserved)+1)
	for _, x := range append(n.Reserved, r) {
		list = append(list, fmt.Sprintf("%d-%d", x[0], x[1]))
	}
	return os.WriteFile(reservedSysctl, []byte(strings.Join(list, ",")), 0o644)
}

// subtract removes [lo, hi] from the ranges.
func subtract(rs [][2]int, lo, hi int) [][2]int {
	var out [][2]int
	for _, r := range rs {
		if hi < r[0] || lo > r[1] {
			out = append(out, r)
			continue
		}
		if r[0] < lo {
			out = append(out, [2]int{r[0], lo - 1})
		}
		if hi < r[1] {
			out = append(out, [2]int{hi + 1, r[1]})
		}
	}
	return out
}

// masqPorts is the configuration masquerade runs with on a node whose
// kernel allocates its connections' ports as n says: the configured range
// (nil: the default), checked against n, and the pod limit (0: the default
// share). toReserve is the range ADD must add to ip_local_reserved_ports
// first (the fallback default, when not reserved yet), else nil.
func masqPorts(configured *[2]uint16, podLimit int, n NodePorts) (p maps.MasqPorts, toReserve *[2]int, err error) {
	eph := n.Ephemeral
	if configured != nil {
		c := *configured
		if k := n.Unreserved(int(c[0]), int(c[1])); k > 0 {
			return p, nil, ConfError("%s %d-%d overlaps the node's ip_local_port_range %d-%d in %d ports not in ip_local_reserved_ports: the node's own connections would collide with masqueraded flows (narrow the range, or reserve its ports)",
				masqPortRangeKey, c[0], c[1], eph[0], eph[1], k)
		}
		p.Ranges = [][2]uint16{c}
	} else {
		rs := subtract([][2]int{{masqPortFloor, 65535}}, nodePortLo, nodePortHi)
		rs = subtract(rs, eph[0], eph[1])
		for _, r := range rs {
			p.Ranges = append(p.Ranges, [2]uint16{uint16(r[0]), uint16(r[1])})
		}
		if p.Size() < masqMinPorts {
			// Too few outside the ephemeral range: the fallback, taken
			// out of the kernel's choice.
			p.Ranges = [][2]uint16{{uint16(masqFallback[0]), uint16(masqFallback[1])}}
			if n.Unreserved(masqFallback[0], masqFallback[1]) > 0 {
				r := masqFallback
				toReserve = &r
			}
		}
	}
	switch {
	case podLimit < 0 || podLimit > p.Size():
		return p, nil, ConfError("%s: %d is out of range (1-%d, the ports of %s)", masqPodLimitKey, podLimit, p.Size(), p)
	case podLimit == 0:
		p.PodLimit = uint32(max(1, p.Size()/masqPodShareDiv))
	default:
		p.PodLimit = uint32(podLimit)
	}
	return p, toReserve, nil
}
