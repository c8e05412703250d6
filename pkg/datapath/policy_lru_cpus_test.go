package datapath

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// onCPU runs fn on a locked OS thread pinned to cpu, so that the program
// runs fn makes (BPF_PROG_TEST_RUN runs on the caller's CPU) take their
// table entries from that CPU's share of the LRU's free entries.
func onCPU(t *testing.T, cpu int, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine, its mask with it
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			done <- fmt.Errorf("pin to CPU %d: %w", cpu, err)
			return
		}
		fn()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPolicyFlowTableKeepsLiveFlowsAcrossCPUs: a pod whose new flows are
// recorded from several CPUs keeps every one of fewer than 128 live
// flows (docs/networkpolicy.md, "Flow tables"). The kernel's common LRU
// hands free entries to each CPU in batches and, refilling a CPU while
// the others hold theirs, evicts live entries before the table is full:
// a table of 128 kept 79 of 111 such flows (40 recorded on CPU 0, 41 on
// CPU 1, 30 on CPU 0). The flows are UDP datagrams from new ports of an
// open pod with EP_F_POLICY (each one recorded in its egress table), sent
// by cni_from_container on a thread pinned to each CPU in turn.
func TestPolicyFlowTableKeepsLiveFlowsAcrossCPUs(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Fatalf("needs 2 CPUs, have %d", runtime.NumCPU())
	}
	for _, c := range []struct {
		name   string
		blocks []int // flows recorded on CPU 0, then CPU 1, then CPU 0...
	}{
		{"40-41-30-16", []int{40, 41, 30, 16}},
		{"alternate-by-8", []int{8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7}},
		{"1-then-126", []int{1, 126}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dp, w := policyDatapath(t)
			must(t, w.Apply(loIfindex, policy.Endpoint{})) // open: every flow is recorded
			port := uint16(20000)
			sent := 0
			for i, n := range c.blocks {
				onCPU(t, i%2, func() {
					for j := 0; j < n; j++ {
						ret, _, _ := testRun(t, dp.FromContainer, packet(podMAC, protoUDP, podIP, farIP, port, 53, 0), 0)
						if ret == actShot {
							t.Errorf("flow from port %d dropped", port)
						}
						port++
					}
				})
				sent += n
			}
			fl, err := dp.Maps.Policy().ListFlows()
			must(t, err)
			kept := 0
			for _, f := range fl {
				if f.Ifindex == loIfindex && f.Egress && f.Pod.Port() >= 20000 && f.Pod.Port() < port {
					kept++
				}
			}
			if kept != sent {
				t.Errorf("the pod's egress table kept %d of its %d live flows (recorded on CPU 0 and 1 in turn: %v)", kept, sent, c.blocks)
			}
		})
	}
}

// TestPolicyFlowTableOfAnOlderBuild: a pod whose flow table an older build
// made (128 entries, the object's template; ADD's are larger now) keeps
// recording its flows in it after the upgrade: the programs take an inner
// table of any size.
func TestPolicyFlowTableOfAnOlderBuild(t *testing.T) {
	dp, w := policyDatapath(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 44, ValueSize: 24, MaxEntries: 128})
	must(t, err)
	defer old.Close()
	k := maps.PolicyCTPartKey{Ifindex: loIfindex, Opener: uint32(maps.DirEgress)}
	must(t, mapstest.Map(dp.Maps, "cni_pol_ct_parts").Update(&k, old, ebpf.UpdateAny))
	must(t, w.Apply(loIfindex, policy.Endpoint{}))
	for port := uint16(20000); port < 20010; port++ {
		if ret, _, _ := testRun(t, dp.FromContainer, packet(podMAC, protoUDP, podIP, farIP, port, 53, 0), 0); ret == actShot {
			t.Fatalf("flow from port %d dropped", port)
		}
	}
	n := 0
	var key [44]byte
	var val [24]byte
	for it := old.Iterate(); it.Next(&key, &val); {
		n++
	}
	if n != 10 {
		t.Errorf("the older build's table holds %d of the pod's 10 flows", n)
	}
}
