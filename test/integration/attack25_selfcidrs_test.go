package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// The remote host as another node of the peer list, with pod CIDRs of its
// own (a25SelfPeers).
const (
	a25PeerPods4 = "10.251.0.0/24"
	a25PeerPods6 = "fd00:251::/64"
)

// a25SelfPeers gives the lab's node its pod CIDRs the way the agent learns
// them: `ebpf-agent peers` with a list holding this node's entry (the
// uplink's addresses, the lab's pod subnets) and the remote host as
// another node; then cni_self_cidrs must hold the node's pod subnets.
// selfCIDRs overrides this node's entry's pod CIDRs.
func a25SelfPeers(t *testing.T, l *podPolLab, selfCIDRs ...string) {
	t.Helper()
	if len(selfCIDRs) == 0 {
		selfCIDRs = []string{testenv.PodSubnet4, testenv.PodSubnet6}
	}
	file := filepath.Join(t.TempDir(), "peers.json")
	pj, _ := json.Marshal([]agent.Peer{
		{NodeIP: uplinkIP4.String(), NodeIPs: []string{uplinkIP6.String()}, PodCIDRs: selfCIDRs},
		{NodeIP: remoteIP4.String(), NodeIPs: []string{remoteIP6.String()}, PodCIDRs: []string{a25PeerPods4, a25PeerPods6}},
	})
	must(t, os.WriteFile(file, pj, 0o600))
	if out, err := l.MasqAgent("peers", "--peers", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	a25WantSelfCIDRs(t, l, selfCIDRs...)
}

// a25WantSelfCIDRs wants cni_self_cidrs to hold exactly want.
func a25WantSelfCIDRs(t *testing.T, l *podPolLab, want ...string) {
	t.Helper()
	got, err := mapstest.SelfCIDRs(l.m)
	must(t, err)
	var g []string
	for _, p := range got {
		g = append(g, p.String())
	}
	var w []string
	for _, s := range want {
		w = append(w, netip.MustParsePrefix(s).Masked().String())
	}
	sort.Strings(g)
	sort.Strings(w)
	if fmt.Sprint(g) != fmt.Sprint(w) {
		t.Fatalf("cni_self_cidrs holds %v, want %v", g, w)
	}
}

// TestAttack25OutsideSourceUnassigned (attack25's red, round 18): a host
// beyond the uplink forging a source of this node's pod subnet that IPAM
// has not handed out (10.250.0.200, fd00:250::200) is dropped at the
// uplink as drop_spoof_ip once the agent knows the node's pod CIDRs (here
// from its entry of the peer list, as `ebpf-agent peers` and the Node
// follower give them), though a admits the subnet by ipBlock.
func TestAttack25OutsideSourceUnassigned(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	a25SelfPeers(t, l)
	a25OutsideAsPodSubnetIn(t, l, "unassigned", func(fam int, _ map[int]net.IP) net.IP {
		if fam == 4 {
			return net.ParseIP("10.250.0.200").To4()
		}
		return net.ParseIP("fd00:250::200")
	})
}

// TestAttack25OutsideUnassignedPodSubnetTCP: the same, two ways: the remote
// host holds 10.250.0.200 and fd00:250::200 on its loopback and dials pod
// a, which admits the node's pod subnet by ipBlock, from them. The node's
// default route goes via the remote host, which would carry a's answers
// back: no connection may come about.
func TestAttack25OutsideUnassignedPodSubnetTCP(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	a25SelfPeers(t, l)
	l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(prefix(testenv.PodSubnet4)), allowAll(prefix(testenv.PodSubnet6)))})
	serve(t, l.a, 8080, "a")
	src := map[int]net.IP{4: net.ParseIP("10.250.0.200").To4(), 6: net.ParseIP("fd00:250::200")}
	must(t, l.remote.Do(func(ns.NetNS) error {
		return ipCmds([]string{"addr", "add", "10.250.0.200/32", "dev", "lo"},
			[]string{"-6", "addr", "add", "fd00:250::200/128", "dev", "lo", "nodad"})
	}))
	for _, fam := range []int{4, 6} {
		before := a25UplinkSpoofDrops(t, l)
		var got string
		err := l.remote.Do(func(ns.NetNS) error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src[fam]}, Timeout: 2 * time.Second}
			c, err := d.Dial("tcp", hp(l.aIP[fam], 8080))
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 256)
			n, err := c.Read(buf)
			got = string(buf[:n])
			return err
		})
		if err == nil {
			t.Errorf("IPv%d: the remote host, as %s of this node's pod subnet, had a TCP connection with a: %q", fam, src[fam], got)
		}
		if d := a25UplinkSpoofDrops(t, l) - before; d == 0 {
			t.Errorf("IPv%d: the SYNs from %s were not counted as drop_spoof_ip on the uplink", fam, src[fam])
		}
	}
}

// TestSelfCIDRsRemotePodPasses: with the node's pod CIDRs known, a genuine
// pod of another node (the remote host, a peer with pod CIDRs of its own,
// sending from one of them) still reaches a, which admits its CIDR, and
// nothing is counted as drop_spoof_ip; and a pod CIDR this node's entry no
// longer lists leaves cni_self_cidrs at the next sync, an address of it no
// longer dropped.
func TestSelfCIDRsRemotePodPasses(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	a25SelfPeers(t, l)
	l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(prefix(a25PeerPods4)), allowAll(prefix(a25PeerPods6)),
		allowAll(prefix(testenv.PodSubnet4)), allowAll(prefix(testenv.PodSubnet6)))})
	const port = 9826
	peerPod := map[int]net.IP{4: net.ParseIP("10.251.0.7").To4(), 6: net.ParseIP("fd00:251::7")}
	unassigned := map[int]net.IP{4: net.ParseIP("10.250.0.200").To4(), 6: net.ParseIP("fd00:250::200")}
	for _, fam := range []int{4, 6} {
		ln := udpSocketPort(t, l.a, l.aIP[fam], port)
		before := a25UplinkSpoofDrops(t, l)
		marker := fmt.Sprintf("remote-pod-v%d", fam)
		sendForged(t, l.remote, &net.UDPAddr{IP: peerPod[fam], Port: 5002}, &net.UDPAddr{IP: l.aIP[fam], Port: port}, marker)
		if !bigReceived(ln, marker, 2*time.Second) {
			t.Errorf("IPv%d: another node's pod %s did not reach a, which admits its pod CIDR", fam, peerPod[fam])
		}
		if d := a25UplinkSpoofDrops(t, l) - before; d != 0 {
			t.Errorf("IPv%d: another node's pod %s: drop_spoof_ip on the uplink moved by %d, want 0", fam, peerPod[fam], d)
		}
	}
	// The node's entry now lists other CIDRs: the lab's subnets leave the
	// map, and an unassigned address of them is no longer dropped.
	a25SelfPeers(t, l, "10.252.0.0/24", "fd00:252::/64")
	for _, fam := range []int{4, 6} {
		ln := udpSocketPort(t, l.a, l.aIP[fam], port+1)
		marker := fmt.Sprintf("after-resync-v%d", fam)
		sendForged(t, l.remote, &net.UDPAddr{IP: unassigned[fam], Port: 5003}, &net.UDPAddr{IP: l.aIP[fam], Port: port + 1}, marker)
		if !bigReceived(ln, marker, 2*time.Second) {
			t.Errorf("IPv%d: %s, of a pod CIDR this node no longer lists, did not reach a", fam, unassigned[fam])
		}
	}
}

// TestSelfCIDRsAgentless: without the agent, the plugin derives no pod
// CIDR of the node from its IPAM range (which may span nodes):
// cni_self_cidrs stays empty after ADDs, and the uplink drops only the
// assigned addresses of this node's pods (TestAttack25OutsideSourceOfThisNodesPod),
// as before.
func TestSelfCIDRsAgentless(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	l.RunPod("b")
	a25WantSelfCIDRs(t, l)
	l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(prefix(testenv.PodSubnet4)), allowAll(prefix(testenv.PodSubnet6)))})
	const port = 9827
	unassigned := map[int]net.IP{4: net.ParseIP("10.250.0.200").To4(), 6: net.ParseIP("fd00:250::200")}
	for _, fam := range []int{4, 6} {
		ln := udpSocketPort(t, l.a, l.aIP[fam], port)
		before := a25UplinkSpoofDrops(t, l)
		marker := fmt.Sprintf("agentless-v%d", fam)
		sendForged(t, l.remote, &net.UDPAddr{IP: unassigned[fam], Port: 5004}, &net.UDPAddr{IP: l.aIP[fam], Port: port}, marker)
		if !bigReceived(ln, marker, 2*time.Second) {
			t.Errorf("IPv%d: agent-less, %s reached a no longer (the plugin took a pod CIDR of this node from IPAM?)", fam, unassigned[fam])
		}
		if d := a25UplinkSpoofDrops(t, l) - before; d != 0 {
			t.Errorf("IPv%d: agent-less: drop_spoof_ip on the uplink moved by %d, want 0", fam, d)
		}
	}
}

// TestSelfCIDRsAgentRunPeers: the running agent (`run --peers`) writes the
// node's pod CIDRs from its entry of the peer list into cni_self_cidrs and
// keeps them in sync at every reconcile: a CIDR the entry no longer lists
// leaves the map, a new one comes. While the lab's subnets are there, a
// forged unassigned address of them off the wire is dropped at the uplink.
func TestSelfCIDRsAgentRunPeers(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(prefix(testenv.PodSubnet4)), allowAll(prefix(testenv.PodSubnet6)))})
	file := filepath.Join(t.TempDir(), "peers.json")
	write := func(self ...string) {
		pj, _ := json.Marshal([]agent.Peer{
			{NodeIP: uplinkIP4.String(), NodeIPs: []string{uplinkIP6.String()}, PodCIDRs: self},
			{NodeIP: remoteIP4.String(), NodeIPs: []string{remoteIP6.String()}, PodCIDRs: []string{a25PeerPods4, a25PeerPods6}},
		})
		must(t, os.WriteFile(file+".tmp", pj, 0o600))
		must(t, os.Rename(file+".tmp", file))
	}
	expect := func(when string, want ...string) {
		t.Helper()
		var w []string
		for _, s := range want {
			w = append(w, netip.MustParsePrefix(s).String())
		}
		sort.Strings(w)
		var got []string
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ps, err := mapstest.SelfCIDRs(l.m)
			must(t, err)
			got = got[:0]
			for _, p := range ps {
				got = append(got, p.String())
			}
			sort.Strings(got)
			if fmt.Sprint(got) == fmt.Sprint(w) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: cni_self_cidrs holds %v, want %v", when, got, w)
			}
		}
	}
	write(testenv.PodSubnet4, testenv.PodSubnet6)
	ag := l.StartAgent(l.WriteConfDir(), "--metrics-addr", "", "--peers", file, "--reconcile-interval", "1s")
	defer ag.Stop()
	expect("agent started", testenv.PodSubnet4, testenv.PodSubnet6)
	const port = 9828
	unassigned := map[int]net.IP{4: net.ParseIP("10.250.0.200").To4(), 6: net.ParseIP("fd00:250::200")}
	for _, fam := range []int{4, 6} {
		ln := udpSocketPort(t, l.a, l.aIP[fam], port)
		before := a25UplinkSpoofDrops(t, l)
		marker := fmt.Sprintf("agent-run-v%d", fam)
		sendForged(t, l.remote, &net.UDPAddr{IP: unassigned[fam], Port: 5005}, &net.UDPAddr{IP: l.aIP[fam], Port: port}, marker)
		if bigReceived(ln, marker, time.Second) {
			t.Errorf("IPv%d: with the agent running, %s of this node's pod CIDRs reached a", fam, unassigned[fam])
		}
		if d := a25UplinkSpoofDrops(t, l) - before; d != 1 {
			t.Errorf("IPv%d: with the agent running: drop_spoof_ip on the uplink moved by %d, want 1", fam, d)
		}
	}
	write("10.252.0.0/24", testenv.PodSubnet6)
	expect("the node's entry changed", "10.252.0.0/24", testenv.PodSubnet6)
	write()
	expect("the node's entry lists none")
}
