package agent

import (
	"context"
	"errors"
	"log"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// background is the kernel work the verbs leave to the agent while it runs
// (it holds the agent lock, datapath.HoldAgent): deleting the veths DEL
// handed off, and moving pods whose ADD attached cls_bpf to pinned tcx
// links. Each step waits out RCU grace periods under RTNL, so each starts
// only when no CNI verb runs (datapath.Idle), one at a time. A pass finds
// its work in the kernel alone (handed-off names and pins, filters waiting
// for tcx), so whatever an agent killed part way left, the next one
// finishes.
type background struct {
	pinRoot string
	lg      *log.Logger
	idle    *datapath.Idle
	kick    chan struct{}
	every   time.Duration // a pass even without a kick
}

// newBackground readies the worker; its link events are subscribed before
// it returns, so no ADD or DEL after the agent reports ready goes unseen.
func newBackground(ctx context.Context, pinRoot string, lg *log.Logger) (*background, error) {
	idle, err := datapath.OpenIdle(pinRoot)
	if err != nil {
		return nil, err
	}
	b := &background{pinRoot: pinRoot, lg: lg, idle: idle, kick: make(chan struct{}, 1), every: 10 * time.Second}
	updates := make(chan netlink.LinkUpdate, 256)
	if err := netlink.LinkSubscribeWithOptions(updates, ctx.Done(), netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { lg.Printf("background: link events: %v", err) },
	}); err != nil {
		lg.Printf("background: no link events (%v); a pass every %s only", err, b.every)
		return b, nil
	}
	go func() {
		for u := range updates {
			b.linkEvent(u.Attrs().Name)
		}
	}()
	return b, nil
}

// wake asks for a pass soon; never blocks.
func (b *background) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// linkEvent wakes a pass for the links that can carry work: a new host
// veth (cls_bpf waiting for tcx), a handed-off one, or a handed-off one
// gone with its pod's netns (its pins).
func (b *background) linkEvent(name string) {
	if strings.HasPrefix(name, state.HostIfPrefix) || strings.HasPrefix(name, state.HandedOffPrefix) {
		b.wake()
	}
}

// run does passes until ctx ends.
func (b *background) run(ctx context.Context) {
	defer b.idle.Close()
	tick := time.NewTicker(b.every)
	defer tick.Stop()
	for {
		if err := b.pass(ctx); err != nil && ctx.Err() == nil {
			b.lg.Printf("background: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-b.kick:
		case <-tick.C:
		}
	}
}

// before is called ahead of each step: it waits until no verb runs.
func (b *background) before(ctx context.Context, step string) error {
	if err := b.idle.Wait(ctx); err != nil {
		return err
	}
	endpoint.Crashpoint("agent-" + step)
	return nil
}

// pass reaps every handed-off veth first (they hold names and ifindexes
// nobody uses), then moves every pod waiting for tcx.
func (b *background) pass(ctx context.Context) error {
	// Even the look-around dumps take RTNL: wait for a quiet moment.
	if err := b.idle.Wait(ctx); err != nil {
		return err
	}
	start := time.Now()
	reaped, errs := endpoint.ReapAll(ctx, b.pinRoot, func(ctx context.Context) error { return b.before(ctx, "reap") })
	moved := 0
	vs, err := datapath.TCVeths()
	errs = errors.Join(errs, err)
	for _, v := range vs {
		if !v.Pending() || !strings.HasPrefix(v.Name, state.HostIfPrefix) {
			continue // tc by configuration, or handed off (reaped next pass)
		}
		if err := datapath.Migrate(ctx, b.pinRoot, v, b.before); err != nil {
			errs = errors.Join(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		moved++
	}
	if reaped > 0 || moved > 0 {
		b.lg.Printf("background: deleted %d handed-off veths, moved %d pods to tcx in %s", reaped, moved, time.Since(start).Round(time.Millisecond))
	}
	return errs
}
