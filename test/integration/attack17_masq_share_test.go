// Attack (round 14 hostile review, attack17) on the bookkeeping of a pod's
// share of ports towards one destination (docs/masquerade.md, "No pod
// starves the others": released only when a FIN went each way; "a SYN that
// reopens the tuple counts it again"), by retransmitted SYNs and FINs and
// simultaneous closes, and on a pod deleted with its flows open.

package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a17Ipt runs an iptables-like command in netns.
func a17Ipt(t *testing.T, netns ns.NetNS, cmd string, args ...string) {
	t.Helper()
	must(t, netns.Do(func(ns.NetNS) error {
		var out bytes.Buffer
		c := exec.Command(cmd, append([]string{"-w"}, args...)...)
		c.Stdout, c.Stderr = &out, &out
		if err := c.Run(); err != nil {
			return fmt.Errorf("%s %v: %v: %s", cmd, args, err, out.String())
		}
		return nil
	}))
}

// TestAttack17MasqShareRetransmits: ipMasqPodPortLimit 8 on a 32-port range;
// the server's host drops every other SYN it gets and the pod dials one
// after the other, so each connection is opened by a retransmitted SYN. Pod x opens 8 connections
// (share 8), closes them (the server's FIN, then x's), then sends each
// closed tuple's FIN twice more from a raw socket (retransmitted FINs), then
// reopens the 8 tuples (each a SYN lost and retransmitted: "counts it
// again", once), then asks for 8 more from new ports. After each step dump
// nat's share must be what is open (8, 0, 0, 8), and x must never hold more
// than 8 live connections to the server.
func TestAttack17MasqShareRetransmits(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "63100-63131")
	a16Server(t, lab.out, outsideIP, 7540)
	a17Ipt(t, lab.out, "iptables", "-A", "INPUT", "-p", "tcp", "--syn", "--dport", "7540",
		"-m", "statistic", "--mode", "nth", "--every", "2", "--packet", "0", "-j", "DROP")
	srv := hp(outsideIP, 7540)
	x, rx := lab.a.RunPod("a17rx")
	x4, _ := testenv.PodIPs(t, rx)
	_, ifx := lab.a.HostVeth("a17rx")
	share := func(step string, want int) {
		s, c := a16Share(t, lab.a, ifx, "tcp", srv)
		t.Logf("%s: share %d (recycled %d, drop_pod_limit %d, new %d)", step, s, c["recycled"], c["drop_pod_limit"], c["new"])
		if s != want {
			t.Errorf("%s: dump nat's share of x towards %s is %d, want %d", step, srv, s, want)
		}
	}
	fs := a16Open(t, x, srv, a16Ports(41400, 8))
	if n := len(a16Alive(fs, "a")); n != 8 {
		t.Fatalf("control: %d of 8 first connections answered", n)
	}
	share("8 open, each by a retransmitted SYN", 8)
	a16Close(t, fs, "bye")
	time.Sleep(700 * time.Millisecond)
	share("8 closed by a FIN each way", 0)
	for k := 0; k < 2; k++ {
		for _, p := range a16Ports(41400, 8) {
			must(t, a15SendRaw4(x, outsideIP, a16TCP4(x4, p, outsideIP, 7540, 0x1000+uint32(k), 0x11)))
		}
	}
	time.Sleep(700 * time.Millisecond)
	share("the 8 closed tuples' FINs sent twice more", 0)
	again := a16Open(t, x, srv, a16Ports(41400, 8))
	alive := a16Alive(again, "b")
	if len(alive) != 8 {
		t.Errorf("reopening the 8 tuples: %d answer", len(alive))
	}
	share("8 tuples reopened, each by a retransmitted SYN", len(alive))
	more := a16Open(t, x, srv, a16Ports(41500, 8))
	alive = a16Alive(append(again, more...), "c")
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("8 more asked: %d live on distinct node ports, share %d, recycled %d, drop_pod_limit %d", len(alive), s, c["recycled"], c["drop_pod_limit"])
	if len(alive) > 8 {
		t.Errorf("pod x holds %d live connections to one server, over its share of 8", len(alive))
	}
	if s != len(alive) {
		t.Errorf("dump nat's share %d, but %d connections are open", s, len(alive))
	}
}

// TestAttack17MasqShareSimultaneousClose: limit 8. Pod x opens 8
// connections and closes each at the moment the server does (x's FIN sent
// right after asking the server to close: the FINs cross), twice over; the
// share must be 0 after each round and 8 new connections must then all
// answer at once, the share saying 8.
func TestAttack17MasqShareSimultaneousClose(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "63140-63171")
	a16Server(t, lab.out, outsideIP, 7541)
	srv := hp(outsideIP, 7541)
	x, _ := lab.a.RunPod("a17sx")
	_, ifx := lab.a.HostVeth("a17sx")
	for round := 0; round < 2; round++ {
		fs := a16Open(t, x, srv, a16Ports(41600+100*round, 8))
		if n := len(a16Alive(fs, "a")); n != 8 {
			t.Fatalf("round %d: %d of 8 answered", round, n)
		}
		var wg sync.WaitGroup
		for _, f := range fs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.c.Write([]byte("bye\n"))
				f.c.(*net.TCPConn).CloseWrite()
				f.c.SetDeadline(time.Now().Add(3 * time.Second))
				io.Copy(io.Discard, f.r)
				f.c.Close()
			}()
		}
		wg.Wait()
		time.Sleep(700 * time.Millisecond)
		if s, _ := a16Share(t, lab.a, ifx, "tcp", srv); s != 0 {
			t.Errorf("round %d: 8 connections closed by crossing FINs, share %d, want 0", round, s)
		}
	}
	t0 := time.Now()
	nf := a16Open(t, x, srv, a16Ports(41900, 8))
	alive := a16Alive(nf, "n")
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("8 new after: %d answer in %v, share %d, recycled %d, drop_pod_limit %d", len(alive), time.Since(t0), s, c["recycled"], c["drop_pod_limit"])
	if len(alive) != 8 || s != 8 {
		t.Errorf("8 new connections after two rounds of crossing closes: %d answer, share %d; want 8 and 8", len(alive), s)
	}
}

// a17Held is what dump nat says of the pod on ifindex: flows in its table,
// its share rows, its quota row's flows; and the node's total.
func a17Held(t *testing.T, e *testenv.Env, ifindex int) (flows, shares, quota, total int) {
	t.Helper()
	var d inspect.NATDump
	js, err := e.MasqAgent("dump", "nat", "-o", "json")
	if err == nil {
		err = json.Unmarshal(js, &d)
	}
	if err != nil {
		t.Fatalf("dump nat: %v", err)
	}
	for _, f := range d.Flows {
		if f.Ifindex == ifindex {
			flows++
		}
	}
	for _, s := range d.Shares {
		if s.Ifindex == ifindex {
			shares += s.Ports
		}
	}
	for _, q := range d.Quota.Pods {
		if q.Ifindex == ifindex {
			quota += q.Flows
		}
	}
	return flows, shares, quota, d.Quota.Total
}

// TestAttack17MasqShareDelMidFlow: limit 8. Pod x (network A) holds 8 TCP
// connections and a UDP flow to one server; pod w, on a second ipMasq
// network sharing the pin directory (same ports), holds 4. x is deleted
// with its connections open. Nothing of x may stay in dump nat (flows,
// shares, quota row), the node's total must drop by x's flows only, w's
// connections must keep answering with its share unchanged, and a new pod z
// on network A must open 8 connections to the same server at once.
func TestAttack17MasqShareDelMidFlow(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	a.Extra["ipMasqPortRange"] = "63180-63211"
	a.Extra["ipMasqPodPortLimit"] = 8
	a16Server(t, lab.out, outsideIP, 7542)
	udpPeerEcho(t, lab.out, outsideIP, 7542)
	srv := hp(outsideIP, 7542)
	x := a.NewPod()
	a.CleanupDel(x, "a17dx")
	a.Add(x, "a17dx")
	_, ifx := a.HostVeth("a17dx")
	w := a.NewPod()
	netB := a.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": a.PinDir, "stateDir": t.TempDir(),
		"ipMasq": true, "clusterCIDRs": []string{labCluster, labCluster6},
		"ipMasqPortRange": "63180-63211", "ipMasqPodPortLimit": 8,
		"ipam": staticIPAM("10.250.7.10/24", "fd00:250:7::10/64"),
	})
	rtB := &libcni.RuntimeConf{ContainerID: "a17dx", NetNS: w.Path(), IfName: "eth1"}
	t.Cleanup(func() { a.DelList(netB, rtB) })
	if _, err := a.AddList(netB, rtB); err != nil {
		t.Fatalf("ADD of w on a second ipMasq network with the same ports: %v", err)
	}
	ifw := a.HostIfindex(state.HostIfName("a17dx", "eth1"))
	xs := a16Open(t, x, srv, a16Ports(42000, 8))
	xu, err := a14Dial(x, "udp", 42100, srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { xu.c.Close() })
	if _, e, err := xu.ask("u"); err != nil || e != "u" {
		t.Fatalf("control: x's UDP flow: %q %v", e, err)
	}
	ws := a16Open(t, w, srv, a16Ports(42200, 4))
	if n, m := len(a16Alive(xs, "x")), len(a16Alive(ws, "w")); n != 8 || m != 4 {
		t.Fatalf("control: x %d of 8, w %d of 4 answered", n, m)
	}
	fx, sx, qx, total0 := a17Held(t, a, ifx)
	fw, sw0, qw0, _ := a17Held(t, a, ifw)
	t.Logf("before x's DEL: x %d flow rows, share %d, quota flows %d; w %d, %d, %d; node total %d", fx, sx, qx, fw, sw0, qw0, total0)
	if err := a.Del(x, "a17dx", "eth0"); err != nil {
		t.Fatalf("DEL of x mid-flow: %v", err)
	}
	fx, sx, qx, total := a17Held(t, a, ifx)
	_, sw, qw, _ := a17Held(t, a, ifw)
	t.Logf("after x's DEL: x %d flow rows, share %d, quota flows %d; w share %d, quota flows %d; node total %d", fx, sx, qx, sw, qw, total)
	if fx+sx+qx > 0 {
		t.Errorf("x deleted mid-flow: dump nat still holds %d flow rows, a share of %d and %d quota flows of its ifindex %d", fx, sx, qx, ifx)
	}
	if total != qw {
		t.Errorf("after x's DEL the node's total is %d, but the only pod left (w) holds %d", total, qw)
	}
	if sw != sw0 || qw != qw0 {
		t.Errorf("x's DEL changed w's share %d -> %d or its flows %d -> %d", sw0, sw, qw0, qw)
	}
	if n := len(a16Alive(ws, "w2")); n != 4 {
		t.Errorf("after x's DEL, %d of w's 4 connections answer", n)
	}
	z, _ := a.RunPod("a17dz")
	_, ifz := a.HostVeth("a17dz")
	t.Logf("z's host ifindex %d (x's was %d)", ifz, ifx)
	zs := a16Open(t, z, srv, a16Ports(42000, 8))
	alive := a16Alive(zs, "z")
	_, sz, _, _ := a17Held(t, a, ifz)
	if len(alive) != 8 || sz != 8 {
		t.Errorf("new pod z after x's DEL: %d of 8 connections answer, share %d; want 8 and 8", len(alive), sz)
	}
}
