package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack25VanishedPeerFlowNotInherited: recycled identity when the pod
// that held an address did not get a plain DEL. v admits UDP from pod p
// only; p sends v datagrams from port 5555 (an entry in v's flow table,
// which outlives the policy change that follows: v's ingress allows
// nobody, as the agent writes it once p is gone). Then p's netns vanishes
// (the sandbox died), and either the runtime's GC (CNI 1.1, p not among
// the valid attachments) or its DEL with the netns gone releases p's
// address. q gets it (a two-address range) and sends v a datagram from the
// same port. The docs (networkpolicy.md, "Flows"): "DEL forgets the pod's
// flows, and every other pod's flows with the pod's addresses: the next
// pod given one of them does not inherit them". The plain DEL is
// policy_attack_test's dead-pods-flows-not-inherited; these are the two
// other ways an address goes back to IPAM. q must not reach v.
func TestAttack25VanishedPeerFlowNotInherited(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"gc", "del-netns-gone"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			h := newHPEnv(t)
			h.Extra["networkPolicy"] = true
			h.IPAM = map[string]any{"type": "host-local", "dataDir": h.DataDir, "ranges": [][]map[string]string{
				{{"subnet": "10.251.0.0/24", "rangeStart": "10.251.0.10", "rangeEnd": "10.251.0.11"}},
				{{"subnet": "fd00:251::/64", "rangeStart": "fd00:251::10", "rangeEnd": "fd00:251::11"}},
			}}
			m := h.Maps
			v, rv := h.RunPod("v")
			v4, v6 := resultIPs(rv)
			p := h.NewPod()
			h.CleanupDel(p, "p")
			p4, p6 := resultIPs(h.Add(p, "p"))
			pIP := map[int]net.IP{4: p4, 6: p6}
			w := m().Policy().Writer()
			_, vidx := h.HostVeth("v")
			pname, pidx := h.HostVeth("p")
			must(t, w.Apply(uint32(pidx), policy.Endpoint{}))
			must(t, w.Apply(uint32(vidx), policy.Endpoint{Ingress: isolated(allowAll(host(p4)), allowAll(host(p6)))}))
			ln := map[int]*net.UDPConn{4: udpSocket(t, v, v4), 6: udpSocket(t, v, v6)}
			send := func(from ns.NetNS, src map[int]net.IP, fam int, msg string) {
				t.Helper()
				must(t, from.Do(func(ns.NetNS) error {
					c, err := net.DialUDP("udp", &net.UDPAddr{IP: src[fam], Port: 5555}, ln[fam].LocalAddr().(*net.UDPAddr))
					if err != nil {
						return err
					}
					defer c.Close()
					_, err = c.Write([]byte(msg))
					return err
				}))
			}
			for _, fam := range []int{4, 6} {
				msg := fmt.Sprintf("from-p-v%d", fam)
				send(p, pIP, fam, msg)
				if !bigReceived(ln[fam], msg, 2*time.Second) {
					t.Fatalf("IPv%d: p's datagram, allowed, did not reach v", fam)
				}
			}
			// The agent follows p's end: nobody is allowed in any more; p's
			// flow still passes (flows outlive a policy change).
			must(t, w.Apply(uint32(vidx), policy.Endpoint{Ingress: isolated()}))
			for _, fam := range []int{4, 6} {
				msg := fmt.Sprintf("from-p-again-v%d", fam)
				send(p, pIP, fam, msg)
				if !bigReceived(ln[fam], msg, 2*time.Second) {
					t.Fatalf("IPv%d: p's datagram on its live flow did not reach v after v's policy changed (the docs: flows outlive a change)", fam)
				}
			}

			// p's sandbox dies; its address goes back to IPAM.
			destroyPod(t, p)
			h.WaitLinkGone(pname)
			switch how {
			case "gc":
				must(t, h.GC(types.GCAttachment{ContainerID: "v", IfName: "eth0"}))
			case "del-netns-gone":
				must(t, h.Del(p, "p", "eth0"))
			}

			q := h.NewPod()
			h.CleanupDel(q, "q")
			q4, q6 := resultIPs(h.Add(q, "q"))
			if !q4.Equal(p4) || !q6.Equal(p6) {
				t.Fatalf("q got %s and %s, want p's %s and %s", q4, q6, p4, p6)
			}
			_, qidx := h.HostVeth("q")
			must(t, w.Apply(uint32(qidx), policy.Endpoint{}))
			qIP := map[int]net.IP{4: q4, 6: q6}
			for _, fam := range []int{4, 6} {
				msg := fmt.Sprintf("from-q-v%d", fam)
				send(q, qIP, fam, msg)
				if bigReceived(ln[fam], msg, time.Second) {
					t.Errorf("IPv%d (%s): q, given vanished p's address, reached v through p's flow: v's policy allows nobody", fam, how)
				}
			}
		})
	}
}
