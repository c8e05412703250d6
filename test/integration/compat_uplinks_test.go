// Compat on a node with two uplinks: the masquerade on each, and the uplink
// programs upgraded under traffic in whichever mode each uplink is attached.

package integration

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A second uplink of the node (uplink1, 100.64.0.1/24 and fd00:64::1/64)
// with a remote host of its own behind it.
var (
	uplink1IP4 = net.ParseIP("100.64.0.1").To4()
	uplink1IP6 = net.ParseIP("fd00:64::1")
	remote1IP4 = net.ParseIP("100.64.0.2").To4()
	remote1IP6 = net.ParseIP("fd00:64::2")
)

func plugSecondUplink(t *testing.T, h *hpEnv) ns.NetNS {
	t.Helper()
	r := testenv.NewNS(t)
	addr := func(l netlink.Link, cidr string) error {
		a, _ := netlink.ParseAddr(cidr)
		a.Flags = unix.IFA_F_NODAD
		return netlink.AddrAdd(l, a)
	}
	err := h.InNode(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink1"}, PeerName: "eth0",
			PeerNamespace: netlink.NsFd(int(r.Fd()))}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("uplink1")
		if err != nil {
			return err
		}
		// A secondary address after the primary: the stack, and the
		// fallback, take the primary.
		for _, c := range []string{uplink1IP4.String() + "/24", "100.64.0.50/24", uplink1IP6.String() + "/64"} {
			if err := addr(l, c); err != nil {
				return fmt.Errorf("add %s: %w", c, err)
			}
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Do(func(ns.NetNS) error {
		for _, n := range []string{"lo", "eth0"} {
			l, _ := netlink.LinkByName(n)
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, _ := netlink.LinkByName("eth0")
		for _, c := range []string{remote1IP4.String() + "/24", remote1IP6.String() + "/64"} {
			if err := addr(l, c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCompatMasqTwoUplinks: a masquerading pod's flows leave each of the
// node's two uplinks with that uplink's primary address, IPv4 and IPv6, TCP
// and UDP: from BPF_FIB_LOOKUP_SRC, or (forced) from the addresses the node
// keeps per uplink.
func TestCompatMasqTwoUplinks(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["ipMasq"] = true
	r1 := plugSecondUplink(t, h)
	p := h.NewPod()
	h.MustAddHP(p, "p")
	serve(t, h.remote, 7000, "remote0")
	serve(t, r1, 7000, "remote1")

	m := h.Maps()
	cfg, err := m.Node().Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.FibNoSrc() != forced(datapath.FeatFibSrc) {
		t.Errorf("masquerade source without BPF_FIB_LOOKUP_SRC: %v, the run forces it: %v", cfg.FibNoSrc(), forced(datapath.FeatFibSrc))
	}
	srcs, err := m.Node().UplinkSources()
	if err != nil {
		t.Fatal(err)
	}
	want1 := map[string]bool{uplink1IP4.String(): true, uplink1IP6.String(): true}
	for _, ip := range srcs[h.HostIfindex("uplink1")] {
		delete(want1, ip.String())
	}
	if len(want1) > 0 {
		t.Errorf("uplink sources kept for uplink1: %v, missing %v", srcs, want1)
	}
	wantUplinkMode(t, h.Env, "uplink0")
	wantUplinkMode(t, h.Env, "uplink1")

	for _, proto := range []string{"tcp", "udp"} {
		mustAsk(t, p, proto, hp(remoteIP4, 7000), 0, "remote0", uplinkIP4)
		mustAsk(t, p, proto, hp(remoteIP6, 7000), 0, "remote0", uplinkIP6)
		mustAsk(t, p, proto, hp(remote1IP4, 7000), 0, "remote1", uplink1IP4)
		mustAsk(t, p, proto, hp(remote1IP6, 7000), 0, "remote1", uplink1IP6)
	}
	h.MustDel(p, "p")
	h.AssertClean()
}

// TestCompatUplinkUpgradeUnderTraffic: `ebpf-agent upgrade --force` swaps the
// uplink programs (tcx links, or cls_bpf filters with tcx forced off) in
// place three times while a remote host talks to a pod through a hostPort
// and the pod to the remote host through masquerade, 2 ms apart each: not
// one datagram is lost, and the uplinks run new programs.
func TestCompatUplinkUpgradeUnderTraffic(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["ipMasq"] = true
	p := h.NewPod()
	h.MustAddHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "udp"})
	serve(t, p, 80, "web")
	serve(t, h.remote, 7000, "remote")
	wantUplinkMode(t, h.Env, "uplink0")
	before := uplinkProgIDs(t, h.Env, "uplink0")

	const n = 2500
	stream := func(from ns.NetNS, to string, lost *atomic.Int64) chan error {
		done := make(chan error, 1)
		go func() {
			done <- from.Do(func(ns.NetNS) error {
				c, err := net.Dial("udp", to)
				if err != nil {
					return err
				}
				defer c.Close()
				var got atomic.Int64
				readDone := make(chan struct{})
				go func() {
					defer close(readDone)
					buf := make([]byte, 512)
					for {
						c.SetReadDeadline(time.Now().Add(2 * time.Second))
						if _, err := c.Read(buf); err != nil {
							return
						}
						got.Add(1)
					}
				}()
				for i := 0; i < n; i++ {
					fmt.Fprintf(c, "%d", i)
					time.Sleep(2 * time.Millisecond)
				}
				<-readDone
				lost.Store(n - got.Load())
				return nil
			})
		}()
		return done
	}
	var lostIn, lostOut atomic.Int64
	in := stream(h.remote, hp(uplinkIP4, 8080), &lostIn)
	out := stream(p, hp(remoteIP4, 7000), &lostOut)
	confDir := h.WriteConfDir()
	time.Sleep(500 * time.Millisecond)
	for i := 0; i < 3; i++ {
		if o, err := h.AgentCmd(append([]string{"upgrade", "--force"}, h.AgentArgs(confDir)...)...); err != nil {
			t.Fatalf("upgrade: %v\n%s", err, o)
		}
		time.Sleep(300 * time.Millisecond)
	}
	for _, c := range []chan error{in, out} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if lostIn.Load() != 0 || lostOut.Load() != 0 {
		t.Errorf("datagrams lost across three upgrades: %d of %d through the hostPort, %d of %d masqueraded", lostIn.Load(), n, lostOut.Load(), n)
	}
	after := uplinkProgIDs(t, h.Env, "uplink0")
	for k, id := range after {
		if before[k] == id {
			t.Errorf("uplink0 %s still runs program %d after upgrade --force", k, id)
		}
	}
	wantUplinkMode(t, h.Env, "uplink0")
	h.MustDel(p, "web")
	h.AssertClean()
}

// uplinkProgIDs are the program IDs of both uplink hooks of ifname, by
// hook, whichever way they are attached.
func uplinkProgIDs(t *testing.T, e *testenv.Env, ifname string) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	idx := e.HostIfindex(ifname)
	for _, p := range []string{"uplink_", "uplink-egress_"} {
		if l, err := link.LoadPinnedLink(filepath.Join(e.PinDir, "node", p+ifname), nil); err == nil {
			if info, err := l.Info(); err == nil {
				out[p] = uint32(info.Program)
			}
			l.Close()
		}
	}
	_ = e.InNode(func() error {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			return err
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, _ := netlink.FilterList(l, parent)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "cni-uplink-") {
					out[bf.Name] = uint32(bf.Id)
				}
			}
		}
		return nil
	})
	if len(out) != 2 {
		t.Fatalf("uplink %s: hooks %v, want two", ifname, out)
	}
	return out
}
