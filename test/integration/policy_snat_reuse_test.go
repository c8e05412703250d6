package integration

import (
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestPolicyMasqueradedFlowNotInherited: b lets in UDP from pod p1 only; p1
// asks b through the web Service, which kube-proxy masquerades, so b's flow
// entry is keyed by the node address and port the SNAT chose, not p1's
// address: DEL's scrub of p1's addresses from other pods' flows cannot find
// it. p1 is deleted and its address goes to a new pod q, which b's policy
// does not name. q asking from p1's port matches p1's conntrack entry, gets
// the same SNAT, and must not ride p1's flow into b.
func TestPolicyMasqueradedFlowNotInherited(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	masqueradeAll(t, p, "WEB")
	p1 := p.NewPod()
	p.CleanupDel(p1, "p1")
	ip1, _ := resultIPs(p.Add(p1, "p1"))
	_, idx1 := p.HostVeth("p1")
	if err := p.w.Apply(uint32(idx1), policy.Endpoint{}); err != nil {
		t.Fatal(err)
	}
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allowPorts(host(ip1), policy.ProtoUDP, 8080, 8080))})
	ask := func(pod ns.NetNS, msg string) (string, bool) {
		var got string
		must(t, pod.Do(func(ns.NetNS) error {
			c, err := net.DialUDP("udp", &net.UDPAddr{IP: ip1, Port: 5555}, &net.UDPAddr{IP: svcWeb[4], Port: 80})
			if err != nil {
				return err
			}
			defer c.Close()
			buf := make([]byte, 512)
			for try := 0; try < 3 && got == ""; try++ {
				if _, err := c.Write([]byte(msg)); err != nil {
					return err
				}
				c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				if n, err := c.Read(buf); err == nil {
					got = string(buf[:n])
				}
			}
			return nil
		}))
		return got, got != ""
	}
	if got, ok := ask(p1, "from-p1"); !ok {
		t.Fatal("p1's datagram through the masqueraded Service, allowed, was not answered by b")
	} else {
		t.Logf("b answered p1: %q", got)
	}
	must(t, p.Del(p1, "p1", "eth0"))
	// The agent follows: p1 is gone, b's rule with it.
	p.apply(t, "b", policy.Endpoint{Ingress: isolated()})
	// q gets p1's address (a one-address range), and is programmed open.
	p.IPAM = map[string]any{"type": "host-local", "dataDir": t.TempDir(),
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4, "rangeStart": ip1.String(), "rangeEnd": ip1.String()}}}}
	q := p.NewPod()
	p.CleanupDel(q, "q")
	if got, _ := resultIPs(p.Add(q, "q")); !got.Equal(ip1) {
		t.Fatalf("q got %s, want p1's %s", got, ip1)
	}
	_, qidx := p.HostVeth("q")
	if err := p.w.Apply(uint32(qidx), policy.Endpoint{}); err != nil {
		t.Fatal(err)
	}
	if got, ok := ask(q, "from-q"); ok {
		t.Errorf("q, with dead p1's address, reached b through p1's masqueraded flow (answered %q): b's policy allows nobody", got)
	}
}
