package integration

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelUnderlay6: pod traffic through the tunnel over an IPv6
// underlay (the peers known by their IPv6 addresses only: `encap ip6`),
// node 1 to node 3 across the router, IPv4 and IPv6 pods. The outer UDP
// datagram carries a checksum: a collect_md VXLAN socket refuses IPv6 UDP
// without one (udp6zerocsumrx off, as IPv6 requires), and every datagram
// was dropped as Udp6InCsumErrors before the routes asked for it.
func TestTunnelUnderlay6(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	var peers []agent.Peer
	for i := range lab.nodes {
		p4, p6 := tunPods(i)
		peers = append(peers, agent.Peer{NodeIP: tunNode6[i].String(), PodCIDRs: []string{p4, p6}})
	}
	pf := filepath.Join(t.TempDir(), "peers6.json")
	pj, _ := json.Marshal(peers)
	must(t, os.WriteFile(pf, pj, 0o600))
	for _, e := range []*testenv.Env{n1, n3} {
		testenv.WaitIPv6Ready(t, e.Node)
		if _, err := e.MasqAgent("peers", "--peers", pf, "--cni-conf-dir", t.TempDir(), "--tunnel", "vxlan"); err != nil {
			t.Fatal(err)
		}
		var out []byte
		e.InNode(func() error {
			out, _ = exec.Command("ip", "-d", "route", "show", "proto", "199").CombinedOutput()
			return nil
		})
		if !strings.Contains(string(out), "encap ip6") {
			t.Fatalf("routes into the tunnel are not over IPv6:\n%s", out)
		}
		// The lab's tightest link (1400) less the IPv6 overhead (70).
		e.Extra["mtu"] = tunPMTU - 70
	}
	p1, a1, a16 := servedPod(t, n1, "u1", 7001)
	p3, a3, a36 := servedPod(t, n3, "u3", 7001)
	for _, c := range []struct {
		from       ns.NetNS
		to, src    net.IP
		name, what string
	}{{p1, a3, a1, "u3", "IPv4 pod"}, {p3, a1, a3, "u1", "IPv4 pod"}, {p1, a36, a16, "u3", "IPv6 pod"}, {p3, a16, a36, "u1", "IPv6 pod"}} {
		for _, proto := range []string{"tcp", "udp"} {
			mustAsk(t, c.from, proto, hp(c.to, 7001), 0, c.name, c.src)
		}
		if err := testenv.Ping(c.from, c.to, 2); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
	}
	if err := testenv.TCPTransfer(p3, p1, a1, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := testenv.TCPTransfer(p1, p3, a36, 1<<20); err != nil {
		t.Fatal(err)
	}
}
