// The drops of the node hooks and the translations (issue 25): a forged
// source off the wire, the masquerade's refusals, a hostPort reply with no
// route. Each is an event with one counter increment, as the host veth's
// drops are (TestEventsEachDropReason).

package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// sendUDPOnce sends one datagram from netns to dst, and reads nothing.
func sendUDPOnce(t *testing.T, netns ns.NetNS, dst net.IP, port int) {
	t.Helper()
	must(t, netns.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", hp(dst, port))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	}))
}

// lastSeq is the newest event the agent keeps (0: none).
func lastSeq(t *testing.T, e *testenv.Env) uint64 {
	recs := observeJSON(t, e, "--last", "1000")
	if len(recs) == 0 {
		return 0
	}
	return recs[len(recs)-1].Seq
}

// oneDrop provokes a drop with send and wants exactly as many events of
// (ifindex, dir, reason) as the counter rose, one of them matching want.
// It returns the seq of the last event read.
func oneDrop(t *testing.T, e *testenv.Env, m *maps.Maps, idx int, dir maps.Dir, r maps.Reason, seq uint64,
	send func(), want func(events.Record) bool) uint64 {
	t.Helper()
	before := counter(t, m, idx, dir, r).Packets
	send()
	for deadline := time.Now().Add(3 * time.Second); counter(t, m, idx, dir, r).Packets == before; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s %s of ifindex %d not counted\n  %s", dir, r, idx, dumpCounters(m, idx))
		}
	}
	drops, n, got := settledDrops(t, e, m, idx, dir, r, before, seq, func(ev events.Record) bool {
		return ev.Type == "drop" && ev.Verdict == "dropped" && ev.Reason == r.String() && ev.Direction == dir.String() &&
			ev.Ifindex == uint32(idx)
	})
	if len(got) > 0 {
		seq = got[len(got)-1].Seq
	}
	if uint64(n) != drops {
		t.Fatalf("%d %s %s counted on ifindex %d, %d events of it: %+v", drops, dir, r, idx, n, got)
	}
	found := 0
	for _, ev := range got {
		if want(ev) {
			found++
		}
	}
	if found != 1 {
		t.Fatalf("%d events of the packet sent (want 1) among %+v", found, got)
	}
	return seq
}

// TestEventsNodeHookDrops: the drops of the uplink programs and of the
// translations, IPv4 and IPv6, each with one event per counter increment:
// a host outside forging a pod's or the node's address (drop_spoof_ip,
// ingress, on the uplink); a masquerading pod finding no free node port
// (drop_nat_exhausted) or at its quota (drop_nat_pod_limit), egress on its
// host veth; a hostPort reply whose TTL runs out at the node
// (drop_no_route, egress on the pod's host veth); NetworkPolicy's denials
// both ways (drop_policy).
func TestEventsNodeHookDrops(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, true) // networkPolicy (the forged-source checks), ipMasq, a hostPort
	for _, pod := range []string{"a", "b", "h"} {
		p.apply(t, pod, policy.Endpoint{}) // not isolated: a pod is until its policy is written
	}
	e := p.Env
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	m := p.m
	var upIdx int
	must(t, e.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err == nil {
			upIdx = l.Attrs().Index
		}
		return err
	}))
	seq := lastSeq(t, e)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }

	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("forged-pod-source/ipv%d", fam), func(t *testing.T) {
			src, dst := &net.UDPAddr{IP: ip("b", fam), Port: 5555}, &net.UDPAddr{IP: ip("h", fam), Port: 80}
			seq = oneDrop(t, e, m, upIdx, maps.DirIngress, maps.ReasonDropSpoofIP, seq,
				func() { sendForged(t, p.remote, src, dst, "forged") },
				func(ev events.Record) bool {
					return ev.Src == src.IP.String() && ev.Dst == dst.IP.String() && ev.Protocol == "udp" &&
						ev.SrcPort == 5555 && ev.DstPort == 80
				})
		})
		t.Run(fmt.Sprintf("forged-node-source/ipv%d", fam), func(t *testing.T) {
			src, dst := &net.UDPAddr{IP: nodeIP[fam], Port: 5556}, &net.UDPAddr{IP: ip("h", fam), Port: 80}
			seq = oneDrop(t, e, m, upIdx, maps.DirIngress, maps.ReasonDropSpoofIP, seq,
				func() { sendForged(t, p.remote, src, dst, "forged") },
				func(ev events.Record) bool {
					return ev.Src == src.IP.String() && ev.Dst == dst.IP.String() && ev.SrcPort == 5556
				})
		})
	}

	// One masquerade port: a holds it towards remote:7000, b finds none.
	must(t, m.Masq().SetConfig(maps.MasqPorts{Ranges: [][2]uint16{{61000, 61000}}, PodLimit: 1}))
	_, aIdx := e.HostVeth("a")
	_, bIdx := e.HostVeth("b")
	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("nat-exhausted/ipv%d", fam), func(t *testing.T) {
			a := expectServer(t, p.a, "udp", hp(remoteIP[fam], 7000), "remote")
			if got := peer(t, a); !got.Equal(uplinkIP[fam]) {
				t.Fatalf("the remote host saw a as %s, want the node's %s", got, uplinkIP[fam])
			}
			seq = oneDrop(t, e, m, bIdx, maps.DirEgress, maps.ReasonDropNATPorts, seq,
				func() { sendUDPOnce(t, p.b, remoteIP[fam], 7000) },
				func(ev events.Record) bool {
					return ev.Src == ip("b", fam).String() && ev.Dst == remoteIP[fam].String() && ev.Protocol == "udp" &&
						ev.DstPort == 7000
				})
		})
	}
	st, err := m.Masq().Stats()
	must(t, err)
	if st["drop_exhausted"] < 2 {
		t.Errorf("cni_masq_stats drop_exhausted %d, want the 2 drops counted there too: %v", st["drop_exhausted"], st)
	}

	// a at its quota (none of the pool left): its flow to a destination it
	// holds no port towards is refused.
	setQuota(t, e, maps.MasqQuota{Reserve: 0, Pool: 0, PodMax: 1})
	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("nat-pod-limit/ipv%d", fam), func(t *testing.T) {
			seq = oneDrop(t, e, m, aIdx, maps.DirEgress, maps.ReasonDropNATLimit, seq,
				func() { sendUDPOnce(t, p.a, remoteIP[fam], 7001) },
				func(ev events.Record) bool {
					return ev.Src == ip("a", fam).String() && ev.Dst == remoteIP[fam].String() && ev.DstPort == 7001
				})
		})
	}

	// h answers its hostPort's client with TTL 1: the node, which routes the
	// translated reply itself (fib_redirect), drops it as the stack would.
	_, hIdx := e.HostVeth("h")
	restore := podTTL(t, p.h, 1)
	defer restore()
	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("no-route/ipv%d", fam), func(t *testing.T) {
			seq = oneDrop(t, e, m, hIdx, maps.DirEgress, maps.ReasonDropNoRoute, seq,
				func() { sendUDPOnce(t, p.remote, uplinkIP[fam], hostPortH) },
				func(ev events.Record) bool {
					// Counted once translated back: the node's address, as the client dialled it.
					return ev.Src == uplinkIP[fam].String() && ev.Dst == remoteIP[fam].String() && ev.SrcPort == hostPortH
				})
		})
	}
	restore()
	// With its TTL back, the hostPort answers.
	for _, fam := range []int{4, 6} {
		expectServer(t, p.remote, "udp", hp(uplinkIP[fam], hostPortH), "h")
	}

	// NetworkPolicy: a denied all egress (judged at its host veth), h all
	// ingress (its hostPort's client, judged where from_uplink redirects
	// into h).
	p.apply(t, "a", policy.Endpoint{Egress: isolated()})
	p.apply(t, "h", policy.Endpoint{Ingress: isolated()})
	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("policy-egress/ipv%d", fam), func(t *testing.T) {
			seq = oneDrop(t, e, m, aIdx, maps.DirEgress, maps.ReasonDropPolicy, seq,
				func() { sendUDPOnce(t, p.a, remoteIP[fam], 7002) },
				func(ev events.Record) bool {
					return ev.Src == ip("a", fam).String() && ev.Dst == remoteIP[fam].String() && ev.DstPort == 7002
				})
		})
		t.Run(fmt.Sprintf("policy-ingress/ipv%d", fam), func(t *testing.T) {
			seq = oneDrop(t, e, m, hIdx, maps.DirIngress, maps.ReasonDropPolicy, seq,
				func() { sendUDPOnce(t, p.remote, uplinkIP[fam], hostPortH) },
				func(ev events.Record) bool {
					// Counted once DNATed: to h's own address and port.
					return ev.Src == remoteIP[fam].String() && ev.Dst == ip("h", fam).String() && ev.DstPort == 80
				})
		})
	}
}

// setQuota writes cni_masq_quota (the agent and ADD write it only when
// zero).
func setQuota(t *testing.T, e *testenv.Env, q maps.MasqQuota) {
	t.Helper()
	mp, err := ebpf.LoadPinnedMap(filepath.Join(datapath.MapsDir(e.PinDir), "cni_masq_quota"), nil)
	must(t, err)
	defer mp.Close()
	must(t, mp.Put(uint32(0), &q))
}

// podTTL sets the TTL and hop limit of what netns sends; the returned
// function puts the old ones back (once).
func podTTL(t *testing.T, netns ns.NetNS, ttl int) func() {
	t.Helper()
	files := []string{"/proc/sys/net/ipv4/ip_default_ttl", "/proc/sys/net/ipv6/conf/all/hop_limit", "/proc/sys/net/ipv6/conf/eth0/hop_limit"}
	old := map[string][]byte{}
	must(t, netns.Do(func(ns.NetNS) error {
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			old[f] = b
			if err := os.WriteFile(f, []byte(fmt.Sprint(ttl)), 0o644); err != nil {
				return err
			}
		}
		return nil
	}))
	done := false
	return func() {
		if done {
			return
		}
		done = true
		netns.Do(func(ns.NetNS) error {
			for f, b := range old {
				os.WriteFile(f, b, 0o644)
			}
			return nil
		})
	}
}
