// Services: kube-proxy's NAT beside the fast path, replies through the stack.

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// Services of the kube-proxy lab, per family: ClusterIPs, NodePorts and the
// hostPort of pod h.
var (
	svcWeb   = map[int]net.IP{4: net.ParseIP("10.96.0.10").To4(), 6: net.ParseIP("fd00:96::10")}
	svcLocal = map[int]net.IP{4: net.ParseIP("10.96.0.11").To4(), 6: net.ParseIP("fd00:96::11")}
	svcHP    = map[int]net.IP{4: net.ParseIP("10.96.0.12").To4(), 6: net.ParseIP("fd00:96::12")}
	svcExt   = map[int]net.IP{4: net.ParseIP("10.96.0.20").To4(), 6: net.ParseIP("fd00:96::20")}
	svcDNS   = map[int]net.IP{4: net.ParseIP("10.96.0.53").To4(), 6: net.ParseIP("fd00:96::53")}
	uplinkIP = map[int]net.IP{4: uplinkIP4, 6: uplinkIP6}
	remoteIP = map[int]net.IP{4: remoteIP4, 6: remoteIP6}
	nodeIP   = map[int]net.IP{4: testenv.NodeIP4, 6: testenv.NodeIP6}
	cluster  = map[int]string{4: testenv.PodSubnet4, 6: testenv.PodSubnet6}
)

const (
	npWeb      = 30080 // NodePort of web (externalTrafficPolicy Cluster)
	npLocal    = 30081 // NodePort of local (externalTrafficPolicy Local)
	npHP       = 30082 // NodePort of hp, whose endpoint has a hostPort
	hostPortH  = 8081  // pod h's hostPort (tcp and udp) -> 80
	closedPort = 54    // a port of web whose endpoint port has no listener (udp)
)

// svcLab is a node running ebpf-cni with kube-proxy-shaped rules, a remote
// host behind its uplink (the node's default gateway, with routes to the
// pods), pod a (a client), pod b (endpoint of web, local and dns) and pod h
// (endpoint of hp, with hostPort 8081). The remote host serves ext's
// endpoint on port 7000.
type svcLab struct {
	*hpEnv
	masq    bool
	fams    []int // the pods' families: 4 and 6, or 4 only (an IPv4-only network)
	a, b, h ns.NetNS
	ip      map[string]map[int]net.IP // pod -> family -> address
}

func newSvcLab(t *testing.T, mode proxyMode, masq bool) *svcLab {
	t.Helper()
	return newSvcLabFams(t, mode, masq, []int{4, 6})
}

// newSvcLabFams is newSvcLab with pods of the families fams only.
func newSvcLabFams(t *testing.T, mode proxyMode, masq bool, fams []int) *svcLab {
	t.Helper()
	h := newHPEnv(t)
	if masq {
		h.Extra["ipMasq"] = true
	}
	if len(fams) == 1 {
		h.IPAM = map[string]any{"type": "host-local", "dataDir": h.DataDir, "ranges": [][]map[string]string{{{"subnet": cluster[fams[0]]}}}}
	}
	l := &svcLab{hpEnv: h, masq: masq, fams: fams, ip: map[string]map[int]net.IP{}}
	// A node's default route (a first route is what OUTPUT DNAT needs), and
	// the pod routes a host-gw or BGP peer would give the remote host.
	for _, fam := range []int{4, 6} {
		routeVia(t, h.Node, "", remoteIP[fam])
		routeVia(t, h.remote, cluster[fam], uplinkIP[fam])
	}
	l.a, l.b, l.h = h.NewPod(), h.NewPod(), h.NewPod()
	for _, p := range []struct {
		id  string
		pod ns.NetNS
	}{{"a", l.a}, {"b", l.b}} {
		h.CleanupDel(p.pod, p.id)
		v4, v6 := resultIPs(h.Add(p.pod, p.id))
		l.ip[p.id] = map[int]net.IP{4: v4, 6: v6}
	}
	v4, v6 := resultIPs(h.MustAddHP(l.h, "h", testenv.PM{HostPort: hostPortH, ContainerPort: 80, Protocol: "tcp"},
		testenv.PM{HostPort: hostPortH, ContainerPort: 80, Protocol: "udp"}))
	l.ip["h"] = map[int]net.IP{4: v4, 6: v6}
	serve(t, l.b, 8080, "b")
	serve(t, l.b, 53, "dns")
	serve(t, l.h, 80, "h")
	serve(t, h.remote, 7000, "remote")
	for _, fam := range fams {
		mode.install(t, h.Node, fam, cluster[fam], []net.IP{uplinkIP[fam], nodeIP[fam]}, l.services(fam))
	}
	return l
}

func (l *svcLab) services(fam int) []svcPort {
	b, h := l.ip["b"][fam], l.ip["h"][fam]
	var out []svcPort
	for _, p := range []string{"tcp", "udp"} {
		out = append(out,
			svcPort{name: "web-" + p, proto: p, clusterIP: svcWeb[fam], port: 80, nodePort: npWeb, backend: b, target: 8080},
			svcPort{name: "local-" + p, proto: p, clusterIP: svcLocal[fam], port: 80, nodePort: npLocal, local: true, backend: b, target: 8080},
			svcPort{name: "dns-" + p, proto: p, clusterIP: svcDNS[fam], port: 53, noDetectLocal: true, backend: b, target: 53},
			svcPort{name: "hp-" + p, proto: p, clusterIP: svcHP[fam], port: 80, nodePort: npHP, backend: h, target: 80},
			svcPort{name: "ext-" + p, proto: p, clusterIP: svcExt[fam], port: 80, backend: remoteIP[fam], target: 7000},
		)
	}
	return append(out, svcPort{name: "closed-udp", proto: "udp", clusterIP: svcWeb[fam], port: closedPort, backend: b, target: 5454})
}

// peer is the address a server saw the client as.
func peer(t *testing.T, a answer) net.IP {
	t.Helper()
	h, _, err := net.SplitHostPort(a.peer)
	if err != nil {
		t.Fatalf("server saw %q: %v", a.peer, err)
	}
	return net.ParseIP(h)
}

// want asks ip:port over proto from netns and wants server's answer, the
// UDP reply from the address dialled, and (unless nil) the client seen as
// wantPeer; notPeer (unless nil) is an address the server must not see.
func want(t *testing.T, from ns.NetNS, proto string, ip net.IP, port int, server string, wantPeer, notPeer net.IP) {
	t.Helper()
	a := expectServer(t, from, proto, hp(ip, port), server)
	if a.server != server {
		return
	}
	got := peer(t, a)
	if wantPeer != nil && !got.Equal(wantPeer) {
		t.Errorf("%s %s: the server saw the client as %s, want %s", proto, hp(ip, port), got, wantPeer)
	}
	if notPeer != nil && got.Equal(notPeer) {
		t.Errorf("%s %s: the server saw the client as %s", proto, hp(ip, port), got)
	}
}

// TestServicesIptables and TestServicesNftables: with kube-proxy's rules
// (iptables mode through iptables-nft and iptables-legacy, nftables mode),
// every Service path works over TCP and UDP, IPv4 and IPv6, with ipMasq off
// and on: the replies of flows the stack translated go back through it.
func TestServicesIptables(t *testing.T) {
	t.Parallel()
	for _, m := range proxyModes[:2] {
		runServices(t, m)
	}
}

func TestServicesNftables(t *testing.T) {
	t.Parallel()
	runServices(t, proxyModes[2])
}

func runServices(t *testing.T, mode proxyMode) {
	for _, masq := range []bool{false, true} {
		t.Run(fmt.Sprintf("%s/ipMasq=%v", mode.name, masq), func(t *testing.T) {
			t.Parallel()
			l := newSvcLab(t, mode, masq)
			l.cases(t)
			l.teardown(t)
		})
	}
}

func (l *svcLab) cases(t *testing.T) {
	each := func(name string, protos []string, f func(t *testing.T, fam int, proto string)) {
		t.Run(name, func(t *testing.T) {
			for _, fam := range l.fams {
				for _, p := range protos {
					f(t, fam, p)
				}
			}
		})
	}
	both := []string{"tcp", "udp"}
	ip := func(pod string, fam int) net.IP { return l.ip[pod][fam] }

	each("pod-clusterip-pod-same-node", both, func(t *testing.T, fam int, p string) {
		want(t, l.a, p, svcWeb[fam], 80, "b", ip("a", fam), nil)
	})
	each("dns-like-udp-service", both, func(t *testing.T, fam int, p string) {
		want(t, l.a, p, svcDNS[fam], 53, "dns", ip("a", fam), nil)
	})
	each("pod-clusterip-itself-hairpin", both, func(t *testing.T, fam int, p string) {
		// kube-proxy masquerades it: b must not see itself as the client.
		want(t, l.b, p, svcWeb[fam], 80, "b", nil, ip("b", fam))
	})
	each("node-clusterip-pod", both, func(t *testing.T, fam int, p string) {
		want(t, l.Node, p, svcWeb[fam], 80, "b", nil, nil)
	})
	each("remote-nodeport-pod", both, func(t *testing.T, fam int, p string) {
		// Cluster policy: masqueraded by kube-proxy; the reply leaves with
		// the node address and the NodePort (want checks UDP's source).
		want(t, l.remote, p, uplinkIP[fam], npWeb, "b", nil, remoteIP[fam])
	})
	each("remote-nodeport-local-policy", both, func(t *testing.T, fam int, p string) {
		// DNAT without SNAT: b sees the remote host, and its reply must
		// still leave as uplink:NodePort, not masqueraded by ebpf-cni.
		want(t, l.remote, p, uplinkIP[fam], npLocal, "b", remoteIP[fam], nil)
	})
	each("pod-nodeport-own-node", both, func(t *testing.T, fam int, p string) {
		for _, node := range []net.IP{uplinkIP[fam], nodeIP[fam]} {
			want(t, l.a, p, node, npWeb, "b", nil, nil)
			// Local policy: pods take the cluster path, unmasqueraded.
			want(t, l.a, p, node, npLocal, "b", ip("a", fam), nil)
		}
	})
	each("hostport-and-nodeport", both, func(t *testing.T, fam int, p string) {
		want(t, l.remote, p, uplinkIP[fam], hostPortH, "h", remoteIP[fam], nil)
		want(t, l.remote, p, uplinkIP[fam], npWeb, "b", nil, nil)
	})
	each("service-backend-with-hostport", both, func(t *testing.T, fam int, p string) {
		want(t, l.a, p, svcHP[fam], 80, "h", ip("a", fam), nil)
		want(t, l.remote, p, uplinkIP[fam], npHP, "h", nil, nil)
		want(t, l.a, p, uplinkIP[fam], hostPortH, "h", nil, nil)
		want(t, l.Node, p, uplinkIP[fam], hostPortH, "h", nil, nil)
	})
	each("service-endpoint-off-node", both, func(t *testing.T, fam int, p string) {
		// DNAT to the remote host, then (ipMasq) the BPF SNAT on the way
		// out: both translations undone on the way back.
		seen := ip("a", fam)
		if l.masq {
			seen = uplinkIP[fam]
		}
		want(t, l.a, p, svcExt[fam], 80, "remote", seen, nil)
	})
	each("remote-to-pod-directly", both, func(t *testing.T, fam int, p string) {
		// No Service: a host routed to the pod. Its TCP replies keep the
		// pod's address, masquerading pod or not. A masquerading pod's UDP
		// is masqueraded whatever came in before (what a host outside
		// sends must not switch it off, issue 28): a host outside the
		// cluster CIDRs gets its answer from the node's address; listing
		// its network in clusterCIDRs is what makes it a direct peer.
		if l.masq && p == "udp" {
			a, err := askUDP(l.remote, hp(ip("b", fam), 8080))
			if err != nil {
				t.Fatal(err)
			}
			if h, _, _ := net.SplitHostPort(a.from); a.server != "b" || !net.ParseIP(h).Equal(uplinkIP[fam]) {
				t.Errorf("UDP straight to masquerading b: answered by %q from %s, want b from %s (masqueraded)", a.server, a.from, uplinkIP[fam])
			}
		} else {
			want(t, l.remote, p, ip("b", fam), 8080, "b", remoteIP[fam], nil)
		}
		if p == "udp" { // and ICMP echo, once per family
			if err := pingReplyFrom(l.remote, ip("b", fam)); err != nil {
				t.Error(err)
			}
		}
	})
	each("icmp-error-of-service-flow", []string{"udp"}, func(t *testing.T, fam int, _ string) {
		if err := l.refused(svcWeb[fam], closedPort); err != nil {
			t.Error(err)
		}
	})
	each("node-socket-on-a-hostport-number", []string{"udp"}, func(t *testing.T, fam int, _ string) {
		// A node socket bound to port 8081 (h's UDP hostPort) asks dns,
		// which kube-proxy does not masquerade: the answer to
		// uplink:8081 is the socket's, not a hostPort hairpin to h.
		a, err := askFrom(l.Node, "udp", hp(svcDNS[fam], 53), hostPortH)
		if err != nil {
			t.Fatal(err)
		}
		if a.server != "dns" || a.from != hp(svcDNS[fam], 53) {
			t.Errorf("answered by %q from %s, want dns from %s", a.server, a.from, hp(svcDNS[fam], 53))
		}
	})
	each("direct-flow-on-tuple-of-service-flow", []string{"tcp"}, func(t *testing.T, fam int, _ string) {
		// The same client port first through web, then straight to b: the
		// direct flow must not go half through the stack (conntrack still
		// holds the first flow; kube-proxy drops INVALID packets).
		// Above the ephemeral range (32768-60999): no earlier connection of a holds it.
		lport := 61200 + fam*10
		for i := 0; i < 3; i++ {
			if err := askReset(l.a, hp(svcWeb[fam], 80), lport, "b"); err != nil {
				t.Fatal(err)
			}
			if err := askReset(l.a, hp(ip("b", fam), 8080), lport, "b"); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("stack-flows-recorded", func(t *testing.T) {
		_, bIdx := l.HostVeth("b")
		flows, err := l.Maps().StackFlows().List()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, f := range flows {
			if f.Ifindex == bIdx && f.Pod.Port() == 8080 && f.Flags&maps.StackFlowPeerPod != 0 {
				seen[maps.ProtoName(f.Proto)+fmt.Sprint(f.Pod.Addr().Is4())] = true
			}
		}
		if len(seen) != 2*len(l.fams) {
			t.Errorf("pod b's stack flows from pods: %v, want tcp and udp of both families; all: %+v", seen, flows)
		}
		js, err := l.MasqAgent("dump", "ct", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var d inspect.CTDump
		if err := json.Unmarshal(js, &d); err != nil {
			t.Fatalf("dump ct -o json: %v\n%s", err, js)
		}
		rows := 0
		for _, r := range d.Flows {
			if r.Kind == "stack/pod" && r.Interface != "" && strings.HasSuffix(r.Pod, ":8080") {
				rows++
			}
		}
		if rows < 2*len(l.fams) {
			t.Errorf("dump ct shows %d stack/pod rows of b:8080, want one per flow:\n%s", rows, js)
		}
	})
	t.Run("plain-pod-to-pod-keeps-fast-path", func(t *testing.T) {
		// After all of the above, a direct transfer between a and b still
		// takes bpf_redirect_peer both ways: a probe in the node's forward
		// hook counts the transfer's packets the stack forwarded (none).
		const port = 9099
		restore(t, l.Node, "nft", fmt.Sprintf(`add table inet probe
add chain inet probe pfwd { type filter hook forward priority 10 ; }
add rule inet probe pfwd meta l4proto tcp th sport %d counter
add rule inet probe pfwd meta l4proto tcp th dport %d counter
`, port, port), "-f", "-")
		_, bIdx := l.HostVeth("b")
		m := l.Maps()
		for _, fam := range l.fams {
			red := counter(t, m, bIdx, maps.DirIngress, maps.ReasonRedirect)
			if err := testenv.TCPTransferPort(l.a, l.b, ip("b", fam), port, 1<<20); err != nil {
				t.Fatal(err)
			}
			if d := counter(t, m, bIdx, maps.DirIngress, maps.ReasonRedirect).Packets - red.Packets; d < 10 {
				t.Errorf("IPv%d a -> b: %d packets redirected into b, want the transfer's", fam, d)
			}
		}
		probe := func() string {
			var out string
			l.Node.Do(func(ns.NetNS) error {
				b, err := exec.Command("nft", "list", "chain", "inet", "probe", "pfwd").CombinedOutput()
				out = string(b)
				return err
			})
			return out
		}
		if out := probe(); strings.Count(out, "counter packets 0 ") != 2 {
			t.Errorf("the stack forwarded packets of a direct a <-> b transfer:\n%s", out)
		}
		// The probe does see what the stack forwards: the remote host to b.
		if err := testenv.TCPTransferPort(l.remote, l.b, ip("b", 4), port, 1<<16); err != nil {
			t.Fatal(err)
		}
		if out := probe(); strings.Count(out, "counter packets 0 ") != 0 {
			t.Errorf("the probe missed packets the stack forwarded:\n%s", out)
		}
	})
}

// refused sends UDP from pod a to ip:port, whose endpoint has no listener:
// the endpoint's ICMP port unreachable must reach a's connected socket,
// translated back by conntrack (ECONNREFUSED).
func (l *svcLab) refused(ip net.IP, port int) error {
	return l.a.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", hp(ip, port))
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		var last error
		for try := 0; try < 3; try++ {
			c.Write([]byte("ping"))
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, last = c.Read(buf)
			if errors.Is(last, syscall.ECONNREFUSED) {
				return nil
			}
		}
		return fmt.Errorf("UDP to %s with no listener behind it: %v, want connection refused (the ICMP error)", hp(ip, port), last)
	})
}

// askReset connects from local port lport, reads the answer and closes with
// a RST (no TIME_WAIT: the next call may reuse the port at once).
func askReset(netns ns.NetNS, addr string, lport int, server string) error {
	return netns.Do(func(ns.NetNS) error {
		// SO_REUSEADDR: a socket just closed with a RST may still hold its
		// explicitly bound port for a moment.
		reuse := func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
			})
			return errors.Join(err, serr)
		}
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: lport}, Control: reuse}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return fmt.Errorf("connect %s from port %d: %w", addr, lport, err)
		}
		defer c.Close()
		c.(*net.TCPConn).SetLinger(0)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 128)
		n, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("read from %s (port %d): %w", addr, lport, err)
		}
		if !strings.HasPrefix(string(buf[:n]), server+" ") {
			return fmt.Errorf("%s answered %q, want %s", addr, buf[:n], server)
		}
		return nil
	})
}

// teardown deletes the pods: nothing of them is left, stack flows included.
func (l *svcLab) teardown(t *testing.T) {
	for _, id := range []string{"a", "b", "h"} {
		pod := map[string]ns.NetNS{"a": l.a, "b": l.b, "h": l.h}[id]
		l.MustDel(pod, id)
	}
	flows, err := l.Maps().StackFlows().List()
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 0 {
		t.Errorf("stack flows left after DEL: %+v", flows)
	}
	l.AssertClean()
	l.AssertNoHostPorts()
}

// TestServicesStackFlowsReconciled: the stack flows of a pod that vanished
// with no DEL and no record (a crash) are found by ebpf-agent reconcile and
// removed; a live pod's stay.
func TestServicesStackFlowsReconciled(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b, c := e.NewPod(), e.NewPod(), e.NewPod()
	for id, p := range map[string]ns.NetNS{"a": a, "b": b, "c": c} {
		e.CleanupDel(p, id)
	}
	e.Add(a, "a")
	b4, _ := testenv.PodIPs(t, e.Add(b, "b"))
	c4, _ := testenv.PodIPs(t, e.Add(c, "c"))
	serve(t, b, 8080, "b")
	serve(t, c, 8080, "c")
	svc := func(name string, ip, backend net.IP) svcPort {
		return svcPort{name: name, proto: "tcp", clusterIP: ip, port: 80, backend: backend, target: 8080}
	}
	restore(t, e.Node, "nft", nftRules(4, testenv.PodSubnet4, []net.IP{testenv.NodeIP4},
		[]svcPort{svc("b", svcWeb[4], b4), svc("c", svcLocal[4], c4)}), "-f", "-")
	want(t, a, "tcp", svcWeb[4], 80, "b", nil, nil)
	want(t, a, "tcp", svcLocal[4], 80, "c", nil, nil)

	_, bIdx := e.HostVeth("b")
	_, cIdx := e.HostVeth("c")
	m := e.Maps()
	of := func(idx int) int {
		flows, err := m.StackFlows().List()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range flows {
			if f.Ifindex == idx {
				n++
			}
		}
		return n
	}
	if of(bIdx) == 0 || of(cIdx) == 0 {
		t.Fatalf("no stack flows recorded for b (%d) or c (%d)", of(bIdx), of(cIdx))
	}
	// b crashes: its record is lost and its veth goes, no DEL.
	os.Remove(filepath.Join(e.StateDir, e.Name, "b_eth0.json"))
	if err := e.InNode(func() error { return deleteHostLink(state.HostIfName("b", "eth0")) }); err != nil {
		t.Fatal(err)
	}
	out, err := e.AgentCmd(append([]string{"reconcile", "-o", "json"}, e.AgentArgs(e.WriteConfDir())...)...)
	if err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	if !strings.Contains(out, `"stack-flows"`) {
		t.Errorf("reconcile removed no stack flows:\n%s", out)
	}
	if n := of(bIdx); n != 0 {
		t.Errorf("%d stack flows of the vanished pod left", n)
	}
	if of(cIdx) == 0 {
		t.Errorf("reconcile removed the live pod's stack flows")
	}
	want(t, a, "tcp", svcLocal[4], 80, "c", nil, nil)
	for id, p := range map[string]ns.NetNS{"a": a, "b": b, "c": c} {
		if err := e.Del(p, id, "eth0"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.Leftovers()); n != 0 {
		t.Fatalf("left: %v", e.Leftovers())
	}
	if flows, _ := m.StackFlows().List(); len(flows) != 0 {
		t.Errorf("stack flows left: %+v", flows)
	}
}

// pingReplyFrom pings ip from netns and checks the replies come from ip itself
// (ping counts a reply by its echo id, whatever its source).
func pingReplyFrom(netns ns.NetNS, ip net.IP) error {
	return netns.Do(func(ns.NetNS) error {
		args := []string{"-c", "2", "-i", "0.2", "-W", "2", ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping %s: %v\n%s", ip, err, out)
		}
		if !strings.Contains(string(out), "bytes from "+ip.String()+":") {
			return fmt.Errorf("ping %s: replies not from %s:\n%s", ip, ip, out)
		}
		return nil
	})
}

// TestReview17ServicesV4Only: every Service path of the kube-proxy lab
// (iptables mode, ipMasq off and on; hostPort, NodePort, hairpin, endpoint
// off node, ICMP errors, stack flows, the fast path) on an IPv4-only
// network, whose host veths carry no IPv6.
func TestReview17ServicesV4Only(t *testing.T) {
	t.Parallel()
	for _, masq := range []bool{false, true} {
		t.Run(fmt.Sprintf("ipMasq=%v", masq), func(t *testing.T) {
			t.Parallel()
			l := newSvcLabFams(t, proxyModes[0], masq, []int{4})
			hostIf, _ := l.HostVeth("b")
			if got := testenv.ReadSysctl(t, l.Node, "/proc/sys/net/ipv6/conf/"+hostIf+"/disable_ipv6"); got != "1" {
				t.Fatalf("host veth %s of an IPv4-only network: disable_ipv6 %s, want 1", hostIf, got)
			}
			l.cases(t)
			l.teardown(t)
		})
	}
}
