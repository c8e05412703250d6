package endpoint

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Deleting a veth waits out RCU grace periods under RTNL (more with tcx
// links on it), tens of milliseconds that a DEL would spend and every other
// verb of the node would queue behind. With the agent alive DEL hands the
// pair off instead: it takes it out of service and frees every name and
// address it held, and the agent deletes it when no verb runs (Reap).
//
// Handed off means: the pod end down and renamed (the pod's interface name
// is free for a new ADD at once; down, it keeps no route), the host end's
// link pins and then the host end renamed to state.HandedOffName (its own
// name is free; the pins keep following it) and set down, which takes its
// routes and neighbours with it, so the pod's addresses can be handed out
// again at once. The pair's alias still names the attachment it was.

// handOffHost hands off the host end of a veth (see above). The links lock
// keeps the agent from pinning a tcx link under the old name meanwhile.
// A veth already gone is fine.
func handOffHost(r *rtnl, pinDir, hostIf string, ifindex int) error {
	r = r.orEach()
	unlock, err := datapath.LockLinks(pinDir)
	if err != nil {
		return err
	}
	defer unlock()
	l, err := r.LinkByIndex(ifindex)
	if err != nil || l.Attrs().Name != hostIf {
		return nil
	}
	to := state.HandedOffName(ifindex)
	if err := datapath.MoveLinkPins(pinDir, hostIf, to, ifindex); err != nil { // not another device's
		return err
	}
	if err := r.LinkSetDown(l); err != nil {
		return fmt.Errorf("hand off %s: set down: %w", hostIf, err)
	}
	if err := r.LinkSetName(l, to); err != nil {
		return fmt.Errorf("hand off %s: rename to %s: %w", hostIf, to, err)
	}
	return nil
}

// handOffPod takes the pod end of a handed-off veth out of service, in the
// pod's netns, through r (nil: the calling thread's netns, the pod's).
func handOffPod(r *rtnl, l netlink.Link, hostIfindex int) {
	r = r.orEach()
	_ = r.LinkSetDown(l)
	_ = r.LinkSetName(l, state.HandedOffName(hostIfindex))
}

// HandedOff is a veth DEL handed off: the host end (Link, nil when the pod's
// netns took the pair with it) or only its link pins.
type HandedOff struct {
	Name    string // state.HandedOffName
	Ifindex int
	Link    netlink.Link
	Pins    []string
}

// ListHandedOff lists the handed-off veths of the node and the link pins of
// those already gone.
func ListHandedOff(pinDir string) ([]HandedOff, error) {
	// Under the links lock, as the hand-off renames pins and veth: a look
	// between the two saw the pins without their veth and reaped them,
	// the veth still up under its old name (TestHandOffSeenWhole).
	unlock, err := datapath.LockLinksIfPresent(pinDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	byName := map[string]*HandedOff{}
	var order []string
	add := func(name string, idx int) *HandedOff {
		h := byName[name]
		if h == nil {
			h = &HandedOff{Name: name, Ifindex: idx}
			byName[name] = h
			order = append(order, name)
		}
		return h
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		name := l.Attrs().Name
		if idx, ok := state.HandedOffIfindex(name); ok && idx == l.Attrs().Index && l.Type() == "veth" {
			add(name, idx).Link = l
		}
	}
	for _, p := range datapath.VethLinkPins(pinDir) {
		if idx, ok := state.HandedOffIfindex(p.HostIf); ok {
			h := add(p.HostIf, idx)
			h.Pins = append(h.Pins, p.Path)
		}
	}
	out := make([]HandedOff, 0, len(order))
	for _, n := range order {
		out = append(out, *byName[n])
	}
	return out, nil
}

// Reap deletes one handed-off veth and then what it left behind: its link
// pins (free now: the deletion detached the links) and the map state keyed
// by its ifindex that a packet in flight during DEL may have re-created
// (link entry, counters, limits) or DEL left to it (stack-flow table and
// records). Idempotent.
func Reap(pinDir string, m *maps.Maps, h HandedOff) error {
	var errs error
	// The veth and its pins go under the links lock, which the orphan
	// sweeps (GC, the agent's reconcile) hold from their look to their
	// removal: none of them sees the pins between the two, and a reap
	// killed in between leaves them for the next one to find whole
	// (TestAgentKilledMidWorkIsRecovered).
	unlock, err := datapath.LockLinksIfPresent(pinDir)
	if err != nil {
		return err
	}
	if h.Link != nil {
		if err := netlink.LinkDel(h.Link); err != nil && !isGone(err) {
			unlock()
			return fmt.Errorf("delete handed-off veth %s: %w", h.Name, err)
		}
		Crashpoint("reap-veth-deleted")
	}
	errs = errors.Join(errs, datapath.RemoveLinkPins(pinDir, h.Name))
	unlock()
	if m != nil {
		// The pod's stack-flow table and records too: DEL leaves them here.
		_, sfErr := m.StackFlows().DeleteOf(h.Ifindex)
		errs = errors.Join(errs, m.Links().Delete(h.Ifindex), m.Stats().Reset(h.Ifindex), m.Bandwidth().DeleteLimits(h.Ifindex), sfErr)
	}
	return errs
}

func isGone(err error) bool { return errors.Is(err, unix.ENODEV) }

// ReapAll reaps every handed-off veth of the node, calling idle before each
// deletion (the agent waits there until no verb runs). It returns how
// many it reaped.
func ReapAll(ctx context.Context, pinDir string, idle func(context.Context) error) (int, error) {
	hs, err := ListHandedOff(pinDir)
	if err != nil || len(hs) == 0 {
		return 0, err
	}
	m, merr := datapath.OpenMaps(pinDir)
	if merr != nil {
		m = nil // never set up: only links and pins to remove
	} else {
		defer m.Close()
	}
	n := 0
	var errs error
	for _, h := range hs {
		if h.Link != nil && idle != nil {
			if err := idle(ctx); err != nil {
				return n, errors.Join(errs, err)
			}
		}
		if err := Reap(pinDir, m, h); err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		n++
	}
	return n, errs
}
