package main

// The ebpf-cni configurations of the latency, scale and burst parts run
// with `ebpf-agent run` on their node, as a node would have it (-agent=false
// measures them without). With the agent running, ADD attaches cls_bpf
// filters that the agent moves to tcx links afterwards, and DEL hands the
// veth off for the agent to delete; that background work waits while any
// verb runs. Before each timed verb the bench waits for the background work
// of the previous one to end, so it lands in no verb's time (ptp's
// included), and records how long it took: the "background" rows, work the
// node still does, off the verbs' path.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// startAgent runs `ebpf-agent run` for a pin directory in a node netns and
// waits until it reports the datapath ready; it returns how long that took.
// The agent is killed at cleanup (b.procs) or by the caller.
func (b *bench) startAgent(ctx context.Context, node ns.NetNS, pinDir, confDir string, hostPorts bool, extra ...string) (*testenv.Proc, time.Duration, error) {
	t := time.Now()
	args := append([]string{"run", "--metrics-addr", "", fmt.Sprintf("--hostports=%v", hostPorts),
		"--pin-dir", pinDir, "--state-dir", b.stateFor(pinDir), "--cni-conf-dir", confDir, "--cni-bin-dir", b.binDir}, extra...)
	p, err := b.procs.Start(ctx, node, filepath.Join(b.binDir, "ebpf-agent"), args...)
	if err != nil {
		return nil, 0, err
	}
	for !strings.Contains(p.Stderr.String(), "datapath ready") {
		select {
		case <-p.Done():
			return nil, 0, fmt.Errorf("ebpf-agent exited: %v\n%s", p.Err(), testenv.Tail(p.Stderr.String()))
		case <-time.After(time.Millisecond):
		}
		if time.Since(t) > 30*time.Second {
			p.Kill()
			return nil, 0, fmt.Errorf("ebpf-agent not ready after 30 s:\n%s", testenv.Tail(p.Stderr.String()))
		}
	}
	b.agents[pinDir] = p
	return p, time.Since(t), nil
}

// hasAgent tells whether an agent runs for a configuration's pin directory.
func (b *bench) hasAgent(c *config) bool {
	return c.isEBPF() && b.agents[b.pinOf(c)] != nil
}

// settleTimeout bounds the wait for the agent's background work.
const settleTimeout = 60 * time.Second

// bgWork is what the agent is to do after verbs of the bench: move the
// host veths of new pods to tcx, delete the veths DEL handed off.
type bgWork struct {
	hostIfs   []string // host veths of pods just added
	handedOff []int    // ifindexes of the host veths of pods just deleted
}

// wantsTCX tells whether the agent moves a configuration's pods to tcx
// (not in attachMode tc).
func (c *config) wantsTCX() bool {
	for _, p := range c.list["plugins"].([]any) {
		if m := p.(map[string]any); m["type"] == "ebpf-cni" {
			return m["attachMode"] != "tc"
		}
	}
	return false
}

// settle waits until the agent of c's node has done w, and returns how
// long that took from the end of the last verb (an upper bound: it is seen
// by polling); 0 at once without an agent. It looks at w's links and pins
// only, so the wait costs the same with 1000 pods present as with one.
func (b *bench) settle(c *config, w bgWork) (time.Duration, error) {
	if !b.hasAgent(c) || (len(w.hostIfs) == 0 && len(w.handedOff) == 0) {
		return 0, nil
	}
	b.podMu.Lock()
	verbEnd := b.verbEnd
	b.podMu.Unlock()
	pinDir := b.pinOf(c)
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	todo := func() (left []string) {
		b.nodeOf(c).Do(func(ns.NetNS) error {
			for _, h := range w.hostIfs {
				if c.wantsTCX() && (!exists(datapath.LinkPinPath(pinDir, h, datapath.DirIngress)) || !exists(datapath.LinkPinPath(pinDir, h, datapath.DirEgress))) {
					left = append(left, h+" not on tcx")
				}
			}
			for _, idx := range w.handedOff {
				g := state.HandedOffName(idx)
				if _, err := netlink.LinkByName(g); err == nil || exists(datapath.LinkPinPath(pinDir, g, datapath.DirIngress)) {
					left = append(left, g+" not deleted")
				}
			}
			return nil
		})
		return left
	}
	for start := time.Now(); ; time.Sleep(2 * time.Millisecond) {
		left := todo()
		if len(left) == 0 {
			break
		}
		if time.Since(start) > settleTimeout {
			return 0, fmt.Errorf("the agent of %s has not done its background work after %s: %s; attachments: %s\n%s", pinDir, settleTimeout,
				strings.Join(left, ", "), b.attachStates(c, w.hostIfs), testenv.Tail(b.agents[pinDir].Stderr.String()))
		}
	}
	took := time.Since(verbEnd)
	// The move ends with the filters' deletion, after the pins: check it.
	var errs []string
	b.nodeOf(c).Do(func(ns.NetNS) error {
		for _, h := range w.hostIfs {
			l, err := netlink.LinkByName(h)
			if err != nil {
				continue // deleted meanwhile
			}
			for start := time.Now(); ; time.Sleep(time.Millisecond) {
				st := datapath.AttachmentOf(pinDir, l.Attrs().Index, h)
				if want := map[bool]string{true: datapath.StateTCX, false: datapath.StateTC}[c.wantsTCX()]; st == want {
					break
				} else if time.Since(start) > 5*time.Second {
					errs = append(errs, fmt.Sprintf("%s is %q, want %q", h, st, want))
					break
				}
			}
		}
		return nil
	})
	if len(errs) > 0 {
		return 0, fmt.Errorf("after the agent's background work: %s", strings.Join(errs, "; "))
	}
	return took, nil
}

// attachStates names each host veth's attachment (datapath.AttachmentOf),
// for a settle that timed out: a pod the agent missed ("tc, tcx pending")
// is told from one its ADD put on plain tc ("tc", which the agent leaves
// there) and from a veth gone ("none"). Only then: each look is two
// filter dumps, which settle's polling would add to the agent's work.
func (b *bench) attachStates(c *config, hostIfs []string) string {
	var out []string
	b.nodeOf(c).Do(func(ns.NetNS) error {
		for _, h := range hostIfs {
			st := datapath.StateNone
			if l, err := netlink.LinkByName(h); err == nil {
				st = datapath.AttachmentOf(b.pinOf(c), l.Attrs().Index, h)
			}
			out = append(out, fmt.Sprintf("%s %q", h, st))
		}
		return nil
	})
	return strings.Join(out, ", ")
}

// settleAll waits until no handed-off veth of c's node is left (a part's
// end, before its leftovers are checked).
func (b *bench) settleAll(c *config) error {
	if !b.hasAgent(c) {
		return nil
	}
	pinDir := b.pinOf(c)
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		var hs []endpoint.HandedOff
		err := b.nodeOf(c).Do(func(ns.NetNS) error {
			var err error
			hs, err = endpoint.ListHandedOff(pinDir)
			return err
		})
		if err != nil {
			return err
		}
		if len(hs) == 0 {
			return nil
		}
		if time.Since(start) > settleTimeout {
			return fmt.Errorf("the agent of %s left %d handed-off veths after %s:\n%s", pinDir, len(hs), settleTimeout, testenv.Tail(b.agents[pinDir].Stderr.String()))
		}
	}
}
