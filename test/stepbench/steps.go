package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// A scenario is one pod's life through one way of doing ADD and DEL; it
// records each step under its own name.
type scenario struct {
	name string
	run  func(e *env, s *samples, k int) error
}

var scenarios = []scenario{
	{"today (born, tcx)", (*env).today},
	{"today, attaches one by one; detach before delete", (*env).todaySeq},
	{"attachMode tc", (*env).tc},
	{"no programs (ptp's kernel work)", (*env).plain},
	{"pool, one RTM_SETLINK per end", (*env).pool},
	{"pool, one call per change", (*env).poolSeparate},
	{"pool, DEL returns the pair", (*env).poolReturn},
	{"netns destruction", (*env).netnsDestroy},
	{"tc first, migrated to tcx later", (*env).tcFirst},
}

func (e *env) runSteps(ctx context.Context, n int) error {
	load := testenv.Loadavg()
	s := newSamples()
	// Warm-up: one of each, not recorded.
	for i, sc := range scenarios {
		if err := sc.run(e, newSamples(), 60000+i); err != nil {
			return fmt.Errorf("warm-up %s: %w", sc.name, err)
		}
	}
	k := 0
	for r := 0; r < n; r++ {
		for j := range scenarios {
			if err := ctx.Err(); err != nil {
				return err
			}
			sc := scenarios[(r+j)%len(scenarios)]
			k++
			if err := sc.run(e, s, k); err != nil {
				return fmt.Errorf("round %d, %s: %w", r, sc.name, err)
			}
		}
		if (r+1)%5 == 0 {
			logf("steps: round %d/%d", r+1, n)
		}
	}
	s.print(fmt.Sprintf("Steps: %d interleaved rounds", n), load)
	return nil
}

// today: the veth born with its peer in the pod, two tcx attaches in
// parallel, host and pod configuration, DEL deleting the veth.
func (e *env) today(s *samples, k int) error {
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	host := e.name("sbh")
	var idx int
	err = e.node.Do(func(ns.NetNS) error {
		if err := s.timed("veth create, peer born in the pod", func() (err error) {
			idx, err = vethBorn(host, "eth0", pod)
			return err
		}); err != nil {
			return err
		}
		return s.timed("tcx attach x2 in parallel, pinned (today)", func() error { return e.attachBoth(idx, host) })
	})
	if err != nil {
		return err
	}
	if err := e.configureBoth(s, pod, idx, k, "ebpf-cni:bench/x/eth0"); err != nil {
		return err
	}
	return e.node.Do(func(ns.NetNS) error {
		if err := s.timed("veth delete, 2 tcx links (today's DEL)", func() error { return deleteLink(idx) }); err != nil {
			return err
		}
		return s.timed("unpin 2 defunct links", func() error { return unpin(e.pinDir, host) })
	})
}

// attachBoth attaches both hooks concurrently, as datapath.Attach does.
func (e *env) attachBoth(idx int, host string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(tcxHooks))
	for i, a := range tcxHooks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.node.Do(func(ns.NetNS) error { return attachTCX(e.prog, idx, a, pinPath(e.pinDir, host, a)) })
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// configureBoth is the host and pod configuration every scenario shares.
func (e *env) configureBoth(s *samples, pod ns.NetNS, idx, k int, alias string) error {
	ip := podAddr(k)
	podMAC, err := peerMAC(pod, "eth0")
	if err != nil {
		return err
	}
	var hostMAC []byte
	err = e.node.Do(func(ns.NetNS) error {
		if hostMAC, err = linkMAC(idx); err != nil {
			return err
		}
		return s.timed("host config (alias, up, neighbour, /32 route)", func() error { return configureHost(idx, ip, podMAC, alias) })
	})
	if err != nil {
		return err
	}
	return s.timed("pod config (address, up, neighbour, 2 routes, rule)", func() error { return configurePod(pod, "eth0", ip, hostMAC) })
}

// todaySeq: each attach on its own, and the links detached (unpinned) while
// the veth is alive before a delete that then finds no programs.
func (e *env) todaySeq(s *samples, k int) error {
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	host := e.name("sbs")
	return e.node.Do(func(ns.NetNS) error {
		idx, err := vethBorn(host, "eth0", pod)
		if err != nil {
			return err
		}
		for _, a := range tcxHooks {
			if err := s.timed("tcx attach "+hookName(a)+" alone, pinned", func() error {
				return attachTCX(e.prog, idx, a, pinPath(e.pinDir, host, a))
			}); err != nil {
				return err
			}
		}
		if err := s.timed("detach: unpin 2 live links (veth alive)", func() error { return unpin(e.pinDir, host) }); err != nil {
			return err
		}
		return s.timed("veth delete, no programs (after detach)", func() error { return deleteLink(idx) })
	})
}

func (e *env) tc(s *samples, k int) error {
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	host := e.name("sbt")
	return e.node.Do(func(ns.NetNS) error {
		idx, err := vethBorn(host, "eth0", pod)
		if err != nil {
			return err
		}
		if err := s.timed("clsact + 2 cls_bpf filters (attachMode tc)", func() error { return attachTC(e.prog, idx) }); err != nil {
			return err
		}
		return s.timed("veth delete, tc filters", func() error { return deleteLink(idx) })
	})
}

func (e *env) plain(s *samples, k int) error {
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	host := e.name("sbp")
	var idx int
	err = e.node.Do(func(ns.NetNS) error {
		return s.timed("veth create, peer born in the pod (no programs)", func() (err error) {
			idx, err = vethBorn(host, "eth0", pod)
			return err
		})
	})
	if err != nil {
		return err
	}
	if err := e.configureBoth(s, pod, idx, k, ""); err != nil {
		return err
	}
	return e.node.Do(func(ns.NetNS) error {
		return s.timed("veth delete, no programs", func() error { return deleteLink(idx) })
	})
}

// poolPair is a pair prepared ahead: both ends in the node, down, the host
// end carrying both tcx links, pinned under the pool names.
type poolPair struct {
	host, peer       string
	hostIdx, peerIdx int
}

func (e *env) preparePair(s *samples) (*poolPair, error) {
	p := &poolPair{host: e.name("sbph"), peer: e.name("sbpp")}
	err := e.node.Do(func(ns.NetNS) error {
		if err := s.timed("pool prep: veth create, both ends in the node", func() (err error) {
			p.hostIdx, p.peerIdx, err = vethNode(p.host, p.peer)
			return err
		}); err != nil {
			return err
		}
		return s.timed("pool prep: tcx attach x2 one by one, pinned", func() error {
			for _, a := range tcxHooks {
				if err := attachTCX(e.prog, p.hostIdx, a, pinPath(e.pinDir, p.host, a)); err != nil {
					return err
				}
			}
			return nil
		})
	})
	return p, err
}

// take gives a prepared pair to a pod: the host end gets its final name,
// MAC, MTU and alias in one message; the peer its MAC and MTU, the move into
// the pod and its final name in another; the pins their final names.
func (e *env) take(s *samples, p *poolPair, pod ns.NetNS, final string) error {
	return e.node.Do(func(ns.NetNS) error {
		if err := s.timed("take: host end rename+MAC+MTU+alias (1 RTM_SETLINK)", func() error {
			return setLink{index: p.hostIdx, nsFd: -1, name: final, mac: randomMAC(), mtu: 1480, alias: "ebpf-cni:bench/x/eth0"}.do()
		}); err != nil {
			return err
		}
		if err := s.timed("take: peer MAC+MTU+move into pod+rename (1 RTM_SETLINK)", func() error {
			return setLink{index: p.peerIdx, nsFd: int(pod.Fd()), name: "eth0", mac: randomMAC(), mtu: 1480}.do()
		}); err != nil {
			return err
		}
		return s.timed("take: rename 2 link pins (rename(2) on bpffs)", func() error {
			for _, a := range tcxHooks {
				if err := os.Rename(pinPath(e.pinDir, p.host, a), pinPath(e.pinDir, final, a)); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

func (e *env) pool(s *samples, k int) error {
	p, err := e.preparePair(s)
	if err != nil {
		return err
	}
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	final := e.name("sbf")
	if err := e.take(s, p, pod, final); err != nil {
		return err
	}
	if err := e.configureBoth(s, pod, p.hostIdx, k, ""); err != nil {
		return err
	}
	return e.node.Do(func(ns.NetNS) error {
		if err := s.timed("DEL hand-off: rename host end + down (1 RTM_SETLINK)", func() error {
			return setLink{index: p.hostIdx, nsFd: -1, name: e.name("sbx"), up: &upFalse}.do()
		}); err != nil {
			return err
		}
		if err := s.timed("background: veth delete, 2 tcx links", func() error { return deleteLink(p.hostIdx) }); err != nil {
			return err
		}
		return unpin(e.pinDir, final)
	})
}

// poolSeparate is the take done with one netlink call per change, as the
// vishvananda helpers do it, to show what batching them saves.
func (e *env) poolSeparate(s *samples, k int) error {
	p, err := e.preparePair(newSamples())
	if err != nil {
		return err
	}
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	final := e.name("sbf")
	err = e.node.Do(func(ns.NetNS) error {
		h, err := netlink.LinkByIndex(p.hostIdx)
		if err != nil {
			return err
		}
		pl, err := netlink.LinkByIndex(p.peerIdx)
		if err != nil {
			return err
		}
		steps := []struct {
			name string
			f    func() error
		}{
			{"take, separate: rename host end", func() error { return netlink.LinkSetName(h, final) }},
			{"take, separate: host MAC", func() error { return netlink.LinkSetHardwareAddr(h, randomMAC()) }},
			{"take, separate: host MTU", func() error { return netlink.LinkSetMTU(h, 1480) }},
			{"take, separate: peer MAC", func() error { return netlink.LinkSetHardwareAddr(pl, randomMAC()) }},
			{"take, separate: peer MTU", func() error { return netlink.LinkSetMTU(pl, 1480) }},
			{"move peer into the pod (LinkSetNsFd)", func() error { return netlink.LinkSetNsFd(pl, int(pod.Fd())) }},
			{"take, separate: rename peer inside the pod", func() error {
				return pod.Do(func(ns.NetNS) error {
					l, err := netlink.LinkByName(p.peer)
					if err != nil {
						return err
					}
					return netlink.LinkSetName(l, "eth0")
				})
			}},
		}
		for _, st := range steps {
			if err := s.timed(st.name, st.f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return e.node.Do(func(ns.NetNS) error {
		err := deleteLink(p.hostIdx)
		return errors.Join(err, unpin(e.pinDir, p.host))
	})
}

// poolReturn: DEL moves the peer back to the node and renames both ends to
// pool names instead of deleting the pair.
func (e *env) poolReturn(s *samples, k int) error {
	p, err := e.preparePair(newSamples())
	if err != nil {
		return err
	}
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	final := e.name("sbf")
	if err := e.take(newSamples(), p, pod, final); err != nil {
		return err
	}
	if err := e.configureBoth(newSamples(), pod, p.hostIdx, k, ""); err != nil {
		return err
	}
	err = s.timed("return: peer out of the pod, renamed (1 RTM_SETLINK in the pod)", func() error {
		return pod.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return setLink{index: l.Attrs().Index, nsFd: int(e.node.Fd()), name: e.name("sbpp"), up: &upFalse}.do()
		})
	})
	if err != nil {
		return err
	}
	return e.node.Do(func(ns.NetNS) error {
		if err := s.timed("return: host end rename + down (1 RTM_SETLINK)", func() error {
			return setLink{index: p.hostIdx, nsFd: -1, name: e.name("sbph"), up: &upFalse}.do()
		}); err != nil {
			return err
		}
		err := deleteLink(p.hostIdx)
		return errors.Join(err, unpin(e.pinDir, final))
	})
}

// netnsDestroy: the runtime drops the pod's netns; the kernel dismantles its
// devices (and so the pair) in a worker. The caller pays the unmount; the
// veth goes some time later.
func (e *env) netnsDestroy(s *samples, k int) error {
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	host := e.name("sbn")
	var idx int
	err = e.node.Do(func(ns.NetNS) error {
		if idx, err = vethBorn(host, "eth0", pod); err != nil {
			return err
		}
		return e.attachBoth(idx, host)
	})
	if err != nil {
		e.removePod(pod)
		return err
	}
	t := time.Now()
	if err := e.removePod(pod); err != nil {
		return err
	}
	s.add("netns destruction: caller (close + unmount)", time.Since(t))
	err = e.node.Do(func(ns.NetNS) error {
		for time.Since(t) < 10*time.Second {
			if _, err := netlink.LinkByIndex(idx); err != nil {
				s.add("netns destruction: until the host veth is gone (async)", time.Since(t))
				return nil
			}
			time.Sleep(200 * time.Microsecond)
		}
		return errf("host veth %s still there 10 s after its pod's netns went", host)
	})
	return errors.Join(err, unpin(e.pinDir, host))
}

// tcFirst: ADD attaches cls_bpf (no grace period); later, off the ADD path,
// the same programs are attached as tcx links and the clsact qdisc removed.
// DEL hands the veth off (rename + down) and it is deleted in the background.
func (e *env) tcFirst(s *samples, k int) error {
	pod, err := e.newPod()
	if err != nil {
		return err
	}
	defer e.removePod(pod)
	host := e.name("sbm")
	var idx int
	err = e.node.Do(func(ns.NetNS) error {
		if idx, err = vethBorn(host, "eth0", pod); err != nil {
			return err
		}
		return s.timed("tc first: clsact + 2 cls_bpf filters", func() error { return attachTC(e.prog, idx) })
	})
	if err != nil {
		return err
	}
	if err := e.configureBoth(newSamples(), pod, idx, k, ""); err != nil {
		return err
	}
	return e.node.Do(func(ns.NetNS) error {
		if err := s.timed("migrate: tcx attach x2 one by one, clsact present", func() error {
			for _, a := range tcxHooks {
				if err := attachTCX(e.prog, idx, a, pinPath(e.pinDir, host, a)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := s.timed("migrate: delete the clsact qdisc", func() error { return deleteClsact(idx) }); err != nil {
			return err
		}
		if err := s.timed("DEL hand-off: rename host end + down (1 RTM_SETLINK)", func() error {
			return setLink{index: idx, nsFd: -1, name: e.name("sbx"), up: &upFalse}.do()
		}); err != nil {
			return err
		}
		if err := s.timed("background: veth delete, 2 tcx links", func() error { return deleteLink(idx) }); err != nil {
			return err
		}
		return unpin(e.pinDir, host)
	})
}
