package main

import "slices"

// roundOrder is round i's order of the configurations: row i of a
// Williams design (balancedOrder). Rotation alone kept every configuration
// behind the same one, and what the one before leaves running (its pod's
// netns teardown, a veth the agent deletes) lands on the next: the tunnel
// on measured 1.04-1.12x the tunnel off's ADD in three runs while the
// plugin's own traced time was no higher, and ebpf-cni's ADD read 1.20x
// ptp's beside the tunnel configurations instead of 1.08x (round 13). Over
// each cycle of rounds every configuration now runs in every place, and
// right after each of the others, alike.
func (b *bench) roundOrder(i int) []*config {
	out := make([]*config, 0, len(b.configs))
	for _, j := range balancedOrder(len(b.configs), i) {
		out = append(out, b.configs[j])
	}
	return out
}

// balancedOrder is row i of a Williams design for n treatments: 0, n-1,
// 1, n-2, 2, ... shifted by i mod n, so each ordered pair of neighbours
// occurs once in n rows when n is even; for odd n the next n rows are the
// first n reversed, and each pair occurs twice in 2n.
func balancedOrder(n, i int) []int {
	row := make([]int, n)
	lo, hi := 0, n-1
	for k := range row {
		v := lo
		if k%2 == 0 {
			lo++
		} else {
			v, hi = hi, hi-1
		}
		row[k] = (v + i) % n
	}
	if n%2 == 1 && (i/n)%2 == 1 {
		slices.Reverse(row)
	}
	return row
}
