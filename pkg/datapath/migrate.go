package datapath

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TCFilter is one of our cls_bpf filters on a host veth.
type TCFilter struct {
	Prog    Program
	Name    string
	ProgID  ebpf.ProgramID
	Pending bool // waits for the agent to move it to tcx
}

// TCVeth is a link with our cls_bpf filters.
type TCVeth struct {
	Ifindex int
	Name    string
	Filters []TCFilter
	// Pins is the host veth name the attachment's link pins are under,
	// where Migrate pins the tcx links ("": Name). An operator may have
	// renamed the veth: its pins stay under the record's name, where every
	// verb looks for them (endpoint.PinNameOf).
	Pins string
}

// pinName is the name the veth's link pins are under.
func (v TCVeth) pinName() string {
	if v.Pins != "" {
		return v.Pins
	}
	return v.Name
}

// Pending tells whether the veth's filters wait to be moved to tcx.
func (v TCVeth) Pending() bool {
	for _, f := range v.Filters {
		if f.Pending {
			return true
		}
	}
	return false
}

// TCVeths lists the links of this netns that carry our cls_bpf filters:
// one dump of the qdiscs finds the clsact holders, then two filter dumps
// each.
func TCVeths() ([]TCVeth, error) {
	hs, err := ClsactHolders()
	if err != nil {
		return nil, err
	}
	var out []TCVeth
	for _, h := range hs {
		if v, ok := TCVethOf(h.Ifindex, h.Name); ok {
			out = append(out, v)
		}
	}
	return out, nil
}

// Link is a link of this netns by index and name.
type Link struct {
	Ifindex int
	Name    string
}

// ClsactHolders lists the links of this netns with a clsact qdisc (ours
// carry one from ADD on, empty once moved to tcx): one qdisc dump, one
// link dump.
func ClsactHolders() ([]Link, error) {
	qs, err := netlinksafe.QdiscList(nil)
	if err != nil {
		return nil, fmt.Errorf("list qdiscs: %w", err)
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var out []Link
	for _, q := range qs {
		if q.Type() != "clsact" {
			continue
		}
		if name, ok := names[q.Attrs().LinkIndex]; ok {
			out = append(out, Link{q.Attrs().LinkIndex, name})
		}
	}
	return out, nil
}

// TCVethOf reads our cls_bpf filters of one link (two filter dumps); ok
// false when it has none (or is gone).
func TCVethOf(ifindex int, name string) (TCVeth, bool) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil || l.Attrs().Name != name {
		return TCVeth{}, false
	}
	v := TCVeth{Ifindex: ifindex, Name: name}
	for _, p := range hostVethPrograms {
		if f, ok := ourFilter(l, p); ok {
			v.Filters = append(v.Filters, f)
		}
	}
	return v, len(v.Filters) > 0
}

// ourFilter finds our filter on hook p of link l.
func ourFilter(l netlink.Link, p Program) (TCFilter, bool) {
	fs, err := netlinksafe.FilterList(l, tcParent(p))
	if err != nil {
		return TCFilter{}, false
	}
	for _, f := range fs {
		bf, ok := f.(*netlink.BpfFilter)
		if !ok || !strings.HasPrefix(bf.Name, tcFilterPrefix) {
			continue
		}
		return TCFilter{Prog: p, Name: bf.Name, ProgID: ebpf.ProgramID(bf.Id), Pending: strings.HasPrefix(bf.Name, tcPendingPrefix)}, true
	}
	return TCFilter{}, false
}

// Migrate moves a host veth whose cls_bpf filters wait for tcx to pinned
// tcx links running the same programs, then deletes the filters. Each of
// the three steps waits out RCU grace periods under RTNL, so before is
// called ahead of each, with its name (ingress, egress, filters): the agent
// waits there until no CNI verb runs. A
// packet meets exactly one of our programs throughout: a tcx program's
// verdict (ours never answer TCX_NEXT) ends the hook before cls_bpf runs.
// The veth is re-checked under the links lock before each step: a DEL that
// handed it off meanwhile (renamed) ends the migration without error.
func Migrate(ctx context.Context, pinRoot string, v TCVeth, before func(ctx context.Context, step string) error) error {
	for _, f := range v.Filters {
		if !f.Pending {
			continue
		}
		if err := before(ctx, f.Prog.Link); err != nil {
			return err
		}
		done, err := underLinksLock(pinRoot, v, func(l netlink.Link) error { return migrateHook(pinRoot, l, v, f) })
		if err != nil || done {
			return err
		}
	}
	if err := before(ctx, "filters"); err != nil {
		return err
	}
	_, err := underLinksLock(pinRoot, v, func(netlink.Link) error {
		for _, p := range hostVethPrograms {
			if !tcxPinnedOn(pinRoot, v.pinName(), p, v.Ifindex) {
				return fmt.Errorf("%s: tcx %s link missing after the move; filters kept", v.Name, p.Link)
			}
		}
		// The filters go, the (then empty) clsact qdisc stays: deleting a
		// root qdisc of a live device deactivates its queues for a grace
		// period, dropping what it sends meanwhile. An empty clsact costs
		// packets nothing: tcx gives the verdict before it would run.
		var errs error
		for _, f := range v.Filters {
			errs = errors.Join(errs, deleteFilter(v.Ifindex, f.Prog))
		}
		return errs
	})
	return err
}

// deleteFilter removes our cls_bpf filter from hook p of a link.
func deleteFilter(ifindex int, p Program) error {
	err := netlink.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
		LinkIndex: ifindex, Parent: tcParent(p), Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1,
	}})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete tc %s filter of ifindex %d: %w", p.Link, ifindex, err)
	}
	return nil
}

// underLinksLock runs step with the links lock held if the veth is still
// there under its name; gone reports that it was not (handed off, deleted).
func underLinksLock(pinRoot string, v TCVeth, step func(l netlink.Link) error) (gone bool, err error) {
	unlock, err := LockLinks(pinRoot)
	if err != nil {
		return false, err
	}
	defer unlock()
	l, err := netlink.LinkByIndex(v.Ifindex)
	if err != nil || l.Attrs().Name != v.Name {
		return true, nil
	}
	return false, step(l)
}

// migrateHook attaches and pins the tcx link of one hook of l, unless an
// earlier (killed) run of the agent pinned it already. It runs the program
// the filter runs now, read under the links lock: an upgrade may have
// swapped the filter since the agent looked at it (v), and would not see
// the tcx link made here with the program seen then (the pod kept the old
// programs; TestUpgradeDuringMoveToTCX).
func migrateHook(pinRoot string, l netlink.Link, v TCVeth, f TCFilter) error {
	if tcxPinnedOn(pinRoot, v.pinName(), f.Prog, v.Ifindex) {
		return nil
	}
	cur, ok := ourFilter(l, f.Prog)
	if !ok {
		return fmt.Errorf("%s: its %s filter is gone; not moved to tcx", v.Name, f.Prog.Link)
	}
	prog, err := programByID(pinRoot, cur.ProgID)
	if err != nil {
		return fmt.Errorf("%s: program %d of the %s filter: %w", v.Name, cur.ProgID, f.Prog.Link, err)
	}
	defer prog.Close()
	if err := mkdirFor(LinkPinPath(pinRoot, v.pinName(), f.Prog.Link)); err != nil {
		return err
	}
	return attachTCXProg(pinRoot, v.Ifindex, v.pinName(), f.Prog, prog)
}

// tcxPinnedOn tells whether hostIf's link pin of hook p is a tcx link
// attached to ifindex.
func tcxPinnedOn(pinRoot, hostIf string, p Program, ifindex int) bool {
	l, err := link.LoadPinnedLink(LinkPinPath(pinRoot, hostIf, p.Link), nil)
	if err != nil {
		return false
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return false
	}
	t := info.TCX()
	return t != nil && int(t.Ifindex) == ifindex && ebpf.AttachType(t.AttachType) == p.Attach
}

// Attachment states of a host veth, as AttachmentOf reports them.
const (
	StateTCX       = "tcx"
	StateTC        = "tc"
	StateTCPending = "tc, tcx pending"
	StateMoving    = "tc+tcx, moving"
	StateNone      = "none"
)

// AttachmentOf says how the hooks of the host veth at ifindex are
// attached: tcx links pinned under hostIf (the attachment's host veth
// name) that are attached to that device, our cls_bpf filters (waiting
// for tcx or not), both while the agent moves it, or none. A pin under the
// name whose link is attached to another device, or to none (the veth
// went; another tool's link took the name since), is not this link's: the
// link is identified by its device, as the teardown does, never by the
// name alone.
func AttachmentOf(pinRoot string, ifindex int, hostIf string) string {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return StateNone
	}
	var tcx, tc, pending int
	for _, p := range hostVethPrograms {
		if tcxPinnedOn(pinRoot, hostIf, p, ifindex) {
			tcx++
		}
		if f, ok := ourFilter(l, p); ok {
			tc++
			if f.Pending {
				pending++
			}
		}
	}
	switch {
	case tcx > 0 && tc > 0:
		return StateMoving
	case tcx > 0:
		return StateTCX
	case pending > 0:
		return StateTCPending
	case tc > 0:
		return StateTC
	}
	return StateNone
}

// upgradeFilters swaps every cls_bpf filter of ours on the node's links to
// this build's program (loaded, by name), in place, keeping its name (and
// so whether it waits for tcx). It returns how many filters it looked at
// and how many it swapped.
func upgradeFilters(loaded map[string]*ebpf.Program) (seen, swapped int, errs error) {
	vs, err := TCVeths()
	if err != nil {
		return 0, 0, err
	}
	for _, v := range vs {
		for _, f := range v.Filters {
			seen++
			next := loaded[f.Prog.Name]
			if next == nil {
				continue
			}
			want, err := progID(next)
			if err != nil {
				errs = errors.Join(errs, err)
				continue
			}
			if want == f.ProgID {
				continue
			}
			if err := replaceFilter(&netlink.Handle{}, v.Ifindex, f.Prog, next.FD(), f.Name); err != nil {
				errs = errors.Join(errs, fmt.Errorf("%s: %w", v.Name, err))
				continue
			}
			swapped++
		}
	}
	return seen, swapped, errs
}
