// Attack (round 14 hostile review, attack17) on the stack-flow slots
// (docs/design.md, docs/performance.md "the pool of stack-flow tables"): a
// per-pod slot of a pool sized by maxPods, taken at ADD, freed at DEL, taken
// back from veths that are gone. No two live pods may hold one slot.

package integration

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a17SlotsDistinct fails when two of the live ifindexes hold one slot
// (cni_sf_slots, and the slot in their address entries).
func a17SlotsDistinct(t *testing.T, l *poolLab, step string, idxs map[string]int) map[string]uint32 {
	t.Helper()
	got := map[string]uint32{}
	by := map[uint32]string{}
	eps, err := l.m.Endpoints().List()
	if err != nil {
		t.Fatal(err)
	}
	for name, idx := range idxs {
		s, err := l.m.StackFlows().SlotOf(idx)
		if err != nil {
			t.Fatal(err)
		}
		got[name] = s
		for _, ep := range eps {
			if int(ep.Info.Ifindex) == idx {
				if es := mapstest.SlotOfFlags(ep.Info.Flags); es != s {
					t.Errorf("%s: pod %s's address entry %s carries slot %d, the pool says %d", step, name, ep.IP, es, s)
				}
			}
		}
		if s == 0 {
			continue
		}
		if o, ok := by[s]; ok {
			t.Errorf("%s: live pods %s (ifindex %d) and %s (ifindex %d) hold the same stack-flow slot %d", step, name, idx, o, idxs[o], s)
		}
		by[s] = name
	}
	return got
}

// TestAttack17SFSlotVethGoneThenDel: a node sized for 2 attachments (b
// and a hold the pool's 2 slots and cni_links' 2 entries). a's host veth
// is deleted by hand, and `ebpf-agent reconcile` cleans up after the gone
// veth (it "frees the slots of gone veths"). Pod c is ADDed and takes a
// slot. Then the runtime's late DEL of a comes: it must not free or empty
// c's slot, and another pod d added after must not share it. c's Service
// traffic must keep working, its slot holding c's flows only.
func TestAttack17SFSlotVethGoneThenDel(t *testing.T) {
	t.Parallel()
	l := newPoolLab(t)
	e := l.e
	a, _, _, aIdx, sa := l.addPod(t, "a")
	l.exchangeBoth(t, a)
	hostA, _ := e.HostVeth("a")
	must(t, e.InNode(func() error {
		lk, err := netlink.LinkByName(hostA)
		if err != nil {
			return err
		}
		return netlink.LinkDel(lk)
	}))
	e.CleanupBy(t, "reconcile", "a", a, testenv.BinDir)
	slots, _ := l.m.StackFlows().Slots()
	t.Logf("a (ifindex %d) held slot %d; after its veth went and reconcile: slots %v", aIdx, sa, slots)
	c, c4, c6, cIdx, sc := l.addPod(t, "c")
	t.Logf("c (ifindex %d) took slot %d", cIdx, sc)
	a17SlotsDistinct(t, l, "after c's ADD", map[string]int{"b": l.bIdx, "c": cIdx})
	l.exchangeBoth(t, c)
	if err := e.Del(a, "a", "eth0"); err != nil {
		t.Errorf("the runtime's DEL of a (its veth gone by hand): %v", err)
	}
	if s, _ := l.m.StackFlows().SlotOf(cIdx); s != sc {
		t.Errorf("a's late DEL changed c's slot: c holds %d, had %d", s, sc)
	}
	if sc != 0 && len(l.records(t, sc)) == 0 {
		t.Errorf("a's late DEL emptied slot %d, c's, while c's Service connections were recorded in it", sc)
	}
	slots, _ = l.m.StackFlows().Slots()
	for idx, s := range slots {
		if idx != l.bIdx && idx != cIdx {
			t.Errorf("after a's DEL, ifindex %d (neither b's %d nor c's %d) holds slot %d", idx, l.bIdx, cIdx, s)
		}
	}
	d := e.NewPod()
	e.CleanupDel(d, "d")
	if _, err := e.AddV("1.0.0", d, "d", "eth0"); err == nil {
		_, dIdx := e.HostVeth("d")
		a17SlotsDistinct(t, l, "after d's ADD", map[string]int{"b": l.bIdx, "c": cIdx, "d": dIdx})
		l.exchangeBoth(t, d)
	} else {
		t.Logf("d on the full node: %v", err)
	}
	l.exchangeBoth(t, c)
	if sc != 0 {
		for _, f := range l.records(t, sc) {
			if f.Peer.Addr() != mustAddr(c4) && f.Peer.Addr() != mustAddr(c6) {
				t.Errorf("slot %d, c's, holds a record not of c's flows: %+v", sc, f)
			}
		}
	}
}

// TestAttack17SFSlotRefusedAdd: a node sized for 2 attachments, full (b,
// a). Pod c's ADD is refused (cni_links full: 11). The runtime then DELs c,
// as after any failed ADD. a's slot must stay a's with its records, no slot
// may be held by c's ifindex, a's Service traffic must work; once a is
// DELed, c's retried ADD must get a slot and work.
func TestAttack17SFSlotRefusedAdd(t *testing.T) {
	t.Parallel()
	l := newPoolLab(t)
	e := l.e
	a, _, _, aIdx, sa := l.addPod(t, "a")
	l.exchangeBoth(t, a)
	c := e.NewPod()
	e.CleanupDel(c, "c")
	_, err := e.AddV("1.0.0", c, "c", "eth0")
	t.Logf("c's ADD on the full node: %v", err)
	if err == nil || testenv.ErrCode(err) != 11 {
		t.Errorf("c's ADD on a node full of attachments: %v, want code 11", err)
	}
	check := func(step string) {
		slots, _ := l.m.StackFlows().Slots()
		for idx, s := range slots {
			if idx != l.bIdx && idx != aIdx {
				t.Errorf("%s: ifindex %d (not b's %d nor a's %d) holds slot %d; slots %v", step, idx, l.bIdx, aIdx, s, slots)
			}
		}
		if s, _ := l.m.StackFlows().SlotOf(aIdx); s != sa || len(l.records(t, sa)) == 0 {
			t.Errorf("%s: a holds slot %d (had %d), %d records in it", step, s, sa, len(l.records(t, sa)))
		}
	}
	check("after c's refused ADD")
	if err := e.Del(c, "c", "eth0"); err != nil {
		t.Errorf("the runtime's DEL after c's refused ADD: %v", err)
	}
	check("after c's DEL")
	l.exchangeBoth(t, a)
	if err := e.Del(a, "a", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.Add(c, "c")
	_, cIdx := e.HostVeth("c")
	a17SlotsDistinct(t, l, "after c's retried ADD", map[string]int{"b": l.bIdx, "c": cIdx})
	if s, _ := l.m.StackFlows().SlotOf(cIdx); s == 0 {
		t.Errorf("c's retried ADD, with a slot free, got none")
	}
	l.exchangeBoth(t, c)
}

// TestAttack17SFSlotsChurn: a node sized for 6 attachments (pool and
// cni_links of 6; b holds one). 5 pods are ADDed at once (every slot taken),
// then 3 of them DELed while 3 new ones are ADDed at once, then 3 more
// ADDed at once on the full node (refused, and DELed as a runtime would).
// After each wave no two live pods may hold one slot, no slot is held by
// an ifindex of no live pod, and every live pod's Service traffic works.
func TestAttack17SFSlotsChurn(t *testing.T) {
	t.Parallel()
	l := newPoolLabN(t, 3)
	e := l.e
	pods := map[string]ns.NetNS{}
	var mu sync.Mutex
	add := func(name string, wg *sync.WaitGroup) {
		defer wg.Done()
		p := e.NewPod()
		e.CleanupDel(p, name)
		_, err := e.AddV("1.0.0", p, name, "eth0")
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Logf("ADD %s: %v", name, err)
			if err := e.Del(p, name, "eth0"); err != nil {
				t.Errorf("DEL %s after its failed ADD: %v", name, err)
			}
			return
		}
		pods[name] = p
	}
	check := func(step string) {
		live := map[string]int{"b": l.bIdx}
		byIdx := map[int]bool{l.bIdx: true}
		for name := range pods {
			_, idx := e.HostVeth(name)
			live[name] = idx
			byIdx[idx] = true
		}
		got := a17SlotsDistinct(t, l, step, live)
		slots, _ := l.m.StackFlows().Slots()
		t.Logf("%s: %d live pods, their slots %v; the pool %v", step, len(live), got, slots)
		for idx, s := range slots {
			if !byIdx[idx] {
				t.Errorf("%s: slot %d held by ifindex %d, no live pod's", step, s, idx)
			}
		}
		for name, p := range pods {
			if err := a17Exchange(p, svcWeb[4]); err != nil {
				t.Errorf("%s: pod %s (slot %d) through the ClusterIP: %v", step, name, got[name], err)
			}
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go add(fmt.Sprint("p", i), &wg)
	}
	wg.Wait()
	check("5 ADDs at once")
	if len(pods) != 5 {
		t.Errorf("%d of 5 ADDs on a node with room for them succeeded", len(pods))
	}
	for i := 0; i < 3; i++ {
		name := fmt.Sprint("p", i)
		p := pods[name]
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := e.Del(p, name, "eth0"); err != nil {
				t.Errorf("DEL %s: %v", name, err)
			}
			mu.Lock()
			delete(pods, name)
			mu.Unlock()
		}()
		go add(fmt.Sprint("q", i), &wg)
	}
	wg.Wait()
	check("3 DELs beside 3 ADDs")
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go add(fmt.Sprint("r", i), &wg)
	}
	wg.Wait()
	check("3 ADDs on the full node")
}

// a17Exchange: pod p asks b through ClusterIP ip:80 once.
func a17Exchange(p ns.NetNS, ip net.IP) error {
	return p.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", hp(ip, 80), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || got != "pong\n" {
			return fmt.Errorf("answer %q, %v", got, err)
		}
		return nil
	})
}
