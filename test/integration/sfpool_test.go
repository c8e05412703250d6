// The node's pool of stack-flow tables (issue 30): a pod's own table is a
// slot taken at ADD, emptied, and freed at DEL; a slot is handed to the
// next pod with nothing of the last one's, whatever killed what between.

package integration

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// poolLab is a node sized for 2 attachments (a pool of 2 slots) whose
// pod b serves TCP on 8080 behind the ClusterIP svcWeb (nftables DNAT, as
// kube-proxy would), v4 and v6.
type poolLab struct {
	e      *testenv.Env
	m      *maps.Maps
	b      ns.NetNS
	bIdx   int
	bAddrs map[int]net.IP
}

func newPoolLab(t *testing.T) *poolLab {
	return newPoolLabN(t, 1) // 2 attachments: a pool of 2 slots
}

// newPoolLabN is a poolLab on a node sized for maxPods+1 attachments
// (a pool of maxPods+1 slots).
func newPoolLabN(t *testing.T, maxPods int) *poolLab {
	e := testenv.New(t)
	e.Extra = map[string]any{"maxPods": maxPods}
	l := &poolLab{e: e, b: e.NewPod()}
	e.CleanupDel(l.b, "b")
	b4, b6 := testenv.PodIPs(t, e.Add(l.b, "b"))
	l.bAddrs = map[int]net.IP{4: b4, 6: b6}
	_, l.bIdx = e.HostVeth("b")
	l.m = e.Maps()
	for fam, bip := range l.bAddrs {
		subnet, node := testenv.PodSubnet4, testenv.NodeIP4
		if fam == 6 {
			subnet, node = testenv.PodSubnet6, testenv.NodeIP6
		}
		restore(t, e.Node, "nft", nftRules(fam, subnet, []net.IP{node}, []svcPort{
			{name: "web", proto: "tcp", clusterIP: svcWeb[fam], port: 80, backend: bip, target: 8080},
		}), "-f", "-")
	}
	for _, fam := range []string{"tcp4", "tcp6"} {
		var ln net.Listener
		if err := l.b.Do(func(ns.NetNS) (err error) { ln, err = net.Listen(fam, ":8080"); return }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		acceptEach(ln, func(c net.Conn) {
			r := bufio.NewReader(c)
			for {
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
				if _, err := c.Write([]byte("pong\n")); err != nil {
					return
				}
			}
		})
	}
	return l
}

// exchange: pod p reaches b through the ClusterIP and gets three answers
// (b's replies go back through conntrack's un-DNAT: the records work).
func (l *poolLab) exchange(t *testing.T, p ns.NetNS, fam int) {
	t.Helper()
	var c net.Conn
	if err := p.Do(func(ns.NetNS) (err error) {
		c, err = net.DialTimeout("tcp", hp(svcWeb[fam], 80), 5*time.Second)
		return
	}); err != nil {
		t.Fatalf("IPv%d: pod -> ClusterIP %s: %v", fam, svcWeb[fam], err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for i := 0; i < 3; i++ {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatalf("IPv%d: write %d: %v", fam, i, err)
		}
		if got, err := r.ReadString('\n'); err != nil || got != "pong\n" {
			t.Fatalf("IPv%d: answer %d through the ClusterIP: %q, %v", fam, i, got, err)
		}
	}
}

// exchangeBoth is exchange in IPv4 and then IPv6.
func (l *poolLab) exchangeBoth(t *testing.T, p ns.NetNS) {
	t.Helper()
	for _, fam := range []int{4, 6} {
		l.exchange(t, p, fam)
	}
}

// addPod runs pod name on the lab's node (DEL when the test ends) and
// returns it with its addresses, its host veth's ifindex and the pool slot
// that holds (checked as slot does).
func (l *poolLab) addPod(t *testing.T, name string) (p ns.NetNS, a4, a6 net.IP, idx int, slot uint32) {
	t.Helper()
	p, r := l.e.RunPod(name)
	a4, a6 = testenv.PodIPs(t, r)
	_, idx = l.e.HostVeth(name)
	return p, a4, a6, idx, l.slot(t, idx)
}

// slot is the pool slot ifindex holds, and every address entry of it
// carries it.
func (l *poolLab) slot(t *testing.T, idx int) uint32 {
	t.Helper()
	s, err := l.m.StackFlows().SlotOf(idx)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := l.m.Endpoints().List()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ep := range eps {
		if int(ep.Info.Ifindex) == idx {
			n++
			if got := mapstest.SlotOfFlags(ep.Info.Flags); got != s {
				t.Errorf("address entry %s of ifindex %d carries slot %d, the pool says %d", ep.IP, idx, got, s)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d address entries of ifindex %d, want 2", n, idx)
	}
	return s
}

func (l *poolLab) records(t *testing.T, slot uint32) []maps.StackFlow {
	t.Helper()
	fs, err := mapstest.SlotRecords(l.m, slot)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestStackFlowPoolReuse: pod a takes a slot at ADD (its address entries
// carry it), its Service flows to b are recorded in its table, DEL empties
// and frees it. Then the state a DEL killed before it freed the slot
// leaves (the veth gone, the slot still held, a record of a's written
// meanwhile): pod c, ADDed on the full pool, takes that slot back, gets it
// with no record of a's, and its own Service flows work through it. IPv4
// and IPv6.
func TestStackFlowPoolReuse(t *testing.T) {
	t.Parallel()
	l := newPoolLab(t)
	e := l.e
	a, a4, a6, aIdx, sa := l.addPod(t, "a")
	if sb := l.slot(t, l.bIdx); sa == 0 || sb == 0 || sa == sb {
		t.Fatalf("slots: a %d, b %d; want two distinct slots", sa, sb)
	}
	l.exchangeBoth(t, a)
	var aFlow *maps.StackFlow
	for _, f := range l.records(t, sa) {
		// Keyed as b's replies look: b is the pod, a the peer.
		if f.Ifindex == l.bIdx && (f.Peer.Addr() == mustAddr(a4) || f.Peer.Addr() == mustAddr(a6)) {
			aFlow = &f
		}
	}
	if aFlow == nil {
		t.Fatalf("no record of a's Service flows to b in a's slot %d: %v", sa, l.records(t, sa))
	}
	if err := e.Del(a, "a", "eth0"); err != nil {
		t.Fatal(err)
	}
	if s, _ := l.m.StackFlows().SlotOf(aIdx); s != 0 || len(l.records(t, sa)) != 0 {
		t.Fatalf("after DEL of a: ifindex %d holds slot %d, slot %d keeps %v", aIdx, s, sa, l.records(t, sa))
	}

	// What a DEL killed before freeing the slot leaves: a gone veth still
	// holds it, and a packet in flight wrote a record of a's.
	const gone = 999999
	k, v := uint32(gone), sa
	if err := mapstest.Map(l.m, "cni_sf_slots").Update(&k, &v, 0); err != nil {
		t.Fatal(err)
	}
	putRecord(t, l.m, sa, *aFlow)
	if len(l.records(t, sa)) != 1 {
		t.Fatalf("the forged leftover is not in slot %d", sa)
	}

	c, c4, c6, _, sc := l.addPod(t, "c")
	if sc != sa {
		t.Fatalf("c took slot %d on a full pool, want %d (the gone veth's)", sc, sa)
	}
	if fs := l.records(t, sa); len(fs) != 0 {
		t.Fatalf("c was handed slot %d with records: %v", sa, fs)
	}
	if s, _ := l.m.StackFlows().SlotOf(gone); s != 0 {
		t.Errorf("the gone veth still holds slot %d", s)
	}
	l.exchangeBoth(t, c)
	fs := l.records(t, sa)
	if len(fs) == 0 {
		t.Fatal("c's Service flows left no record in its slot")
	}
	for _, f := range fs {
		if f.Peer.Addr() != mustAddr(c4) && f.Peer.Addr() != mustAddr(c6) {
			t.Errorf("slot %d, c's, holds a record not of c's flows: %+v", sa, f)
		}
	}
	if err := e.Del(c, "c", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := e.Del(l.b, "b", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.AssertClean()
}

// TestStackFlowPoolKilledAdd: an ADD killed by SIGKILL after it took a
// slot and wrote the address entries, then the runtime's DEL: nothing is
// left (no slot held), and the next pod takes a slot and reaches b
// through the Service.
func TestStackFlowPoolKilledAdd(t *testing.T) {
	t.Parallel()
	bin := crashBinary(t)
	l := newPoolLab(t)
	e := l.e
	pod := e.NewPod()
	envv := pluginEnv("ADD", "crash", pod, "eth0")
	envv["EBPF_CNI_CRASH_AT"] = "endpoints"
	out, err := e.RunPlugin(bin, envv, e.StdinConf(nil))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("ADD with EBPF_CNI_CRASH_AT=endpoints: %v, want killed by SIGKILL; stdout %s", err, out)
	}
	slots, err := l.m.StackFlows().Slots()
	if err != nil {
		t.Fatal(err)
	}
	if len(slots) != 2 {
		t.Fatalf("slots held after the killed ADD: %v, want b's and the killed one's", slots)
	}
	e.CleanupBy(t, "DEL", "crash", pod, testenv.BinDir)
	for _, s := range e.Leftovers() {
		if strings.HasPrefix(s, testenv.StackFlowTableLeftover) && s != fmt.Sprintf("%s%d", testenv.StackFlowTableLeftover, l.bIdx) {
			t.Errorf("after DEL of the killed ADD: %s", s)
		}
	}
	c, _, _, _, s := l.addPod(t, "c")
	if s == 0 {
		t.Fatal("c got no slot after the killed ADD's DEL")
	}
	l.exchangeBoth(t, c)
}

func mustAddr(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		panic(fmt.Sprintf("not an address: %v", ip))
	}
	return a.Unmap()
}

// putRecord writes f back into slot's table, as from_container would.
func putRecord(t *testing.T, m *maps.Maps, slot uint32, f maps.StackFlow) {
	t.Helper()
	var k maps.StackFlowKey
	pod, peer := f.Pod.Addr().As16(), f.Peer.Addr().As16()
	k.Family, k.Proto = 2, f.Proto
	if f.Pod.Addr().Is4() {
		a, p := f.Pod.Addr().As4(), f.Peer.Addr().As4()
		copy(k.Addr[:], a[:])
		copy(k.PeerAddr[:], p[:])
	} else {
		k.Family = 10
		copy(k.Addr[:], pod[:])
		copy(k.PeerAddr[:], peer[:])
	}
	k.Port, k.PeerPort = htons(f.Pod.Port()), htons(f.Peer.Port())
	if err := mapstest.PutSlotRecord(m, slot, k, maps.StackFlowVal{Ifindex: uint32(f.Ifindex), Flags: f.Flags}); err != nil {
		t.Fatal(err)
	}
}

func htons(p uint16) uint16 { return p<<8 | p>>8 }

// TestStackFlowDelOfDeliveredPod: DEL scans the other pods' tables and the
// shared one only for a pod the stack delivered a flow to (issue 30: that
// scan grew with the pods of the node). Pod a reaches b through a
// ClusterIP: b's address entries lose EP_F_SF_NONE, a's keep it, and a's
// table and the shared one hold records for b. b's DEL removes them from
// both; a's DEL, which scans nothing of b's, frees and empties its slot.
// IPv4 and IPv6.
func TestStackFlowDelOfDeliveredPod(t *testing.T) {
	t.Parallel()
	l := newPoolLab(t)
	e := l.e
	a, a4, a6, aIdx, sa := l.addPod(t, "a")
	l.exchangeBoth(t, a)
	sf := l.m.StackFlows()
	if !sf.NeverDelivered(aIdx, []net.IP{a4, a6}) || sf.NeverDelivered(l.bIdx, []net.IP{l.bAddrs[4], l.bAddrs[6]}) {
		t.Fatalf("never delivered a flow: a %v (want true), b %v (want false)",
			sf.NeverDelivered(aIdx, []net.IP{a4, a6}), sf.NeverDelivered(l.bIdx, []net.IP{l.bAddrs[4], l.bAddrs[6]}))
	}
	ofB := func() (inA, all int) {
		t.Helper()
		for _, f := range l.records(t, sa) {
			if f.Ifindex == l.bIdx {
				inA++
			}
		}
		fs, err := sf.List()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if f.Ifindex == l.bIdx {
				all++
			}
		}
		return
	}
	if inA, all := ofB(); inA < 2 || all < 2 {
		t.Fatalf("records for b after a's Service flows: %d in a's slot, %d in the shared table; want both families in each", inA, all)
	}
	if err := e.Del(l.b, "b", "eth0"); err != nil {
		t.Fatal(err)
	}
	if inA, all := ofB(); inA != 0 || all != 0 {
		t.Fatalf("after b's DEL: %d records for b left in a's slot, %d in the shared table", inA, all)
	}
	if err := e.Del(a, "a", "eth0"); err != nil {
		t.Fatal(err)
	}
	if s, _ := sf.SlotOf(aIdx); s != 0 || len(l.records(t, sa)) != 0 {
		t.Fatalf("after a's DEL: ifindex %d holds slot %d, slot %d keeps %v", aIdx, s, sa, l.records(t, sa))
	}
	e.AssertClean()
}
