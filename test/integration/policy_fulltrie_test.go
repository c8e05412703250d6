package integration

import (
	"net/netip"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestPolicyFullTrieFailsOpen: cni_pol_addrs is one trie for the node,
// sized 512 entries per pod but with no share per pod. Pods whose policies
// name many peers (one namespace's ipBlock lists, which its own admin
// writes) fill it; then a NetworkPolicy that isolates another pod cannot be
// written, and that pod "keeps its previous policy": open. A full map must
// not leave a selected pod open (fail closed), nor may one pod take the
// room every other pod's policy needs.
func TestPolicyFullTrieFailsOpen(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	a, c := h.NewPod(), h.NewPod()
	h.CleanupDel(a, "a")
	h.CleanupDel(c, "c")
	a4, _ := resultIPs(h.Add(a, "a"))
	h.Add(c, "c")
	_, ia := h.HostVeth("a")
	_, ic := h.HostVeth("c")
	serve(t, a, 8080, "a")
	w := h.Maps().Policy().Writer()
	for _, idx := range []int{ia, ic} {
		if err := w.Apply(uint32(idx), policy.Endpoint{}); err != nil {
			t.Fatal(err)
		}
	}
	reach(t, c, "tcp", a4, 8080, "a")

	// Other interfaces' policies, 2000 peers each, then fewer, until not
	// one more entry fits (stand-ins for pods of a namespace with long
	// ipBlock lists; a write that fails undoes itself).
	next := uint32(1_000_000)
	for size := 2000; size > 0; {
		var allows []policy.Allow
		for j := 0; j < size; j++ {
			ip := netip.AddrFrom4([4]byte{100, byte(next), byte(j >> 8), byte(j)})
			allows = append(allows, allowAll(netip.PrefixFrom(ip, 32)))
		}
		idx := next
		next++
		t.Cleanup(func() { w.Remove(idx) })
		if err := w.Apply(idx, policy.Endpoint{Ingress: isolated(allows...)}); err != nil {
			size /= 2
		}
	}
	// a is now selected by a policy that lets in one other peer only.
	err := w.Apply(uint32(ia), policy.Endpoint{Ingress: isolated(allowAll(prefix("10.99.0.1/32")))})
	t.Logf("a's new policy: %v", err)
	blocked(t, c, "tcp", a4, 8080)
}
