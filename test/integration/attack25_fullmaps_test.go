package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack25FullFlowTablesHoldPolicy: a pod fills the flow table it can
// fill, and a denied host floods, and the policy holds. Pod a admits pod x
// only and may send only to the remote host's TCP 7101 (a25Lab's
// connection, open). x, admitted, sends a 3000 UDP datagrams and 1000 TCP
// SYNs from distinct ports per family (each a new flow a's table of the
// flows its peers opened must hold or evict); the remote host, denied,
// sends a 2000 UDP datagrams from distinct ports per family. The docs
// (networkpolicy.md, "Flow tables"): a table holds 128 flows and evicts its
// own least recently used; what a peer opens never evicts the flows the
// pod opened; a flow that no entry holds is judged by the rules; every
// policy drop is counted on the pod's host veth (observe.md) and shown by
// `ebpf-agent dump policy`. So: a's tables hold at most 2 x 128 flows; a's
// own connection to the remote host still passes both ways; each of the
// remote host's datagrams is dropped and counted; the remote host still
// cannot reach a afterwards; x still can, by a new flow.
func TestAttack25FullFlowTablesHoldPolicy(t *testing.T) {
	t.Parallel()
	l, flows := a25Lab(t)
	x, rx := l.RunPod("x")
	x4, x6 := resultIPs(rx)
	xIP := map[int]net.IP{4: x4, 6: x6}
	_, xidx := l.HostVeth("x")
	l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(host(x4)), allowAll(host(x6))), Egress: isolated(a25Allow(4), a25Allow(6))})
	must(t, l.w.Apply(uint32(xidx), policy.Endpoint{}))
	serve(t, l.a, 8080, "a")
	for _, fam := range []int{4, 6} {
		reach(t, x, "udp", l.aIP[fam], 8080, "a")
		blocked(t, l.remote, "udp", l.aIP[fam], 8080)
	}
	drops := func() uint64 { return counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets }

	xMAC, xGW := podMACOf(t, x, "eth0"), hostMACOf(l.m, xidx)
	remMAC, upMAC := linkMAC(t, l.remote, "eth0"), linkMAC(t, l.Node, "uplink0")
	for _, fam := range []int{4, 6} {
		aIP := l.aIP[fam]
		var fromX, fromRemote [][]byte
		for i := 0; i < 3000; i++ {
			fromX = append(fromX, udpFrame(xMAC, xGW, xIP[fam], 20000+i, aIP, 9000+i%50, []byte("x-flood")))
		}
		for i := 0; i < 1000; i++ {
			fromX = append(fromX, tcpFrame(xMAC, xGW, xIP[fam], 30000+i, aIP, 9100+i%50, uint32(i), 0, tcpSYN, 512))
		}
		for i := 0; i < 2000; i++ {
			fromRemote = append(fromRemote, udpFrame(remMAC, upMAC, remoteIP[fam], 20000+i, aIP, 8080, []byte("remote-flood")))
		}
		sendFrames(t, x, "eth0", fromX)
		before := drops()
		sendFrames(t, l.remote, "eth0", fromRemote)
		time.Sleep(500 * time.Millisecond)
		if d := drops() - before; d != uint64(len(fromRemote)) {
			t.Errorf("IPv%d: the remote host's %d denied datagrams moved a's drop_policy ingress counter by %d", fam, len(fromRemote), d)
		}
		all, err := l.m.Policy().ListFlows()
		must(t, err)
		var mine, opened int
		for _, f := range all {
			if f.Ifindex == l.idx {
				mine++
				if f.Egress {
					opened++
				}
			}
		}
		t.Logf("IPv%d: after the floods a's flow tables hold %d flows, %d of them opened by a", fam, mine, opened)
		if mine > 2*128 {
			t.Errorf("IPv%d: a's flow tables hold %d flows, more than 2 x 128", fam, mine)
		}
		f := flows[fam]
		f.tcpExchange(t, fmt.Sprintf("after-flood-v%d", fam))
		blocked(t, l.remote, "udp", aIP, 8080)
		blocked(t, l.remote, "tcp", aIP, 8080)
		reach(t, x, "udp", aIP, 8080, "a")
		reach(t, x, "tcp", aIP, 8080, "a")
	}

	out, err := l.AgentCmd("dump", "policy", "-o", "json", "--pin-dir", l.PinDir, "--state-dir", l.StateDir)
	if err != nil {
		t.Fatalf("dump policy: %v\n%s", err, out)
	}
	var rows []inspect.PolicyRow
	must(t, json.Unmarshal([]byte(out), &rows))
	found := false
	for _, r := range rows {
		if r.Ifindex == uint32(l.idx) {
			found = true
			if r.Dropped["ingress"] < 4000 {
				t.Errorf("dump policy: a's ingress drops %d, want at least the 4000 flooded: %+v", r.Dropped["ingress"], r)
			}
		}
	}
	if !found {
		t.Errorf("dump policy: no row for a\n%s", out)
	}
}
