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

const (
	masqPortFloor    = 1024  // below: privileged ports, as MASQUERADE keeps them
	nodePortLo       = 30000 // Kubernetes' default --service-node-port-range
	nodePortHi       = 32767
	masqMinPorts     = 1024 // fewer: refuse, rather than masquerade a busy node into drops
	masqPodShareDiv  = 8    // default pod limit: an eighth of the ports per destination
	ephemeralSysctl  = "/proc/sys/net/ipv4/ip_local_port_range"
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
// ephemeral range is eph: the configured range (nil: the default), checked
// against eph, and the pod limit (0: the default share).
func masqPorts(configured *[2]uint16, podLimit int, eph [2]int) (maps.MasqPorts, error) {
	var p maps.MasqPorts
	if configured != nil {
		c := *configured
		if int(c[0]) <= eph[1] && int(c[1]) >= eph[0] {
			return p, ConfError("%s %d-%d overlaps the node's ip_local_port_range %d-%d: the node's own connections would collide with masqueraded flows",
				masqPortRangeKey, c[0], c[1], eph[0], eph[1])
		}
		p.Ranges = [][2]uint16{c}
	} else {
		rs := subtract([][2]int{{masqPortFloor, 65535}}, nodePortLo, nodePortHi)
		rs = subtract(rs, eph[0], eph[1])
		for _, r := range rs {
			p.Ranges = append(p.Ranges, [2]uint16{uint16(r[0]), uint16(r[1])})
		}
		if p.Size() < masqMinPorts {
			return p, ConfError("ipMasq: the node's ip_local_port_range %d-%d leaves %d ports outside it and the NodePort range %d-%d (want at least %d): set %s, or narrow ip_local_port_range",
				eph[0], eph[1], p.Size(), nodePortLo, nodePortHi, masqMinPorts, masqPortRangeKey)
		}
	}
	switch {
	case podLimit < 0 || podLimit > p.Size():
		return p, ConfError("%s: %d is out of range (1-%d, the ports of %s)", masqPodLimitKey, podLimit, p.Size(), p)
	case podLimit == 0:
		p.PodLimit = uint32(max(1, p.Size()/masqPodShareDiv))
	default:
		p.PodLimit = uint32(podLimit)
	}
	return p, nil
}
