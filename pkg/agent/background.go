package agent

import (
	"context"
	"errors"
	"log"
	"strings"
	"sync"
	"syscall"
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
// only when no CNI verb runs (datapath.Idle), one at a time.
//
// Its work is found in the kernel alone (handed-off names and pins,
// filters waiting for tcx), so whatever an agent killed part way left, the
// next one finishes. Link events point a pass at the links that changed; a
// full pass over every link runs at start, when events were lost, and
// every fullEvery, and skips the veths it already knows to be done, so a
// node of 1000 pods costs a pass no more than one of 10.
type background struct {
	pinRoot   string
	stateDir  string // the records: a host veth's link pins are under its record's name
	lg        *log.Logger
	idle      *datapath.Idle
	kick      chan struct{}
	fullEvery time.Duration

	mu      sync.Mutex
	full    bool           // the next pass looks at every link
	fresh   map[int]string // host veths new or changed since the last pass
	gone    map[int]string // handed-off veths (renamed to, or deleted as, state.HandedOffName)
	settled map[int]string // host veths seen with nothing left to do (full passes skip them)
	refused map[int]string // host veths whose move to tcx failed, with the reason logged (once per veth and reason)
}

// newBackground readies the worker on the agent's link events (w
// subscribed before the agent reports ready, so no ADD or DEL after that
// goes unseen).
func newBackground(pinRoot, stateDir string, politeWait time.Duration, lg *log.Logger, w *linkWatcher) (*background, error) {
	idle, err := datapath.OpenIdle(pinRoot, politeWait)
	if err != nil {
		return nil, err
	}
	b := &background{pinRoot: pinRoot, stateDir: stateDir, lg: lg, idle: idle, kick: make(chan struct{}, 1), fullEvery: time.Minute,
		full: true, fresh: map[int]string{}, gone: map[int]string{}, settled: map[int]string{}, refused: map[int]string{}}
	w.handle(linkHandler{update: b.linkEvent, lost: func() {
		// Events were lost: look at everything.
		b.mu.Lock()
		b.full = true
		b.mu.Unlock()
		b.wake()
	}})
	return b, nil
}

// wake asks for a pass soon; never blocks.
func (b *background) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// linkEvent notes a link that may carry work: a new or changed host veth
// (cls_bpf waiting for tcx), a veth handed off (renamed) or gone with its
// pod's netns while handed off (its pins). A host veth is known by its
// record, not its name (an operator may rename it to anything): any veth
// is noted, and the pass asks the records about those not named ebpf….
func (b *background) linkEvent(u netlink.LinkUpdate) {
	name, idx := u.Attrs().Name, u.Attrs().Index
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case strings.HasPrefix(name, state.HandedOffPrefix):
		delete(b.settled, idx)
		delete(b.fresh, idx)
		delete(b.refused, idx)
		b.gone[idx] = name
	case u.Header.Type == syscall.RTM_DELLINK:
		delete(b.settled, idx)
		delete(b.fresh, idx)
		delete(b.refused, idx)
		return
	case strings.HasPrefix(name, state.HostIfPrefix) || u.Link != nil && u.Link.Type() == "veth":
		if b.settled[idx] == name {
			return // attributes changing on a veth already done
		}
		b.fresh[idx] = name
	default:
		return
	}
	b.wake()
}

// Run does passes until ctx ends.
func (b *background) Run(ctx context.Context) error {
	defer b.idle.Close()
	tick := time.NewTicker(b.fullEvery)
	defer tick.Stop()
	for {
		if err := b.pass(ctx); err != nil && ctx.Err() == nil {
			b.lg.Printf("background: %v", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-b.kick:
		case <-tick.C:
			b.mu.Lock()
			b.full = true
			b.mu.Unlock()
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

// pass reaps the handed-off veths first (they hold names and ifindexes
// nobody uses), then moves the pods waiting for tcx.
func (b *background) pass(ctx context.Context) error {
	b.mu.Lock()
	full, fresh, gone := b.full, b.fresh, b.gone
	b.full, b.fresh, b.gone = false, map[int]string{}, map[int]string{}
	b.mu.Unlock()
	if !full && len(fresh) == 0 && len(gone) == 0 {
		return nil
	}
	// Even the look-around dumps take RTNL: wait for a quiet moment.
	if err := b.idle.Wait(ctx); err != nil {
		return err
	}
	start := time.Now()
	reaped, errs := b.reap(ctx, full, gone)
	moved, refused, err := b.migrate(ctx, full, fresh)
	errs = errors.Join(errs, err)
	if reaped > 0 || moved > 0 {
		b.lg.Printf("background: deleted %d handed-off veths, moved %d pods to tcx in %s", reaped, moved, time.Since(start).Round(time.Millisecond))
	}
	if (errs != nil || refused) && ctx.Err() == nil {
		// Try again at the next full pass rather than at every event.
		b.mu.Lock()
		b.full = true
		b.mu.Unlock()
	}
	return errs
}

// reap deletes the handed-off veths: every one on a full pass, else those
// the events named.
func (b *background) reap(ctx context.Context, full bool, gone map[int]string) (int, error) {
	before := func(ctx context.Context) error { return b.before(ctx, "reap") }
	if full {
		return endpoint.ReapAll(ctx, b.pinRoot, before)
	}
	m, err := datapath.OpenMaps(b.pinRoot)
	if err != nil {
		m = nil // never set up: only links and pins to remove
	} else {
		defer m.Close()
	}
	n := 0
	var errs error
	for idx, name := range gone {
		h := endpoint.HandedOff{Name: name, Ifindex: idx}
		if l, err := netlink.LinkByIndex(idx); err == nil && l.Attrs().Name == name {
			h.Link = l
			if err := before(ctx); err != nil {
				return n, errors.Join(errs, err)
			}
		}
		if err := endpoint.Reap(b.pinRoot, m, h); err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		n++
	}
	return n, errs
}

// migrate moves the pods waiting for tcx: on a full pass every host veth
// with a clsact qdisc not known to be done, else those the events named. A
// host veth is one named ebpf… or any link a record names as its host
// veth (renamed by an operator: hostVeths). A veth whose move fails is
// logged once per reason (noteRefusal) and tried again on the next full
// pass (refused).
func (b *background) migrate(ctx context.Context, full bool, fresh map[int]string) (moved int, refused bool, errs error) {
	hv := &hostVeths{stateDir: b.stateDir}
	if full {
		hs, err := datapath.ClsactHolders()
		if err != nil {
			return 0, false, err
		}
		for _, h := range hs {
			b.mu.Lock()
			done := b.settled[h.Ifindex] == h.Name
			b.mu.Unlock()
			if done {
				continue // skipped before any look: most veths of a node are done
			}
			if _, ok := hv.pinsOf(h.Ifindex, h.Name); ok {
				fresh[h.Ifindex] = h.Name
			}
		}
	}
	m, err := datapath.OpenMaps(b.pinRoot)
	if err != nil {
		m = nil // never set up: no pod of ours to give a table
	} else {
		defer m.Close()
	}
	if full && m != nil {
		// A table an older build's verb put meanwhile (it leaves the
		// flag alone), or the last one gone: the flag follows.
		errs = m.StackFlows().SyncNoParts()
	}
	for idx, name := range fresh {
		pins, ok := hv.pinsOf(idx, name)
		if !ok {
			continue // another plugin's veth, or a pod's: not ours
		}
		// Each look is two filter dumps under RTNL: one veth at a time,
		// in quiet moments only.
		if err := b.idle.Wait(ctx); err != nil {
			return moved, refused, errors.Join(errs, err)
		}
		// A pod of ours (its ADD ended: no verb runs) gets its own
		// stack-flow table, which ADD leaves to the agent: it waits out
		// an RCU grace period, holding no lock (endpoint.CreateVeth).
		if m != nil {
			if _, err := m.Links().Lookup(idx); err == nil {
				errs = errors.Join(errs, m.StackFlows().EnsurePart(idx))
			}
		}
		did, err := b.moveOne(ctx, idx, name, pins)
		switch {
		case err != nil && ctx.Err() != nil:
			return moved, refused, errors.Join(errs, err)
		case err != nil:
			b.noteRefusal(idx, name, err)
			refused = true
		case did:
			moved++
			b.noteMoved(idx, name, pins)
		}
	}
	return moved, refused, errs
}

// moveOne moves host veth name (ifindex idx) to tcx if it waits for it,
// its links pinned under pins, and notes it done for good once it is on
// tcx, or on tc by configuration (a veth caught before its ADD attached
// anything is looked at again).
func (b *background) moveOne(ctx context.Context, idx int, name, pins string) (moved bool, err error) {
	v, ok := datapath.TCVethOf(idx, name)
	v.Pins = pins
	if ok && v.Pending() {
		if err := datapath.Migrate(ctx, b.pinRoot, v, b.before); err != nil {
			return false, err
		}
		moved = true
	}
	st := datapath.AttachmentOf(b.pinRoot, idx, pins)
	b.mu.Lock()
	if _, changed := b.fresh[idx]; !changed && (st == datapath.StateTCX || st == datapath.StateTC) {
		b.settled[idx] = name
	}
	b.mu.Unlock()
	return moved, nil
}

// hostVeths tells which node links are host veths of ours, and the name
// their link pins are under: the record's host veth name, whatever the
// link's name now (an operator may have renamed it), where the verbs and
// status look for them: the move pins there, and the veth is done by what
// is pinned there. A link named ebpf… is judged as before (PinNameOf); any
// other only when a record names it (its ifindex and MAC:
// RecordedHostVeth), the records read once, at the first such link.
type hostVeths struct {
	stateDir string
	index    endpoint.HostVethIndex
}

func (h *hostVeths) pinsOf(idx int, name string) (pins string, ok bool) {
	l, err := netlink.LinkByIndex(idx)
	if strings.HasPrefix(name, state.HostIfPrefix) {
		if err == nil && l.Attrs().Name == name {
			return endpoint.PinNameOf(h.stateDir, l), true
		}
		return name, true
	}
	if err != nil || l.Attrs().Name != name || l.Type() != "veth" {
		return "", false
	}
	if h.index == nil {
		h.index = endpoint.IndexHostVeths(h.stateDir)
	}
	return h.index.PinName(l)
}

// noteRefusal logs why a host veth was not moved to tcx, once per veth and
// reason: it is tried again on every full pass (a minute), and a refusal
// that holds (its pins' name taken by another device's links) would
// otherwise fill the log.
func (b *background) noteRefusal(idx int, name string, err error) {
	b.mu.Lock()
	said := b.refused[idx] == err.Error()
	b.refused[idx] = err.Error()
	b.mu.Unlock()
	if !said {
		b.lg.Printf("background: host veth %s (ifindex %d) stays on cls_bpf: %v (tried again every minute; logged again only if the reason changes)", name, idx, err)
	}
}

// noteMoved logs a move worth an operator's notice: of a veth whose move
// was refused before, or of one not under its record's name.
func (b *background) noteMoved(idx int, name, pins string) {
	b.mu.Lock()
	_, wasRefused := b.refused[idx]
	delete(b.refused, idx)
	b.mu.Unlock()
	switch {
	case wasRefused:
		b.lg.Printf("background: host veth %s (ifindex %d) moved to tcx after all, its links pinned under %s", name, idx, pins)
	case name != pins:
		b.lg.Printf("background: host veth %s (ifindex %d), renamed from %s, moved to tcx, its links pinned under %s", name, idx, pins, pins)
	}
}
