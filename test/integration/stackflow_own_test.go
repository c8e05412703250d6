// A pod's own ordinary traffic and its stack-flow table (issue 28 defect
// 4, hostile review): the per-pod table holds 256 records.

package integration

import (
	"bufio"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestStackFlowOwnLookups: pod a holds an idle TCP connection through a
// ClusterIP to b (the server speaks next, as a pub/sub or push server
// does), and meanwhile makes 600 ordinary DNS-like queries through another
// ClusterIP whose backend is b (each from a new ephemeral port: a new
// flow, a new record in a's table), all answered. b's next segment must
// still reach a through conntrack's un-DNAT. Nothing here is an attack:
// a's own unprivileged lookups, a few minutes of a busy client's. Fails on
// nat-hardening 82548ff: the per-pod table (256 records, LRU) evicts the
// idle connection's record, where the node-wide table it replaced (28160
// at the default maxPods) kept it. IPv4 and IPv6.
func TestStackFlowOwnLookups(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	e.Add(a, "a")
	b4, b6 := testenv.PodIPs(t, e.Add(b, "b"))
	for fam, bip := range map[int]net.IP{4: b4, 6: b6} {
		subnet, node := testenv.PodSubnet4, testenv.NodeIP4
		if fam == 6 {
			subnet, node = testenv.PodSubnet6, testenv.NodeIP6
		}
		restore(t, e.Node, "nft", nftRules(fam, subnet, []net.IP{node}, []svcPort{
			{name: "web", proto: "tcp", clusterIP: svcWeb[fam], port: 80, backend: bip, target: 8080},
			{name: "dns", proto: "udp", clusterIP: svcDNS[fam], port: 53, backend: bip, target: 5353},
		}), "-f", "-")
	}
	for _, fam := range []string{"udp4", "udp6"} {
		var pc net.PacketConn
		if err := b.Do(func(ns.NetNS) (err error) { pc, err = net.ListenPacket(fam, ":5353"); return }); err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		go func() {
			buf := make([]byte, 64)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:n], from)
			}
		}()
	}

	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("v%d", fam), func(t *testing.T) {
			var ln net.Listener
			if err := b.Do(func(ns.NetNS) (err error) { ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), ":8080"); return }); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := ln.Accept(); err == nil {
					accepted <- c
				}
			}()
			var cli net.Conn
			if err := a.Do(func(ns.NetNS) (err error) {
				cli, err = net.DialTimeout("tcp", hp(svcWeb[fam], 80), 5*time.Second)
				return
			}); err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			var srv net.Conn
			select {
			case srv = <-accepted:
			case <-time.After(5 * time.Second):
				t.Fatal("b accepted nothing")
			}
			defer srv.Close()

			answered := 0
			err := a.Do(func(ns.NetNS) error {
				buf := make([]byte, 64)
				for i := 0; i < 600; i++ {
					c, err := net.Dial("udp", hp(svcDNS[fam], 53))
					if err != nil {
						return err
					}
					c.SetDeadline(time.Now().Add(time.Second))
					if _, err := c.Write([]byte("q")); err == nil {
						if _, err := c.Read(buf); err == nil {
							answered++
						}
					}
					c.Close()
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if answered < 590 {
				t.Fatalf("only %d of 600 queries through the ClusterIP answered", answered)
			}

			if _, err := srv.Write([]byte("pong\n")); err != nil {
				t.Fatal(err)
			}
			cli.SetReadDeadline(time.Now().Add(3 * time.Second))
			if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
				t.Errorf("a's idle connection through the ClusterIP after %d of a's own lookups: read %q, %v", answered, got, err)
			}
		})
	}
}
