package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// ---- parallel: n pods set up at once ----

type variant struct {
	name string
	// prep runs before the clock starts (pool pairs); add is one pod's
	// kernel work; del one pod's DEL kernel work.
	prep func(e *env, n int) ([]*poolPair, error)
	add  func(e *env, pod ns.NetNS, pair *poolPair, k int) (int, error)
	del  func(e *env, idx int) error
}

func addBorn(attach func(e *env, idx int, host string) error) func(e *env, pod ns.NetNS, _ *poolPair, k int) (int, error) {
	return func(e *env, pod ns.NetNS, _ *poolPair, k int) (int, error) {
		host := e.name("sbq")
		var idx int
		err := e.node.Do(func(ns.NetNS) (err error) {
			if idx, err = vethBorn(host, "eth0", pod); err != nil {
				return err
			}
			return attach(e, idx, host)
		})
		if err != nil {
			return 0, err
		}
		return idx, e.configureBoth(newSamples(), pod, idx, k, "")
	}
}

func delLink(e *env, idx int) error {
	return e.node.Do(func(ns.NetNS) error { return deleteLink(idx) })
}

func handOff(e *env, idx int) error {
	return e.node.Do(func(ns.NetNS) error { return setLink{index: idx, nsFd: -1, name: e.name("sbx"), up: &upFalse}.do() })
}

var variants = []variant{
	{name: "no programs (ptp's kernel work)", add: addBorn(func(*env, int, string) error { return nil }), del: delLink},
	{name: "today: tcx x2", add: addBorn(func(e *env, idx int, host string) error { return e.attachBoth(idx, host) }), del: delLink},
	{name: "tc first (cls_bpf); DEL hands off", add: addBorn(func(e *env, idx int, _ string) error { return attachTC(e.prog, idx) }), del: handOff},
	{
		name: "pool take (netns move); DEL hands off",
		prep: func(e *env, n int) ([]*poolPair, error) {
			var ps []*poolPair
			for i := 0; i < n; i++ {
				p, err := e.preparePair(newSamples())
				if err != nil {
					return ps, err
				}
				ps = append(ps, p)
			}
			return ps, nil
		},
		add: func(e *env, pod ns.NetNS, p *poolPair, k int) (int, error) {
			if err := e.take(newSamples(), p, pod, e.name("sbf")); err != nil {
				return 0, err
			}
			return p.hostIdx, e.configureBoth(newSamples(), pod, p.hostIdx, k, "")
		},
		del: handOff,
	},
}

func (e *env) runParallel(ctx context.Context, n int) error {
	fmt.Printf("\n## Parallel: %d pods set up at once, then torn down at once (load before %s)\n\n", n, testenv.Loadavg())
	fmt.Println("| variant | ADD wall ms | ADD per pod p50 | p90 | max | DEL wall ms | DEL per pod p50 | p90 | load after |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for vi, v := range variants {
		if err := ctx.Err(); err != nil {
			return err
		}
		var pairs []*poolPair
		if v.prep != nil {
			var err error
			if pairs, err = v.prep(e, n); err != nil {
				return err
			}
		}
		pods := make([]ns.NetNS, n)
		for i := range pods {
			p, err := e.newPod()
			if err != nil {
				return err
			}
			pods[i] = p
		}
		idx := make([]int, n)
		addMs, addWall, err := together(n, func(i int) error {
			var pair *poolPair
			if pairs != nil {
				pair = pairs[i]
			}
			var err error
			idx[i], err = v.add(e, pods[i], pair, vi*n+i+1)
			return err
		})
		if err != nil {
			return fmt.Errorf("%s ADD: %w", v.name, err)
		}
		delMs, delWall, err := together(n, func(i int) error { return v.del(e, idx[i]) })
		if err != nil {
			return fmt.Errorf("%s DEL: %w", v.name, err)
		}
		fmt.Printf("| %s | %.0f | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %s |\n", v.name, addWall, testenv.Median(addMs), pct(addMs, 0.9),
			pct(addMs, 1), delWall, testenv.Median(delMs), pct(delMs, 0.9), testenv.Loadavg())
		// Untimed: what was handed off, and the pods.
		if err := e.deleteHandedOff(); err != nil {
			return err
		}
		for _, p := range pods {
			if err := e.removePod(p); err != nil {
				return err
			}
		}
		if err := e.clearPins(); err != nil {
			return err
		}
	}
	return nil
}

// together starts f(0..n-1) at the same instant and returns each one's
// duration and the wall time until the last ended.
func together(n int, f func(i int) error) ([]float64, float64, error) {
	start := make(chan struct{})
	ms := make([]float64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t := time.Now()
			errs[i] = f(i)
			ms[i] = float64(time.Since(t).Microseconds()) / 1000
		}()
	}
	t := time.Now()
	close(start)
	wg.Wait()
	return ms, float64(time.Since(t).Microseconds()) / 1000, errors.Join(errs...)
}

// deleteHandedOff deletes every veth left in the node (handed off or not).
func (e *env) deleteHandedOff() error {
	return e.node.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Type() == "veth" {
				if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
					return err
				}
			}
		}
		return nil
	})
}

func (e *env) clearPins() error {
	ents, err := os.ReadDir(e.pinDir)
	if err != nil {
		return err
	}
	for _, d := range ents {
		if err := os.Remove(e.pinDir + "/" + d.Name()); err != nil {
			return err
		}
	}
	return nil
}

// ---- contention: an ADD's kernel work while background work holds RTNL ----

func (e *env) runContention(ctx context.Context) error {
	load := testenv.Loadavg()
	s := newSamples()
	var inFlight atomic.Int32
	type bg struct {
		name string
		op   func(stop <-chan struct{}, polite bool) error
	}
	// A background worker that attaches tcx links (migration, pool refill)
	// or deletes veths with tcx links (hand-off), back to back; polite:
	// it starts no kernel operation while an ADD is in flight.
	worker := func(del bool) func(stop <-chan struct{}, polite bool) error {
		return func(stop <-chan struct{}, polite bool) error {
			for {
				select {
				case <-stop:
					return nil
				default:
				}
				wait := func() {
					for polite && inFlight.Load() > 0 {
						time.Sleep(100 * time.Microsecond)
					}
				}
				wait()
				host, peer := e.name("sbch"), e.name("sbcp")
				err := e.node.Do(func(ns.NetNS) error {
					h, _, err := vethNode(host, peer)
					if err != nil {
						return err
					}
					for _, a := range tcxHooks {
						wait()
						if err := attachTCX(e.prog, h, a, pinPath(e.pinDir, host, a)); err != nil {
							return err
						}
					}
					if del {
						wait()
						if err := deleteLink(h); err != nil {
							return err
						}
						return unpin(e.pinDir, host)
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
		}
	}
	bgs := []bg{
		{"idle", nil},
		{"background tcx attaches, back to back", worker(false)},
		{"background tcx attaches, polite", worker(false)},
		{"background deletes of tcx veths, back to back", worker(true)},
		{"background deletes of tcx veths, polite", worker(true)},
	}
	const perBlock, blocks = 8, 3
	k := 0
	for b := 0; b < blocks; b++ {
		for _, g := range bgs {
			if err := ctx.Err(); err != nil {
				return err
			}
			stop := make(chan struct{})
			done := make(chan error, 1)
			if g.op != nil {
				polite := g.name[len(g.name)-6:] == "polite"
				go func() { done <- g.op(stop, polite) }()
				time.Sleep(30 * time.Millisecond)
			} else {
				done <- nil
			}
			for i := 0; i < perBlock; i++ {
				pod, err := e.newPod()
				if err != nil {
					return err
				}
				k++
				inFlight.Add(1)
				t := time.Now()
				_, err = addBorn(func(e *env, idx int, _ string) error { return attachTC(e.prog, idx) })(e, pod, nil, k)
				d := time.Since(t)
				inFlight.Add(-1)
				if err != nil {
					return err
				}
				s.add("tc-first ADD kernel work: "+g.name, d)
				if err := e.removePod(pod); err != nil {
					return err
				}
				time.Sleep(5 * time.Millisecond)
			}
			close(stop)
			if err := <-done; err != nil {
				return fmt.Errorf("%s: %w", g.name, err)
			}
			if err := e.deleteHandedOff(); err != nil {
				return err
			}
			if err := e.clearPins(); err != nil {
				return err
			}
		}
	}
	s.print("Contention: one pod's ADD kernel work (veth, cls_bpf, host and pod config) beside background RTNL work", load)
	return nil
}

// ---- state: what a pair keeps across pods, and migration exactly once ----

func (e *env) runState() error {
	if err := e.reuseState(); err != nil {
		return fmt.Errorf("reuse: %w", err)
	}
	fmt.Printf("\n## cls_bpf (A) then tcx (B) on the host veth's ingress under a steady stream from the pod\n\n")
	fmt.Println("| run | migrated | ms to migrate | datagrams written | pod eth0 tx_packets | tx_dropped | seen by A | seen by B | A+B-tx |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for i := 0; i < 6; i++ {
		if err := e.migrationOnce(i, i%2 == 0); err != nil {
			return err
		}
	}
	return nil
}

// reuseState lets pod A change its interface, returns the pair to the node
// (as a pool would), gives it to pod B and reports what B inherits.
func (e *env) reuseState() error {
	podA, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(podA)
	podB, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(podB)
	host := e.name("sbr")
	var hostIdx int
	err = e.node.Do(func(ns.NetNS) (err error) {
		if hostIdx, err = vethBorn(host, "eth0", podA); err != nil {
			return err
		}
		l, err := netlink.LinkByIndex(hostIdx)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		return err
	}
	defer e.node.Do(func(ns.NetNS) error { return deleteLink(hostIdx) })
	xdp, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		return err
	}
	defer xdp.Close()
	podMAC := net.HardwareAddr{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee}
	// Pod A: traffic, and every knob a pod with CAP_NET_ADMIN may turn.
	err = podA.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		steps := []error{
			netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 98, 0, 2).To4(), Mask: net.CIDRMask(32, 32)}}),
			netlink.LinkSetUp(l),
			netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, IP: gw, HardwareAddr: randomMAC(), State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4}),
			netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}),
		}
		if err := errors.Join(steps...); err != nil {
			return err
		}
		c, err := net.Dial("udp4", "169.254.1.1:9")
		if err != nil {
			return err
		}
		for i := 0; i < 1000; i++ {
			_, _ = c.Write([]byte("previous pod's traffic"))
		}
		c.Close()
		l, _ = netlink.LinkByName("eth0")
		return errors.Join(
			netlink.LinkSetHardwareAddr(l, podMAC),
			netlink.LinkSetMTU(l, 1400),
			netlink.LinkSetTxQLen(l, 42),
			netlink.SetPromiscOn(l),
			netlink.LinkSetAlias(l, "set-by-pod-A"),
			netlink.LinkAddAltName(l, "podaltname"),
			netlink.LinkSetXdpFdWithFlags(l, xdp.FD(), 2 /* XDP_FLAGS_SKB_MODE */),
			netlink.QdiscReplace(&netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)},
				Rate: 1e6, Limit: 10000, Buffer: 10000}),
			os.WriteFile("/proc/sys/net/ipv4/conf/eth0/forwarding", []byte("1"), 0o644),
			os.WriteFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", []byte("1"), 0o644),
		)
	})
	if err != nil {
		return fmt.Errorf("pod A: %w", err)
	}
	// Back to the node, then into pod B under a pool take's name change.
	err = podA.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return setLink{index: l.Attrs().Index, nsFd: int(e.node.Fd()), name: "sbreturned", up: &upFalse}.do()
	})
	if err != nil {
		return fmt.Errorf("return to the node: %w", err)
	}
	err = e.node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("sbreturned")
		if err != nil {
			return err
		}
		return setLink{index: l.Attrs().Index, nsFd: int(podB.Fd()), name: "eth0"}.do()
	})
	if err != nil {
		return fmt.Errorf("into pod B: %w", err)
	}
	// A pair made fresh for pod B, for comparison.
	fresh := e.name("sbrf")
	var freshIdx int
	err = e.node.Do(func(ns.NetNS) (err error) {
		freshIdx, err = vethBorn(fresh, "fresh0", podB)
		return err
	})
	if err != nil {
		return err
	}
	defer e.node.Do(func(ns.NetNS) error { return deleteLink(freshIdx) })
	reused, err := readProbes(podB, "eth0")
	if err != nil {
		return err
	}
	clean, err := readProbes(podB, "fresh0")
	if err != nil {
		return err
	}
	set := []string{"1000 UDP datagrams sent", podMAC.String(), "1400", "42", "on", "set-by-pod-A", "podaltname", "attached", "tbf",
		"10.98.0.2/32", "default via 169.254.1.1", "169.254.1.1 permanent", "1", "1"}
	fmt.Printf("\n## State a pair keeps when it goes from pod A back to the node and on to pod B\n\n")
	fmt.Println("| what | pod A set | pod B finds on the reused pair | a fresh pair in pod B has |")
	fmt.Println("|---|---|---|---|")
	for i, p := range reused {
		fmt.Printf("| %s | %s | %s | %s |\n", p[0], set[i], p[1], clean[i][1])
	}
	return nil
}

// readProbes reads, inside a pod, what reuseState looks at.
func readProbes(pod ns.NetNS, ifname string) ([][2]string, error) {
	var out [][2]string
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		a := l.Attrs()
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		routes, _ := netlink.RouteList(l, netlink.FAMILY_V4)
		neighs, _ := netlink.NeighList(a.Index, netlink.FAMILY_V4)
		qds, _ := netlink.QdiscList(l)
		qd := "none"
		for _, q := range qds {
			if q.Attrs().Parent == netlink.HANDLE_ROOT {
				qd = q.Type()
			}
		}
		fwd, _ := os.ReadFile("/proc/sys/net/ipv4/conf/" + ifname + "/forwarding")
		v6, _ := os.ReadFile("/proc/sys/net/ipv6/conf/" + ifname + "/disable_ipv6")
		out = [][2]string{
			{"tx packets counter", fmt.Sprint(a.Statistics.TxPackets)},
			{"MAC", a.HardwareAddr.String()},
			{"MTU", fmt.Sprint(a.MTU)},
			{"txqueuelen", fmt.Sprint(a.TxQLen)},
			{"promiscuity", fmt.Sprint(a.Promisc)},
			{"alias", a.Alias},
			{"altnames", fmt.Sprint(a.AltNames)},
			{"XDP program (generic)", fmt.Sprint(a.Xdp != nil && a.Xdp.Attached)},
			{"root qdisc", qd},
			{"IPv4 addresses", fmt.Sprint(len(addrs))},
			{"IPv4 routes", fmt.Sprint(len(routes))},
			{"IPv4 neighbours", fmt.Sprint(len(neighs))},
			{"sysctl ipv4 forwarding", string(trim(fwd))},
			{"sysctl ipv6 disable_ipv6", string(trim(v6))},
		}
		return nil
	})
	return out, err
}

func trim(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return []byte("?")
	}
	return b
}

// counter is a program that counts packets in its own array map and returns
// 0 (TC_ACT_OK for cls_bpf, TCX_PASS for tcx: the chain ends there).
func counter() (*ebpf.Program, *ebpf.Map, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, nil, err
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}})
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return p, m, nil
}

func count(m *ebpf.Map) uint64 {
	var v uint64
	_ = m.Lookup(uint32(0), &v)
	return v
}

// migrationOnce sends a steady stream from a pod while its host veth goes
// from cls_bpf (program A) to a tcx link (program B) and the clsact qdisc
// is removed: every packet must be seen by exactly one of them.
func (e *env) migrationOnce(run int, migrate bool) error {
	pa, ma, err := counter()
	if err != nil {
		return err
	}
	defer pa.Close()
	defer ma.Close()
	pb, mb, err := counter()
	if err != nil {
		return err
	}
	defer pb.Close()
	defer mb.Close()
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	host := e.name("sbo")
	var idx int
	err = e.node.Do(func(ns.NetNS) (err error) {
		if idx, err = vethBorn(host, "eth0", pod); err != nil {
			return err
		}
		if err := attachTC(pa, idx); err != nil {
			return err
		}
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		return err
	}
	defer e.node.Do(func(ns.NetNS) error { return deleteLink(idx) })
	var conn net.Conn
	err = pod.Do(func(ns.NetNS) error {
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", []byte("1"), 0o644) // no RS/MLD of its own
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := errors.Join(
			netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 98, 0, 3).To4(), Mask: net.CIDRMask(32, 32)}}),
			netlink.LinkSetUp(l),
			netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, IP: gw, HardwareAddr: randomMAC(), State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4}),
			netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}),
		); err != nil {
			return err
		}
		conn, err = net.Dial("udp4", "169.254.1.1:9")
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := make(chan struct{})
	sent := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				sent <- n
				return
			default:
			}
			if _, err := conn.Write([]byte("x")); err == nil {
				n++
			}
			if n%50 == 0 {
				time.Sleep(50 * time.Microsecond) // below the backlog's limit
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	var migrated time.Duration
	err = e.node.Do(func(ns.NetNS) error {
		t := time.Now()
		if migrate {
			l, err := link.AttachTCX(link.TCXOptions{Interface: idx, Program: pb, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return err
			}
			defer l.Close()
			if err := deleteClsact(idx); err != nil {
				return err
			}
		}
		migrated = time.Since(t)
		time.Sleep(100 * time.Millisecond)
		close(stop)
		return nil
	})
	if err != nil {
		close(stop)
		return err
	}
	n := <-sent
	time.Sleep(20 * time.Millisecond) // the backlog drains
	var st *netlink.LinkStatistics
	err = pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		st = l.Attrs().Statistics
		return nil
	})
	if err != nil {
		return err
	}
	a, b := count(ma), count(mb)
	fmt.Printf("| %d | %v | %.1f | %d | %d | %d | %d | %d | %d |\n", run, migrate, float64(migrated.Microseconds())/1000, n,
		st.TxPackets, st.TxDropped, a, b, int64(a+b)-int64(st.TxPackets))
	return nil
}
