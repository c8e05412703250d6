package compile

import (
	"slices"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// portSet is what a peer may use: everything (all protocols, ICMP too), or
// the listed protocol/port ranges, kept normalized (sorted by protocol then
// First, overlapping and adjacent ranges merged) so equality is a slice
// comparison.
type portSet struct {
	all    bool
	ranges []policy.PortRange
}

var allPorts = portSet{all: true}

func (p portSet) empty() bool { return !p.all && len(p.ranges) == 0 }

func (p portSet) equal(q portSet) bool {
	return p.all == q.all && (p.all || slices.Equal(p.ranges, q.ranges))
}

// union returns a new set; neither argument is modified or aliased when both
// are non-empty, so cached sets can be shared.
func union(a, b portSet) portSet {
	switch {
	case a.all || b.all:
		return allPorts
	case len(a.ranges) == 0:
		return b
	case len(b.ranges) == 0:
		return a
	}
	r := make([]policy.PortRange, 0, len(a.ranges)+len(b.ranges))
	r = append(r, a.ranges...)
	r = append(r, b.ranges...)
	return portSet{ranges: normalize(r)}
}

// normalize sorts and merges r in place and returns the shortened slice.
func normalize(r []policy.PortRange) []policy.PortRange {
	if len(r) < 2 {
		return r
	}
	slices.SortFunc(r, func(x, y policy.PortRange) int {
		if x.Proto != y.Proto {
			return int(x.Proto) - int(y.Proto)
		}
		return int(x.First) - int(y.First)
	})
	out := r[:1]
	for _, x := range r[1:] {
		last := &out[len(out)-1]
		// Adjacent ranges merge too (uint32 so Last 65535 does not wrap).
		if x.Proto == last.Proto && uint32(x.First) <= uint32(last.Last)+1 {
			if x.Last > last.Last {
				last.Last = x.Last
			}
			continue
		}
		out = append(out, x)
	}
	return out
}
