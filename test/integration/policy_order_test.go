package integration

import (
	"bufio"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestPolicyFlowOpenedFromLowerPort (issue 23): the flow lookup tries first
// the table its ports name (the lower port taken for the server's, so the
// other end opened the flow: pol_ct_first in bpf/lib/policy.h). A client
// dialling from a port below the server's makes that guess wrong at both
// ends. Both pods are isolated both ways and only a's flows to b are
// allowed, so every reply passes by its flow entry alone, found in the
// second table tried: TCP and UDP, IPv4 and IPv6, from a port below the
// server's and one above it.
func TestPolicyFlowOpenedFromLowerPort(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	var toB, fromA []policy.Allow
	for _, fam := range []int{4, 6} {
		toB = append(toB, tcpUDP(host(p.ip["b"][fam]), 8080))
		fromA = append(fromA, tcpUDP(host(p.ip["a"][fam]), 8080))
	}
	p.apply(t, "a", policy.Endpoint{Ingress: isolated(), Egress: isolated(toB...)})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(fromA...), Egress: isolated()})
	for _, fam := range []int{4, 6} {
		for _, port := range []int{1000 + fam, 40000 + fam} {
			for _, proto := range []string{"tcp", "udp"} {
				got, err := askFromPort(p.a, proto, port, hp(p.ip["b"][fam], 8080))
				if err != nil || got != "b" {
					t.Errorf("%s from a:%d to b:8080 (IPv%d): answered by %q, %v; want b", proto, port, fam, got, err)
				}
			}
		}
		// The replies had no rule: b may open nothing to a.
		blocked(t, p.b, "tcp", p.ip["a"][fam], 8080)
	}
	// The flows from the lower ports are a's own, in the table of the flows
	// it opened: the one the guess tries second.
	flows, err := p.m.Policy().ListFlows()
	if err != nil {
		t.Fatal(err)
	}
	own := 0
	for _, f := range flows {
		if f.Ifindex == int(p.idx["a"]) && f.Egress && f.Pod.Port() < f.Peer.Port() {
			own++
		}
	}
	if own < 4 {
		t.Errorf("a's table of its own flows holds %d opened from a port below the peer's, want 4 (TCP, UDP, IPv4, IPv6): %+v", own, flows)
	}
}

// askFromPort asks the server at addr over proto from local port port in
// netns and returns the name it answers with.
func askFromPort(netns ns.NetNS, proto string, port int, addr string) (string, error) {
	var name string
	err := netns.Do(func(ns.NetNS) error {
		if proto == "tcp" {
			d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: port}}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return fmt.Errorf("read answer: %w", err)
			}
			a, err := parseAnswer(line)
			name = a.server
			return err
		}
		raddr, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return err
		}
		network := "udp4"
		if raddr.IP.To4() == nil {
			network = "udp6"
		}
		c, err := net.ListenUDP(network, &net.UDPAddr{Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 2048)
		for try := 0; try < 3; try++ {
			if _, err := c.WriteToUDP([]byte("ping"), raddr); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				continue
			}
			a, err := parseAnswer(string(buf[:n]))
			name = a.server
			return err
		}
		return fmt.Errorf("no answer")
	})
	return name, err
}
