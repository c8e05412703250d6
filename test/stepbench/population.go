package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// ---- population: what the pods already on a node cost the next ADD ----
//
// Two kernel costs that grow with the pods present (docs/performance.md,
// "Pod start at 1000 pods"): every netns that has looked a path up under
// /proc/sys/net lengthens the dcache chain every later /proc/sys/net lookup
// walks (ADD wrote the pod's arp_notify through /proc), and every state
// change of an IPv6 link walks the netns' IPv6 routing table, which every
// IPv6 host veth grows. Each case builds a node netns with its population
// of pods (a veth each, both ends up), then times, for a fresh pod, the two
// steps of ADD they touch: bringing the pod's end up (carrier on at the
// host end) and reading ip_forward through /proc on the node.

type popCase struct {
	name      string
	hostNoV6  bool // the host veths' IPv6 switched off before up (ADD today, IPv4-only networks)
	podSysctl bool // each pod writes its arp_notify through /proc (ADD before 89476ec)
}

var popCases = []popCase{
	{"IPv6 host veths, pods never touch /proc/sys/net", false, false},
	{"IPv6-less host veths", true, false},
	{"IPv6 host veths, each pod wrote arp_notify through /proc", false, true},
}

func (e *env) runPopulation(ctx context.Context, pods, rounds int) error {
	for _, c := range popCases {
		for _, size := range []int{0, pods} {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := e.population(ctx, c, size, rounds); err != nil {
				return fmt.Errorf("%s, %d pods: %w", c.name, size, err)
			}
		}
	}
	return nil
}

// population times rounds fresh pods beside size pods of case c, in a node
// netns of its own, removed (with its pods) before it returns.
func (e *env) population(ctx context.Context, c popCase, size, rounds int) (err error) {
	load := testenv.Loadavg()
	node, err := testenv.NewNetNS(filepath.Join(e.root, e.name("popnode")))
	if err != nil {
		return err
	}
	var made []ns.NetNS
	defer func() {
		for _, p := range made {
			if rerr := e.removePod(p); err == nil {
				err = rerr
			}
		}
		if rerr := testenv.RemoveNetNS(node); err == nil {
			err = rerr
		}
	}()
	// The node looks at /proc/sys/net before its pods come (as a node that
	// has run for a while has): the dcache chain puts newer entries first.
	readFwd := func() error {
		return node.Do(func(ns.NetNS) error {
			_, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
			return err
		})
	}
	if err := readFwd(); err != nil {
		return err
	}
	add := func(s *samples) error {
		pod, err := e.newPod()
		if err != nil {
			return err
		}
		made = append(made, pod)
		host := e.name("pop")
		err = node.Do(func(ns.NetNS) error {
			idx, err := vethBorn(host, "eth0", pod)
			if err != nil {
				return err
			}
			if c.hostNoV6 {
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+host+"/disable_ipv6", []byte("1"), 0o644); err != nil {
					return err
				}
			}
			return netlink.LinkSetUp(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: idx}})
		})
		if err != nil {
			return err
		}
		up := func() error {
			return pod.Do(func(ns.NetNS) error {
				if c.podSysctl {
					if err := os.WriteFile("/proc/sys/net/ipv4/conf/eth0/arp_notify", []byte("1"), 0o644); err != nil {
						return err
					}
				}
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				return netlink.LinkSetUp(l)
			})
		}
		if s == nil {
			return up()
		}
		if err := s.timed("pod end up (the host end's carrier on)", up); err != nil {
			return err
		}
		return s.timed("read ip_forward through /proc on the node", readFwd)
	}
	for i := 0; i < size; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := add(nil); err != nil {
			return fmt.Errorf("pod %d of the population: %w", i+1, err)
		}
	}
	// Let the population settle as on a live node: IPv6 duplicate address
	// detection (1 s) ends, and the link-local addresses' routes are in.
	if size > 0 {
		time.Sleep(3 * time.Second)
	}
	s := newSamples()
	for r := 0; r < rounds; r++ {
		if err := add(s); err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
	}
	s.print(fmt.Sprintf("Population: %d pods present, %s", size, c.name), load)
	return nil
}
