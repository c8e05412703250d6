package integration

import (
	"encoding/binary"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a25RawTCP opens a raw TCP socket in netns (fam 4 or 6): it gets a copy of
// every TCP segment the netns takes in.
func a25RawTCP(t *testing.T, netns ns.NetNS, fam int) int {
	t.Helper()
	var fd int
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		if fam == 4 {
			fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_TCP)
		} else {
			fd, err = syscall.Socket(syscall.AF_INET6, syscall.SOCK_RAW, syscall.IPPROTO_TCP)
		}
		return err
	}))
	t.Cleanup(func() { syscall.Close(fd) })
	tv := syscall.NsecToTimeval(int64(200 * time.Millisecond))
	must(t, syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv))
	return fd
}

// a25SawTCPFrom reads fd (a25RawTCP's) for d and returns the source ports in
// [lo, hi] of the segments to port dport it saw.
func a25SawTCPFrom(fd, fam, lo, hi, dport int, d time.Duration) []int {
	var seen []int
	buf := make([]byte, 4096)
	for end := time.Now().Add(d); time.Now().Before(end); {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil {
			continue
		}
		off := 0
		if fam == 4 {
			off = int(buf[0]&0x0f) * 4
		}
		if n < off+4 {
			continue
		}
		sp, dp := int(binary.BigEndian.Uint16(buf[off:])), int(binary.BigEndian.Uint16(buf[off+2:]))
		if dp == dport && sp >= lo && sp <= hi {
			seen = append(seen, sp)
		}
	}
	return seen
}

// a25EchoFrame is an ICMP (IPv4) or ICMPv6 echo request sip -> dip.
func a25EchoFrame(src, dst net.HardwareAddr, sip, dip net.IP, id uint16) []byte {
	m := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 'a', '2', '5'}
	if sip.To4() == nil {
		m[0] = 128
		return l4Frame(src, dst, sip, dip, 58, m, 2)
	}
	binary.BigEndian.PutUint16(m[2:], csum16(m))
	return l4Frame(src, dst, sip, dip, 1, m, -1)
}

// TestAttack25PodForgedSourcesTCPAndICMP: attack19 forged UDP from a pod;
// here TCP SYNs and ICMP echo requests. Pod x (open both ways) sends pod a
// (whose ingress admits pod b, the remote host and, as every pod's, the
// node) SYNs to a served port and echo requests, raw frames out of its eth0,
// from b's address, the remote host's, the node's two addresses, an
// unassigned address of the pod subnet and a's own. The docs: "A pod cannot
// forge its way in: its source address is checked first (anti-spoofing)";
// observe.md: drop_spoof_ip, counted on the sender's host veth, egress. So
// each frame is one drop_spoof_ip egress on x's host veth and a's IP layer
// takes in none of them. Control: x's own SYN to a is refused by a's
// policy at a's door (drop_policy ingress), not by the spoof check.
func TestAttack25PodForgedSourcesTCPAndICMP(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	_, rb := l.RunPod("b")
	b4, b6 := resultIPs(rb)
	x, rx := l.RunPod("x")
	x4, x6 := resultIPs(rx)
	_, bidx := l.HostVeth("b")
	_, xidx := l.HostVeth("x")
	must(t, l.w.Apply(uint32(bidx), policy.Endpoint{}))
	must(t, l.w.Apply(uint32(xidx), policy.Endpoint{}))
	l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(host(b4)), allowAll(host(b6)),
		allowAll(host(remoteIP[4])), allowAll(host(remoteIP[6])))})
	serve(t, l.a, 8080, "a")
	xMAC, xGW := podMACOf(t, x, "eth0"), hostMACOf(l.m, xidx)
	srcs := map[int][]net.IP{
		4: {b4, remoteIP[4], uplinkIP[4], testenv.NodeIP4, net.ParseIP("10.250.0.200").To4(), l.aIP[4]},
		6: {b6, remoteIP[6], uplinkIP[6], testenv.NodeIP6, net.ParseIP("fd00:250::200"), l.aIP[6]},
	}
	for _, fam := range []int{4, 6} {
		reach(t, l.remote, "tcp", l.aIP[fam], 8080, "a") // the remote host itself: admitted
		var frames [][]byte
		for i, src := range srcs[fam] {
			frames = append(frames,
				tcpFrame(xMAC, xGW, src, 40000+i, l.aIP[fam], 8080, 1000, 0, tcpSYN, 512),
				a25EchoFrame(xMAC, xGW, src, l.aIP[fam], uint16(0x2500+i)))
		}
		spoof0 := counter(t, l.m, xidx, maps.DirEgress, maps.ReasonDropSpoofIP).Packets
		tcpFD, icmpFD := a25RawTCP(t, l.a, fam), rawICMPListen(t, l.a, fam)
		sendFrames(t, x, "eth0", frames)
		if seen := a25SawTCPFrom(tcpFD, fam, 40000, 40000+len(srcs[fam]), 8080, time.Second); len(seen) != 0 {
			t.Errorf("IPv%d: a took in forged SYNs from source ports %v", fam, seen)
		}
		if rawSaw(icmpFD, []byte("a25"), 300*time.Millisecond) {
			t.Errorf("IPv%d: a took in a forged echo request", fam)
		}
		if d := counter(t, l.m, xidx, maps.DirEgress, maps.ReasonDropSpoofIP).Packets - spoof0; d != uint64(len(frames)) {
			t.Errorf("IPv%d: x's %d forged frames moved its drop_spoof_ip egress counter by %d", fam, len(frames), d)
		}
		// Control: x as itself is judged by a's rules.
		pol0 := counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets
		xIP := map[int]net.IP{4: x4, 6: x6}[fam]
		sendFrames(t, x, "eth0", [][]byte{tcpFrame(xMAC, xGW, xIP, 40100, l.aIP[fam], 8080, 1000, 0, tcpSYN, 512)})
		time.Sleep(200 * time.Millisecond)
		if d := counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets - pol0; d != 1 {
			t.Errorf("IPv%d: x's own SYN moved a's drop_policy ingress counter by %d, want 1", fam, d)
		}
		// Control of the detection: admitted, x's own SYN and echo request
		// are seen by a's raw sockets.
		l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(host(xIP)))})
		sendFrames(t, x, "eth0", [][]byte{tcpFrame(xMAC, xGW, xIP, 40000, l.aIP[fam], 8080, 1000, 0, tcpSYN, 512),
			a25EchoFrame(xMAC, xGW, xIP, l.aIP[fam], 0x2599)})
		if seen := a25SawTCPFrom(tcpFD, fam, 40000, 40000, 8080, time.Second); len(seen) == 0 {
			t.Errorf("IPv%d: a's raw TCP socket did not see x's admitted SYN: the check above proves nothing", fam)
		}
		if !rawSaw(icmpFD, []byte("a25"), time.Second) {
			t.Errorf("IPv%d: a's raw ICMP socket did not see x's admitted echo request: the check above proves nothing", fam)
		}
		l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(host(b4)), allowAll(host(b6)),
			allowAll(host(remoteIP[4])), allowAll(host(remoteIP[6])))})
	}
}
