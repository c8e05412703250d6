// MACs and frames a pod sends: MAC changes, the requested MAC, router
// advertisements and redirects dropped.

package integration

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestIntegrityMACChange: the reference tuning plugin, chained after
// ebpf-cni, gives the pod another MAC. The pod is neither dropped as spoofed
// nor unreachable: the node reaches it before it has sent anything of its
// own (it announces the change), other pods reach it, and the datapath's
// entry follows the MAC. Then the workload changes the MAC itself with the
// announcements switched off: its first packet teaches the datapath. Before,
// every packet of the pod was dropped as drop_spoof_mac.
func TestIntegrityMACChange(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	newMAC, _ := net.ParseMAC("02:42:ac:11:00:99")
	list := e.NetList(e.Name, e.PluginConf(), map[string]any{"type": "tuning", "mac": newMAC.String(), "dataDir": t.TempDir()})
	pod, other := e.NewPod(), e.NewPod()
	rt := e.RuntimeConf(pod, "tuned", "eth0")
	t.Cleanup(func() { e.DelList(list, rt) })
	e.CleanupDel(other, "other")
	r, err := e.AddList(list, rt)
	if err != nil {
		t.Fatalf("ADD ebpf-cni + tuning: %v", err)
	}
	if got := podMACOf(t, pod, "eth0"); got.String() != newMAC.String() {
		t.Fatalf("tuning did not set the MAC: eth0 has %s", got)
	}
	// With an IPv4 address the gratuitous ARP announces the link's MAC for
	// both families.
	assertPodSysctl(t, pod, "/proc/sys/net/ipv4/conf/eth0/arp_notify", "1")
	v4, v6 := testenv.PodIPs(t, r)
	hostIf, idx := e.HostVeth("tuned")
	m := e.Maps()
	// The node first: a server pod that never spoke must answer.
	for _, ip := range []net.IP{v4, v6} {
		if err := testenv.TCPTransfer(e.Node, pod, ip, 64<<10); err != nil {
			t.Errorf("node to the retuned pod %s: %v\n  %s: %s", ip, err, hostIf, dumpCounters(m, idx))
		}
	}
	o := e.Add(other, "other")
	o4, o6 := testenv.PodIPs(t, o)
	for _, c := range []struct {
		src, dst ns.NetNS
		ip       net.IP
	}{{other, pod, v4}, {other, pod, v6}, {pod, other, o4}, {pod, other, o6}} {
		if err := testenv.TCPTransfer(c.src, c.dst, c.ip, 64<<10); err != nil {
			t.Errorf("pod to pod %s: %v\n  %s: %s", c.ip, err, hostIf, dumpCounters(m, idx))
		}
	}
	if li, err := m.Links().Lookup(idx); err != nil || net.HardwareAddr(li.Mac[:]).String() != newMAC.String() {
		t.Errorf("cni_links entry of %s: %v (err %v), want the pod's MAC %s", hostIf, net.HardwareAddr(li.Mac[:]), err, newMAC)
	}
	if c := counter(t, m, idx, maps.DirEgress, maps.ReasonDropSpoofMAC); c.Packets != 0 {
		t.Errorf("%d packets of the retuned pod dropped as drop_spoof_mac", c.Packets)
	}
	if err := e.CheckList(list, rt); err != nil {
		t.Errorf("CHECK of ebpf-cni + tuning: %v", err)
	}

	// The workload changes its MAC with the announcements off: its first
	// packet is learned from.
	mine, _ := net.ParseMAC("02:42:ac:11:00:aa")
	err = pod.Do(func(ns.NetNS) error {
		for _, f := range []string{"/proc/sys/net/ipv4/conf/eth0/arp_notify", "/proc/sys/net/ipv6/conf/eth0/ndisc_notify"} {
			if err := os.WriteFile(f, []byte("0"), 0o644); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.LinkSetHardwareAddr(l, mine)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
		t.Errorf("pod after changing its MAC: %v", err)
	}
	if err := testenv.TCPTransfer(other, pod, v6, 64<<10); err != nil {
		t.Errorf("to the pod over IPv6 after it spoke IPv4 only: %v", err)
	}
	if li, _ := m.Links().Lookup(idx); net.HardwareAddr(li.Mac[:]).String() != mine.String() {
		t.Errorf("cni_links entry after the workload's change: %v, want %s", net.HardwareAddr(li.Mac[:]), mine)
	}
	// A group address is no host's: such a source is dropped, never learned.
	before := counter(t, m, idx, maps.DirEgress, maps.ReasonDropSpoofMAC).Packets
	group, _ := net.ParseMAC("03:00:5e:00:00:01")
	podRaw(t, pod, "eth0", ipv4UDPFrame(group, hostMACOf(m, idx), v4, testenv.NodeIP4))
	waitCounter(t, m, idx, maps.ReasonDropSpoofMAC, before+1)
	if li, _ := m.Links().Lookup(idx); net.HardwareAddr(li.Mac[:]).String() != mine.String() {
		t.Errorf("a group source MAC was learned: %v", net.HardwareAddr(li.Mac[:]))
	}
	if err := testenv.Ping(pod, testenv.NodeIP6, 2); err != nil {
		t.Errorf("pod after the group-MAC frame: %v", err)
	}

	if err := e.DelList(list, rt); err != nil {
		t.Fatal(err)
	}
	e.MustDel(other, "other")
	e.AssertClean()
}

// TestIntegrityMACChangeOneFamily: as TestIntegrityMACChange, for a pod of
// one family: an IPv4-only pod announces by gratuitous ARP (arp_notify,
// set by netlink) and its host veth carries no IPv6; an IPv6-only pod
// announces by unsolicited neighbour advertisements (ndisc_notify) and its
// host veth keeps IPv6. Either way the node reaches the retuned pod before
// the pod has sent anything of its own.
func TestIntegrityMACChangeOneFamily(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, subnet, sysctl string
		nodeIP               net.IP
		hostV6               bool
	}{
		{"v4", testenv.PodSubnet4, "/proc/sys/net/ipv4/conf/eth0/arp_notify", testenv.NodeIP4, false},
		{"v6", testenv.PodSubnet6, "/proc/sys/net/ipv6/conf/eth0/ndisc_notify", testenv.NodeIP6, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := testenv.New(t)
			e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{{"subnet": c.subnet}}}}
			newMAC, _ := net.ParseMAC("02:42:ac:11:00:98")
			list := e.NetList(e.Name, e.PluginConf(), map[string]any{"type": "tuning", "mac": newMAC.String(), "dataDir": t.TempDir()})
			pod := e.NewPod()
			rt := e.RuntimeConf(pod, "tuned", "eth0")
			t.Cleanup(func() { e.DelList(list, rt) })
			r, err := e.AddList(list, rt)
			if err != nil {
				t.Fatalf("ADD ebpf-cni + tuning: %v", err)
			}
			assertPodSysctl(t, pod, c.sysctl, "1")
			hostIf, idx := e.HostVeth("tuned")
			var hostV6 bool
			e.Node.Do(func(ns.NetNS) error {
				b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + hostIf + "/disable_ipv6")
				if err != nil {
					t.Errorf("host veth %s: %v", hostIf, err)
				}
				hostV6 = strings.TrimSpace(string(b)) == "0"
				if l, err := netlink.LinkByName(hostIf); err == nil {
					if a, _ := netlink.AddrList(l, netlink.FAMILY_V6); len(a) > 0 != c.hostV6 {
						t.Errorf("host veth %s has IPv6 addresses %v, want some: %v", hostIf, a, c.hostV6)
					}
				}
				return nil
			})
			if hostV6 != c.hostV6 {
				t.Errorf("host veth %s: IPv6 on %v, want %v", hostIf, hostV6, c.hostV6)
			}
			ip := r.IPs[0].Address.IP
			m := e.Maps()
			if err := testenv.TCPTransfer(e.Node, pod, ip, 64<<10); err != nil {
				t.Errorf("node to the retuned pod %s: %v\n  %s: %s", ip, err, hostIf, dumpCounters(m, idx))
			}
			if err := testenv.Ping(pod, c.nodeIP, 2); err != nil {
				t.Errorf("retuned pod to the node: %v", err)
			}
			if li, err := m.Links().Lookup(idx); err != nil || net.HardwareAddr(li.Mac[:]).String() != newMAC.String() {
				t.Errorf("cni_links entry of %s: %v (err %v), want the pod's MAC %s", hostIf, net.HardwareAddr(li.Mac[:]), err, newMAC)
			}
			if err := e.CheckList(list, rt); err != nil {
				t.Errorf("CHECK of ebpf-cni + tuning: %v", err)
			}
			if err := e.DelList(list, rt); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
}

// assertPodSysctl checks a sysctl of the pod's netns.
func assertPodSysctl(t *testing.T, pod ns.NetNS, path, want string) {
	t.Helper()
	pod.Do(func(ns.NetNS) error {
		if b, err := os.ReadFile(path); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s in the pod: %q (%v), want %s: the pod would not announce a MAC change", path, b, err, want)
		}
		return nil
	})
}

// TestIntegrityRequestedMAC: the runtime's mac capability and CNI_ARGS MAC
// create the pod interface with that MAC (reported in the result, working);
// a malformed or group address is refused (7, 4) and leaves nothing.
func TestIntegrityRequestedMAC(t *testing.T) {
	t.Parallel()
	newMACEnv := func(t *testing.T) *testenv.Env {
		e := testenv.New(t)
		e.Extra = map[string]any{"capabilities": map[string]bool{"mac": true}}
		return e
	}
	for _, c := range []struct {
		name, capMAC, argMAC, want string
	}{
		{"capability", "02:11:22:33:44:55", "", "02:11:22:33:44:55"},
		{"CNI_ARGS", "", "02:11:22:33:44:66", "02:11:22:33:44:66"},
		{"capability over CNI_ARGS", "02:11:22:33:44:77", "02:11:22:33:44:88", "02:11:22:33:44:77"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newMACEnv(t)
			pod := e.NewPod()
			rt := e.RuntimeConf(pod, "mac", "eth0")
			if c.capMAC != "" {
				rt.CapabilityArgs = map[string]any{"mac": c.capMAC}
			}
			if c.argMAC != "" {
				rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"MAC", c.argMAC}}
			}
			t.Cleanup(func() { e.DelList(e.ConfList("1.1.0"), rt) })
			r, err := e.AddList(e.ConfList("1.1.0"), rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if got := podMACOf(t, pod, "eth0"); got.String() != c.want {
				t.Errorf("eth0 has %s, want %s", got, c.want)
			}
			for _, i := range r.Interfaces {
				if i.Sandbox != "" && i.Mac != c.want {
					t.Errorf("result reports %s for %s, want %s", i.Mac, i.Name, c.want)
				}
			}
			if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
				t.Error(err)
			}
			if err := e.DelList(e.ConfList("1.1.0"), rt); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
	for _, c := range []struct {
		name   string
		capMAC string
		argMAC string
		code   uint
		msg    string
	}{
		{"capability malformed", "02:11:22", "", codeInvalidConfig, "runtimeConfig.mac"},
		{"capability group", "01:00:5e:00:00:01", "", codeInvalidConfig, "runtimeConfig.mac"},
		{"CNI_ARGS group", "", "ff:ff:ff:ff:ff:ff", codeInvalidEnv, "CNI_ARGS MAC"},
		{"CNI_ARGS zero", "", "00:00:00:00:00:00", codeInvalidEnv, "CNI_ARGS MAC"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newMACEnv(t)
			pod := e.NewPod()
			envv := pluginEnv("ADD", "badmac", pod, "eth0")
			if c.argMAC != "" {
				envv["CNI_ARGS"] = "IgnoreUnknown=1;MAC=" + c.argMAC
			}
			stdin := e.StdinConf(func(m map[string]any) {
				if c.capMAC != "" {
					m["runtimeConfig"] = map[string]any{"mac": c.capMAC}
				}
			})
			out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), envv, stdin)
			wantPluginError(t, c.name, out, err, c.code, c.msg)
			e.AssertClean()
		})
	}
}

// podRaw sends one Ethernet frame out of a pod interface with AF_PACKET, as
// a workload with CAP_NET_RAW can.
func podRaw(t *testing.T, pod ns.NetNS, ifname string, frame []byte) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		return syscall.Sendto(fd, frame, 0, &syscall.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6})
	})
	if err != nil {
		t.Fatalf("send a raw frame from the pod's %s: %v", ifname, err)
	}
}

func csumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func ethHeader(src, dst net.HardwareAddr, proto uint16) []byte {
	b := append(append(append([]byte{}, dst...), src...), byte(proto>>8), byte(proto))
	return b
}

// ipv4Frame builds an IPv4 packet (TTL 64, no options) around a payload.
func ipv4Frame(src, dst net.HardwareAddr, sip, dip net.IP, proto byte, payload []byte) []byte {
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, proto
	total := 20 + len(payload)
	h[2], h[3] = byte(total>>8), byte(total)
	copy(h[12:], sip.To4())
	copy(h[16:], dip.To4())
	c := csumFold(csumAdd(0, h))
	h[10], h[11] = byte(c>>8), byte(c)
	return append(append(ethHeader(src, dst, 0x0800), h...), payload...)
}

func ipv4UDPFrame(src, dst net.HardwareAddr, sip, dip net.IP) []byte {
	udp := []byte{0x30, 0x39, 0x00, 0x09, 0, 12, 0, 0, 'r', 'a', 'w', '!'} // checksum 0: none
	return ipv4Frame(src, dst, sip, dip, 17, udp)
}

// ipv6Frame builds an IPv6 packet: ext are extension headers (their first
// byte, the next header, is filled in) before an ICMPv6 message whose
// checksum is computed.
func ipv6Frame(src, dst net.HardwareAddr, sip, dip net.IP, hop byte, ext [][]byte, icmp []byte) []byte {
	icmp = append([]byte{}, icmp...)
	icmp[2], icmp[3] = 0, 0
	ps := append(append(append([]byte{}, sip.To16()...), dip.To16()...), 0, 0, byte(len(icmp)>>8), byte(len(icmp)), 0, 0, 0, 58)
	c := csumFold(csumAdd(csumAdd(0, ps), icmp))
	icmp[2], icmp[3] = byte(c>>8), byte(c)
	var payload []byte
	next := byte(58)
	for i := len(ext) - 1; i >= 0; i-- {
		e := append([]byte{}, ext[i]...)
		e[0] = next
		next = 60 // destination options
		if len(e) == 8 && e[1] == 0xff {
			next, e[1] = 44, 0 // a fragment header (marked by the caller)
		}
		payload = append(e, payload...)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	pl := len(payload) + len(icmp)
	h[4], h[5], h[6], h[7] = byte(pl>>8), byte(pl), next, hop
	copy(h[8:], sip.To16())
	copy(h[24:], dip.To16())
	return append(append(append(ethHeader(src, dst, 0x86dd), h...), payload...), icmp...)
}

// routerAdvert is an RA (router lifetime 30 min) with the source link-layer option.
func routerAdvert(mac net.HardwareAddr) []byte {
	return append([]byte{134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, mac...)
}

// TestIntegrityRouterAdvert: a pod's router advertisements and redirects
// never reach the node: on a node whose host veth accepts RAs even while
// forwarding (accept_ra=2), a pod's RA installed a default route through the
// pod before. Now RAs (plain, behind destination options, in a first
// fragment), ICMPv6 and ICMP redirects are dropped and counted as
// drop_router_msg, and the pod's other traffic flows.
func TestIntegrityRouterAdvert(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "ra")
	r := e.Add(pod, "ra")
	v4, v6 := testenv.PodIPs(t, r)
	hostIf, idx := e.HostVeth("ra")
	err := e.InNode(func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/"+hostIf+"/accept_ra", []byte("2"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	m := e.Maps()
	podMAC := podMACOf(t, pod, "eth0")
	hostMAC := hostMACOf(m, idx)
	allNodes, _ := net.ParseMAC("33:33:00:00:00:01")
	ll := net.ParseIP("fe80::42")
	ra := routerAdvert(podMAC)
	cases := []struct {
		name  string
		frame []byte
	}{
		{"RA", ipv6Frame(podMAC, allNodes, ll, net.ParseIP("ff02::1"), 255, nil, ra)},
		{"RA to the host veth's address", ipv6Frame(podMAC, hostMAC, ll, net.ParseIP("ff02::1"), 255, nil, ra)},
		{"RA behind destination options", ipv6Frame(podMAC, allNodes, ll, net.ParseIP("ff02::1"), 255,
			[][]byte{{0, 0, 1, 4, 0, 0, 0, 0}}, ra)},
		{"RA in a first fragment", ipv6Frame(podMAC, allNodes, ll, net.ParseIP("ff02::1"), 255,
			[][]byte{{0, 0xff, 0, 0, 0, 0, 0, 7}}, ra)},
		{"RA from the pod's global address", ipv6Frame(podMAC, allNodes, v6, net.ParseIP("ff02::1"), 255, nil, ra)},
		{"ICMPv6 redirect", ipv6Frame(podMAC, hostMAC, ll, net.ParseIP("fe80::1"), 255, nil,
			append([]byte{137, 0, 0, 0, 0, 0, 0, 0}, append(net.ParseIP("fe80::42").To16(), testenv.NodeIP6.To16()...)...))},
		{"ICMP redirect", ipv4Frame(podMAC, hostMAC, v4, testenv.NodeIP4, 1,
			icmp4([]byte{5, 1, 0, 0, 10, 250, 0, 99, 0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 192, 0, 2, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}))},
	}
	for _, c := range cases {
		before := counter(t, m, idx, maps.DirEgress, maps.ReasonDropRouterMsg).Packets
		podRaw(t, pod, "eth0", c.frame)
		waitCounter(t, m, idx, maps.ReasonDropRouterMsg, before+1)
	}
	// Each frame was counted as dropped by the pod's host veth program, so
	// the node never received it: its routes are checked as they are.
	if rs := e.NodeV6Defaults(idx); len(rs) > 0 {
		t.Errorf("the pod's RA gave the node a default route: %v", rs)
	}
	e.PodReachable(t, pod, []net.IP{v4, v6})
	e.MustDel(pod, "ra")
	e.AssertClean()
}

// icmp4 fills in an ICMP message's checksum.
func icmp4(b []byte) []byte {
	c := csumFold(csumAdd(0, b))
	b[2], b[3] = byte(c>>8), byte(c)
	return b
}

// TestReview17MACChangeAnnouncedByARP: the gratuitous ARP (arp_notify,
// now set by netlink) is what teaches the datapath a tuned MAC. In a pod
// with IPv6 on, its own IPv6 chatter at the MAC change (DAD, MLD) teaches
// it anyway, which hides a missing announcement; here the pod's netns has
// IPv6 off, so only the ARP can: the node reaches the retuned pod before
// the pod has sent anything of its own.
func TestReview17MACChangeAnnouncedByARP(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	newMAC, _ := net.ParseMAC("02:42:ac:11:00:97")
	list := e.NetList(e.Name, e.PluginConf(), map[string]any{"type": "tuning", "mac": newMAC.String(), "dataDir": t.TempDir()})
	pod := e.NewPod()
	for _, f := range []string{"all", "default"} {
		testenv.WriteSysctl(t, pod, "/proc/sys/net/ipv6/conf/"+f+"/disable_ipv6", "1")
	}
	rt := e.RuntimeConf(pod, "tunedarp", "eth0")
	t.Cleanup(func() { e.DelList(list, rt) })
	r, err := e.AddList(list, rt)
	if err != nil {
		t.Fatalf("ADD ebpf-cni + tuning: %v", err)
	}
	if got := podMACOf(t, pod, "eth0"); got.String() != newMAC.String() {
		t.Fatalf("tuning did not set the MAC: eth0 has %s", got)
	}
	v4, _ := resultIPs(r)
	if err := testenv.TCPTransfer(e.Node, pod, v4, 64<<10); err != nil {
		t.Errorf("node to the retuned pod %s: %v", v4, err)
	}
	if err := e.DelList(list, rt); err != nil {
		t.Fatal(err)
	}
	e.AssertClean()
}
