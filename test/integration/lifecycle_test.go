// The attachment's life: DEL (also under traffic), GC, concurrent ADDs and
// DELs, the first ADDs racing to set the node up, STATUS.

package integration

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestLifecycleDel: DEL removes every trace, is idempotent, and needs neither
// the pod netns, nor the host veth, nor an earlier ADD.
func TestLifecycleDel(t *testing.T) {
	t.Run("two pods then clean", func(t *testing.T) {
		e := testenv.New(t)
		a, b := e.NewPod(), e.NewPod()
		pa := e.AddAttachment(a, "del-a")
		pb := e.AddAttachment(b, "del-b")
		if len(e.Leftovers()) == 0 {
			t.Fatal("leftovers() sees nothing after two ADDs; the clean check would prove nothing")
		}
		for _, p := range []*testenv.Attachment{pa, pb} {
			if err := e.Del(p.Pod, p.ID, "eth0"); err != nil {
				t.Fatalf("DEL %s: %v", p.ID, err)
			}
		}
		e.AssertGone(pa)
		e.AssertGone(pb)
		e.AssertClean()
		// The pod side is gone too.
		err := a.Do(func(ns.NetNS) error {
			if _, err := netlink.LinkByName("eth0"); err == nil {
				return errors.New("eth0 still exists in the pod after DEL")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}

		// DEL again: success, still clean.
		for _, p := range []*testenv.Attachment{pa, pb} {
			if err := e.Del(p.Pod, p.ID, "eth0"); err != nil {
				t.Fatalf("second DEL %s: %v", p.ID, err)
			}
		}
		e.AssertClean()
	})

	t.Run("pod netns gone", func(t *testing.T) {
		e := testenv.New(t)
		pod := e.NewPod()
		p := e.AddAttachment(pod, "del-nonetns")
		destroyPod(t, pod)
		if err := e.Del(pod, p.ID, "eth0"); err != nil {
			t.Fatalf("DEL after the pod netns is gone: %v", err)
		}
		// Whatever the kernel had not yet reaped, DEL removed; wait for the
		// kernel's side anyway so nothing can appear after the check.
		e.WaitLinkGone(p.HostIf)
		e.AssertGone(p)
		e.AssertClean()
		if err := e.Del(pod, p.ID, "eth0"); err != nil {
			t.Fatalf("second DEL after the pod netns is gone: %v", err)
		}
		e.AssertClean()
	})

	t.Run("host veth deleted by hand", func(t *testing.T) {
		e := testenv.New(t)
		pod := e.NewPod()
		p := e.AddAttachment(pod, "del-noveth")
		err := e.InNode(func() error {
			l, err := netlink.LinkByName(p.HostIf)
			if err != nil {
				return err
			}
			return netlink.LinkDel(l)
		})
		if err != nil {
			t.Fatalf("delete %s by hand: %v", p.HostIf, err)
		}
		if err := e.Del(pod, p.ID, "eth0"); err != nil {
			t.Fatalf("DEL after the host veth was deleted: %v", err)
		}
		e.AssertGone(p)
		e.AssertClean()
	})

	t.Run("never added", func(t *testing.T) {
		// On a node whose datapath was never set up...
		e := testenv.New(t)
		pod := e.NewPod()
		if err := e.Del(pod, "never-added", "eth0"); err != nil {
			t.Fatalf("DEL of a never-added container on an empty node: %v", err)
		}
		if err := e.Del(nil, "never-added", "eth0"); err != nil {
			t.Fatalf("DEL without netns of a never-added container: %v", err)
		}
		e.AssertClean()

		// ...and on one that has other pods, which must not be touched.
		other := e.AddAttachment(e.NewPod(), "del-bystander")
		if err := e.Del(pod, "never-added", "eth0"); err != nil {
			t.Fatalf("DEL of a never-added container next to a pod: %v", err)
		}
		if err := e.Check(other.Pod, other.ID, "eth0"); err != nil {
			t.Fatalf("CHECK of the bystander after an unrelated DEL: %v", err)
		}
		if err := testenv.Ping(other.Pod, testenv.NodeIP4, 1); err != nil {
			t.Fatalf("bystander after an unrelated DEL: %v", err)
		}
		if err := e.Del(other.Pod, other.ID, "eth0"); err != nil {
			t.Fatal(err)
		}
		e.AssertClean()
	})
}

// TestLifecycleDelUnderTraffic: a pod that is busy sending when it is deleted
// must leave nothing behind, counters included: nothing may re-create map
// state after DEL has cleared it.
func TestLifecycleDelUnderTraffic(t *testing.T) {
	e := testenv.New(t)
	for i := 0; i < 3; i++ {
		pod := e.NewPod()
		p := e.AddAttachment(pod, fmt.Sprintf("del-busy-%d", i))
		stop := flood(t, pod, testenv.NodeIP4)
		// DEL while the datapath is counting the flood, not before it starts.
		m := e.Maps()
		deadline := time.Now().Add(5 * time.Second)
		for counter(t, m, p.Ifindex, maps.DirEgress, maps.ReasonForward).Packets < 100 {
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("the flood is not flowing: %s", dumpCounters(m, p.Ifindex))
			}
			time.Sleep(5 * time.Millisecond)
		}
		delErr := e.Del(pod, p.ID, "eth0")
		stop()
		if delErr != nil {
			t.Fatalf("DEL of a busy pod: %v", delErr)
		}
		e.AssertGone(p)
		e.AssertClean()
	}
}

// TestLifecycleGC: GC with one valid attachment removes the two others
// completely and leaves the valid one working. Run once through libcni as a
// runtime would (libcni DELs the stale attachments it has cached, then calls
// the plugin's GC), and once with libcni's cache lost, so the plugin's own
// GC has to find the stale attachments from its records.
func TestLifecycleGC(t *testing.T) {
	for _, lostCache := range []bool{false, true} {
		name := "libcni cache"
		if lostCache {
			name = "plugin records only"
		}
		t.Run(name, func(t *testing.T) {
			e := testenv.New(t)
			// Pinned tcx links, which GC must keep for the valid attachment:
			// without an agent only attachMode tcx makes them at ADD.
			e.Extra = map[string]any{"attachMode": "tcx"}
			var ps []*testenv.Attachment
			for i := 0; i < 3; i++ {
				ps = append(ps, e.AddAttachment(e.NewPod(), fmt.Sprintf("gc-%d", i)))
			}
			keep, stale := ps[1], []*testenv.Attachment{ps[0], ps[2]}
			if lostCache {
				if err := os.RemoveAll(e.CacheDir); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(e.CacheDir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.GC(types.GCAttachment{ContainerID: keep.ID, IfName: "eth0"}); err != nil {
				t.Fatalf("GC: %v", err)
			}
			for _, p := range stale {
				e.AssertGone(p)
			}
			// Everything of the valid attachment is still in place.
			have := map[string]bool{}
			for _, tr := range e.Traces(keep) {
				have[tr] = true
			}
			want := []string{
				"host veth " + keep.HostIf,
				"link pin " + datapath.LinkPinPath(e.PinDir, keep.HostIf, "ingress"),
				"link pin " + datapath.LinkPinPath(e.PinDir, keep.HostIf, "egress"),
				"state record of " + keep.ID,
				fmt.Sprintf("links map entry %d", keep.Ifindex),
			}
			for _, ip := range keep.IPs {
				want = append(want, "ipam reservation "+ip.String(), "endpoint map entry "+ip.String())
			}
			for _, w := range want {
				if !have[w] {
					t.Errorf("GC removed %s of the valid attachment", w)
				}
			}
			if err := testenv.Ping(keep.Pod, testenv.NodeIP4, 2); err != nil {
				t.Fatalf("valid pod after GC: %v", err)
			}
			if !lostCache {
				// libcni's cached result is still there only in this variant.
				if err := e.Check(keep.Pod, keep.ID, "eth0"); err != nil {
					t.Fatalf("CHECK of the valid pod after GC: %v", err)
				}
			}
			// A second GC changes nothing.
			if err := e.GC(types.GCAttachment{ContainerID: keep.ID, IfName: "eth0"}); err != nil {
				t.Fatalf("second GC: %v", err)
			}
			if err := testenv.Ping(keep.Pod, testenv.NodeIP4, 1); err != nil {
				t.Fatalf("valid pod after second GC: %v", err)
			}
			if err := e.Del(keep.Pod, keep.ID, "eth0"); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
}

// TestLifecycleConcurrent: 20 ADDs at once on a node whose pin directory is
// still empty (so they also race on bootstrapping the datapath) all succeed
// with distinct addresses; the pods talk; 20 DELs at once leave nothing.
func TestLifecycleConcurrent(t *testing.T) {
	const n = 20
	e := testenv.New(t)
	if _, err := os.Stat(e.PinDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pin directory should not exist yet: %v", err)
	}
	pods := make([]ns.NetNS, n)
	ids := make([]string, n)
	for i := range pods {
		pods[i] = e.NewPod()
		ids[i] = fmt.Sprintf("conc-%02d", i)
	}
	results := make([]*current.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			res, err := e.AddV("1.1.0", pods[i], ids[i], "eth0")
			if err == nil {
				results[i], err = current.NewResultFromResult(res)
			}
			errs[i] = err
		}(i)
	}
	close(start)
	wg.Wait()
	failed := false
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent ADD %s: %v", ids[i], err)
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
	seen := map[string]string{}
	for i, r := range results {
		v4, v6 := testenv.PodIPs(t, r)
		for _, ip := range []net.IP{v4, v6} {
			if other, dup := seen[ip.String()]; dup {
				t.Errorf("%s and %s both got %s", other, ids[i], ip)
			}
			seen[ip.String()] = ids[i]
		}
	}
	if eps, err := e.Maps().Endpoints().List(); err != nil || len(eps) != 2*n {
		t.Errorf("endpoints map has %d entries (err %v), want %d", len(eps), err, 2*n)
	}
	b4, b6 := testenv.PodIPs(t, results[n-1])
	if err := testenv.Ping(pods[0], b4, 2); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Ping(pods[0], b6, 2); err != nil {
		t.Fatal(err)
	}

	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = e.Del(pods[i], ids[i], "eth0")
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent DEL %s: %v", ids[i], err)
		}
	}
	e.AssertClean()
}

// TestLifecycleBootstrapRace repeats the cold start many times: every ADD
// racing on an empty pin directory must succeed and work.
func TestLifecycleBootstrapRace(t *testing.T) {
	const rounds, n = 5, 6
	for r := 0; r < rounds; r++ {
		e := testenv.New(t)
		pods := make([]ns.NetNS, n)
		for i := range pods {
			pods[i] = e.NewPod()
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				_, errs[i] = e.AddV("1.1.0", pods[i], fmt.Sprintf("boot-%d", i), "eth0")
			}(i)
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: cold-start ADD %d: %v", r, i, err)
			}
		}
		for i := 0; i < n; i++ {
			if err := e.Check(pods[i], fmt.Sprintf("boot-%d", i), "eth0"); err != nil {
				t.Fatalf("round %d: CHECK %d after cold start: %v", r, i, err)
			}
		}
		if err := testenv.Ping(pods[0], testenv.NodeIP4, 1); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		for i := 0; i < n; i++ {
			if err := e.Del(pods[i], fmt.Sprintf("boot-%d", i), "eth0"); err != nil {
				t.Fatalf("round %d: DEL %d: %v", r, i, err)
			}
		}
		e.AssertClean()
	}
}

// TestLifecycleStatus: STATUS succeeds on a usable node and is error 50 when
// the pin directory is not on bpffs; ADD then fails the same way, cleanly.
func TestLifecycleStatus(t *testing.T) {
	e := testenv.New(t)
	if err := e.Status(); err != nil {
		t.Fatalf("STATUS on a good config: %v", err)
	}

	bad := testenv.New(t)
	bad.PinDir = t.TempDir()
	err := bad.Status()
	if testenv.ErrCode(err) != codePluginNotAvailable {
		t.Fatalf("STATUS with pinDir %s off bpffs: %v (code %d), want code %d", bad.PinDir, err, testenv.ErrCode(err), codePluginNotAvailable)
	}
	wantErrContains(t, "STATUS off bpffs", err, bad.PinDir)

	_, err = bad.AddV("1.1.0", bad.NewPod(), "off-bpffs", "eth0")
	if testenv.ErrCode(err) != codePluginNotAvailable {
		t.Fatalf("ADD with pinDir off bpffs: %v (code %d), want code %d", err, testenv.ErrCode(err), codePluginNotAvailable)
	}
	bad.AssertClean()
	if ents, _ := os.ReadDir(bad.PinDir); len(ents) > 0 {
		t.Errorf("ADD off bpffs wrote into %s: %v", bad.PinDir, ents)
	}
}

// TestDatapathDelUnderTraffic deletes pods while packets flow to and from
// them over both families: pod -> node, node -> pod (kernel stack) and a peer
// pod -> pod (bpf_redirect_peer, counted for the destination by the peer's
// program). DEL must still leave no trace of the pod, counters included.
// Several rounds, as the window is a race.
func TestDatapathDelUnderTraffic(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	peer := e.NewPod()
	e.CleanupDel(peer, "peer")
	e.Add(peer, "peer")
	fromPeer := udpSocket(t, peer, nil)
	fromNode := udpSocket(t, e.Node, nil)
	m := e.Maps()

	for round := 0; round < 5; round++ {
		id := fmt.Sprintf("pod-%d", round)
		p := e.NewPod()
		e.CleanupDel(p, id)
		r := e.Add(p, id)
		p4, p6 := testenv.PodIPs(t, r)
		hostIf, idx := e.HostVeth(id)
		fromPod := udpSocket(t, p, nil)

		stop := make(chan struct{})
		done := make(chan int, 1)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				fromPod.WriteToUDP([]byte("x"), &net.UDPAddr{IP: testenv.NodeIP4, Port: 9})
				fromPod.WriteToUDP([]byte("x"), &net.UDPAddr{IP: testenv.NodeIP6, Port: 9})
				fromNode.WriteToUDP([]byte("y"), &net.UDPAddr{IP: p4, Port: 9})
				fromNode.WriteToUDP([]byte("y"), &net.UDPAddr{IP: p6, Port: 9})
				fromPeer.WriteToUDP([]byte("z"), &net.UDPAddr{IP: p4, Port: 9})
				fromPeer.WriteToUDP([]byte("z"), &net.UDPAddr{IP: p6, Port: 9})
				n++
			}
		}()
		// Wait until every kind of traffic is seen on the pod's veth.
		deadline := time.Now().Add(10 * time.Second)
		for {
			cs, _ := m.Stats().Counters(idx)
			if cs[maps.CounterKey{Dir: maps.DirEgress, Reason: maps.ReasonForward}].Packets > 0 &&
				cs[maps.CounterKey{Dir: maps.DirIngress, Reason: maps.ReasonForward}].Packets > 0 &&
				cs[maps.CounterKey{Dir: maps.DirIngress, Reason: maps.ReasonRedirect}].Packets > 0 {
				break
			}
			if time.Now().After(deadline) {
				close(stop)
				<-done
				t.Fatalf("round %d: traffic not flowing before DEL: %s", round, dumpCounters(m, idx))
			}
			time.Sleep(10 * time.Millisecond)
		}
		err := e.Del(p, id, "eth0")
		close(stop)
		sent := <-done
		if err != nil {
			t.Fatalf("DEL %s under traffic: %v", id, err)
		}
		all, _ := m.Stats().All()
		if cs, ok := all[uint32(idx)]; ok {
			var parts []string
			for k, c := range cs {
				parts = append(parts, fmt.Sprintf("%s/%s=%dp", k.Dir, k.Reason, c.Packets))
			}
			t.Errorf("round %d: after DEL of %s (host ifindex %d, %d send rounds during the test) the counters map still holds %s",
				round, id, idx, sent, strings.Join(parts, " "))
		}
		// Everything else of this pod is gone too (the peer stays).
		var left []string
		for _, l := range e.Leftovers() {
			// Addresses and indexes must match whole ("ifindex 3" is not "ifindex 30").
			for _, mark := range []string{" " + p4.String(), " " + p6.String(),
				fmt.Sprintf("ifindex %d", idx), fmt.Sprintf("links map entry %d", idx)} {
				if hasToken(l, mark) {
					left = append(left, l)
					break
				}
			}
			if strings.Contains(l, hostIf) || strings.Contains(l, id+"_") {
				left = append(left, l)
			}
		}
		if len(left) > 0 {
			t.Fatalf("round %d: DEL of %s under traffic left:\n  %s", round, id, strings.Join(left, "\n  "))
		}
	}
	e.MustDel(peer, "peer")
	e.AssertClean()
}

// TestFirstIPv6DatagramAfterAdd: a datagram the node sends to a pod's IPv6
// address the moment its ADD returns is received, each of 12 pods in a row,
// while another netns churns links (RTNL busy, as on a node starting pods).
// The pod's kernel inserts an IPv6 address's local route from its DAD work,
// which waits for RTNL; ADD returned before it, and the pod discarded the
// datagram (forwarding off, InAddrErrors): TestUpgradeFromLayout3DaemonSetCaps
// lost its first IPv6 query through a Service so, once in 20 runs at load 15.
func TestFirstIPv6DatagramAfterAdd(t *testing.T) {
	e := testenv.New(t)
	churn := testenv.NewNS(t)
	stop := make(chan struct{})
	churned := make(chan int, 1)
	go func() {
		n := 0
		churn.Do(func(ns.NetNS) error {
			for {
				select {
				case <-stop:
					churned <- n
					return nil
				default:
				}
				name := fmt.Sprintf("churn%d", n%4)
				v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
				if err := netlink.LinkAdd(v); err != nil {
					t.Errorf("churn: %v", err)
					churned <- n
					<-stop
					return nil
				}
				if l, err := netlink.LinkByName(name); err == nil {
					netlink.LinkSetUp(l) // an IPv6 device: its own DAD work
					netlink.LinkDel(l)
				}
				n++
			}
		})
	}()
	defer func() {
		close(stop)
		t.Logf("%d veth pairs churned meanwhile", <-churned)
	}()
	for i := 0; i < 12; i++ {
		pod := e.NewPod()
		id := fmt.Sprintf("first%d", i)
		e.CleanupDel(pod, id)
		var c *net.UDPConn
		must(t, pod.Do(func(ns.NetNS) error {
			var err error
			c, err = net.ListenUDP("udp6", &net.UDPAddr{Port: 9})
			return err
		}))
		_, v6 := testenv.PodIPs(t, e.Add(pod, id))
		must(t, e.InNode(func() error {
			s, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: v6, Port: 9})
			if err != nil {
				return err
			}
			defer s.Close()
			_, err = s.Write([]byte("first"))
			return err
		}))
		// Received or lost: nothing resends it, so a delay is no loss.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := c.ReadFromUDP(make([]byte, 16))
		c.Close()
		if err != nil || n != len("first") {
			t.Errorf("pod %d: the node's first datagram to %s, sent as its ADD returned, was not received: %v", i, v6, err)
		}
		e.MustDel(pod, id)
	}
	e.AssertClean()
}
