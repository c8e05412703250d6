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
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// startAgent runs `ebpf-agent run` for a pin directory in a node netns and
// waits until it reports the datapath ready; it returns how long that took.
// The agent is killed at cleanup (b.procs) or by the caller.
func (b *bench) startAgent(ctx context.Context, node ns.NetNS, pinDir, confDir string, hostPorts bool) (*testenv.Proc, time.Duration, error) {
	t := time.Now()
	p, err := b.procs.Start(ctx, node, filepath.Join(b.binDir, "ebpf-agent"), "run", "--metrics-addr", "", fmt.Sprintf("--hostports=%v", hostPorts),
		"--pin-dir", pinDir, "--state-dir", b.state, "--cni-conf-dir", confDir, "--cni-bin-dir", b.binDir)
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

// settle waits until the agent of c's node has no background work left (no
// pod waiting for tcx, no handed-off veth) and returns how long that took
// from the end of the last verb; 0 at once without an agent.
func (b *bench) settle(c *config) (time.Duration, error) {
	if !b.hasAgent(c) {
		return 0, nil
	}
	start := time.Now()
	b.podMu.Lock()
	verbEnd := b.verbEnd
	b.podMu.Unlock()
	pinDir := b.pinOf(c)
	for {
		var busy int
		err := b.nodeOf(c).Do(func(ns.NetNS) error {
			vs, err := datapath.TCVeths()
			if err != nil {
				return err
			}
			for _, v := range vs {
				if v.Pending() && strings.HasPrefix(v.Name, state.HostIfPrefix) {
					busy++
				}
			}
			hs, err := endpoint.ListHandedOff(pinDir)
			busy += len(hs)
			return err
		})
		if err != nil {
			return 0, err
		}
		if busy == 0 {
			return time.Since(verbEnd), nil
		}
		if time.Since(start) > settleTimeout {
			p := b.agents[pinDir]
			return 0, fmt.Errorf("the agent of %s still has %d pods to move or veths to delete after %s:\n%s", pinDir, busy, settleTimeout, testenv.Tail(p.Stderr.String()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
