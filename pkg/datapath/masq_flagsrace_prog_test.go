package datapath

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// pinned runs fn on a locked OS thread pinned to cpu and returns at once;
// wg is done when fn is.
func pinned(cpu int, wg *sync.WaitGroup, errs chan<- error, fn func() error) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine, its mask with it
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errs <- err
			return
		}
		if err := fn(); err != nil {
			errs <- err
		}
	}()
}

// TestMasqFlagsTwoCPUs: the pod's FIN (cni_to_uplink, pinned to CPU 0)
// while the server's data segments of the same flow pass cni_from_uplink
// on CPU 1, one BPF_PROG_TEST_RUN after another. The pod's path sets
// SNAT_F_FIN_WAIT in the reverse entry's flags; the server's path reads
// the flags, runs its tracking and wrote them back from its copy, which
// lost the bit when the pod's write came between (docs/masquerade.md,
// "Flags written from both CPUs"): the pod's FIN then never counted and
// the flow kept its share. Each round a new connection; the FIN must be
// waiting after every one. Red before masqrace30's atomic or/and in 1 to
// 5 of 10 runs of 300 rounds (1 or 2 rounds each), green since in 20 of 20;
// a race, so a regression shows as a test red now and then.
func TestMasqFlagsTwoCPUs(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Fatalf("needs 2 CPUs, have %d", runtime.NumCPU())
	}
	inNodeNetns(t)
	dp := hpDatapath(t)
	progs, err := loadPrograms(dp.PinRoot, dp.Maps, nodeHookPrograms(), loadMissing)
	must(t, err)
	defer closePrograms(progs)
	out := func(f []byte, in uint32) (uint32, parsed) { return runFromFrame(t, progs["cni_to_uplink"], f, in) }
	in := func(f []byte, in uint32) (uint32, parsed) { return runFromFrame(t, progs["cni_from_uplink"], f, in) }
	mq := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagMasq)
	must(t, putEndpoint(dp.Maps, podIP, mq))
	must(t, mapstest.PutClusterCIDR(dp.Maps, netip.MustParsePrefix("10.9.0.0/16")))

	const rounds = 300
	lost := 0
	for i := 0; i < rounds; i++ {
		m := &masqFlow{t: t, dp: dp, out: out, in: in, pod: podIP, far: farIP,
			podPort: uint16(30000 + i), srvPort: uint16(2000 + i), p: 1000, s: 5000}
		m.open(nodeIP)
		data := tcpSegment(remoteMAC, m.far, nodeIP, m.srvPort, m.node, m.s+1, m.p+1, ackFlag|0x08, []byte("0123456789"), 0)
		// The pod's FIN is sent from a thread whose frame the test builds
		// here: frames are translated in place, so each run its own copy.
		fin := tcpSegment(podMAC, m.pod, m.far, m.podPort, m.srvPort, m.p+1, m.s+1, finFlag|ackFlag, nil, 0)
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		started := make(chan struct{})
		pinned(1, &wg, errs, func() error {
			close(started)
			for j := 0; j < 400; j++ {
				ret, _, _, err := progTestRun(progs["cni_from_uplink"], data, 0)
				if err != nil {
					return err
				}
				if ret != uint32(actNext) {
					return fmt.Errorf("the server's segment: verdict %d, want on to the pod (%d)", ret, actNext)
				}
			}
			return nil
		})
		<-started
		time.Sleep(time.Duration(100+i%7*50) * time.Microsecond)
		pinned(0, &wg, errs, func() error {
			_, _, _, err := progTestRun(progs["cni_to_uplink"], fin, loIfindex)
			return err
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if fl, _ := m.state(); fl&1 == 0 && fl&flowFinBoth == 0 {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("the pod's FIN lost its wait (SNAT_F_FIN_WAIT) in %d of %d rounds: the server's path on the other CPU wrote back flags read before it", lost, rounds)
	}
}
