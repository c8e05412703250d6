package main

import "testing"

// TestBalancedOrder: over a cycle of rounds each configuration runs in
// every place equally often, and right after each of the others equally
// often (the latency rounds' order, roundOrder).
func TestBalancedOrder(t *testing.T) {
	for n := 2; n <= 7; n++ {
		cycle := n
		if n%2 == 1 {
			cycle = 2 * n
		}
		place := map[[2]int]int{}
		after := map[[2]int]int{}
		for i := range cycle {
			row := balancedOrder(n, i)
			seen := map[int]bool{}
			for k, c := range row {
				if c < 0 || c >= n || seen[c] {
					t.Fatalf("n=%d round %d: %v is not a permutation of 0..%d", n, i, row, n-1)
				}
				seen[c] = true
				place[[2]int{c, k}]++
				if k > 0 {
					after[[2]int{row[k-1], c}]++
				}
			}
		}
		for c := range n {
			for k := range n {
				if got := place[[2]int{c, k}]; got != cycle/n {
					t.Errorf("n=%d: configuration %d in place %d %d times in %d rounds, want %d", n, c, k, got, cycle, cycle/n)
				}
			}
			for d := range n {
				want := cycle / n // each ordered pair of neighbours, alike
				if c == d {
					want = 0
				}
				if got := after[[2]int{c, d}]; got != want {
					t.Errorf("n=%d: %d right after %d %d times in %d rounds, want %d", n, d, c, got, cycle, want)
				}
			}
		}
	}
}
