package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The uplink programs where tcx is missing (or forced off): a clsact qdisc
// and a direct-action cls_bpf filter per hook, named "cni-uplink-<link>"
// (never "ebpf-cni-…", the host veths' prefix, so the host veth code never
// takes an uplink for a pod). The filter lives on the device, not under
// pinDir: what a pinned tcx link proves (attached to this device, running a
// program of ours) is read from the filter itself. An upgrade replaces the
// filter's program in place (the kernel swaps it atomically, as for the
// host veths' filters), so no packet meets a detached hook.

const uplinkFilterPrefix = "cni-uplink-"

// uplinkFilterName names the cls_bpf filter of uplink hook p.
func uplinkFilterName(p Program) string {
	if p.Attach == ebpf.AttachTCXIngress {
		return uplinkFilterPrefix + "ingress"
	}
	return uplinkFilterPrefix + "egress"
}

// uplinkFilter is our filter on hook p of an uplink, if any.
func uplinkFilter(idx int, p Program) (*netlink.BpfFilter, error) {
	l, err := netlink.LinkByIndex(idx)
	if err != nil {
		return nil, err
	}
	fs, err := netlinksafe.FilterList(l, tcParent(p))
	if err != nil {
		return nil, nil // no clsact qdisc
	}
	for _, f := range fs {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == uplinkFilterName(p) {
			return bf, nil
		}
	}
	return nil, nil
}

// ensureUplinkTC makes hook p of uplink name (ifindex idx) run prog as our
// cls_bpf filter, and drops a tcx link of ours pinned for it (the node ran
// with tcx before): the filter is in place before the link goes, so every
// packet meets one of them.
func ensureUplinkTC(pinRoot string, p Program, prog *ebpf.Program, name string, idx int) error {
	want, err := progID(prog)
	if err != nil {
		return err
	}
	f, err := uplinkFilter(idx, p)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", name, err)
	}
	if f == nil || ebpf.ProgramID(f.Id) != want {
		if f != nil {
			if err := foreignUplinkFilter(pinRoot, p, name, ebpf.ProgramID(f.Id)); err != nil {
				return err
			}
		}
		qdisc := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
			QdiscType:  "clsact",
		}
		if err := netlink.QdiscReplace(qdisc); err != nil {
			return fmt.Errorf("add clsact qdisc to uplink %s: %w", name, err)
		}
		if f == nil {
			if err := slotTaken(idx, p, name); err != nil {
				return err
			}
		}
		if err := replaceUplinkFilter(idx, p, prog.FD()); err != nil {
			return fmt.Errorf("uplink %s: %w", name, err)
		}
	}
	dropLinkPin(nodePin(pinRoot, p, name))
	return nil
}

// replaceUplinkFilter puts prog on hook p of an uplink (handle 1, priority
// 1: first of the hook's filters, as tcx ran before any), or swaps it in.
func replaceUplinkFilter(idx int, p Program, fd int) error {
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: idx, Parent: tcParent(p), Handle: 1,
			Protocol: unix.ETH_P_ALL, Priority: 1,
		},
		Fd: fd, Name: uplinkFilterName(p), DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("attach tc %s filter %s: %w", p.Attach, f.Name, err)
	}
	return nil
}

// slotTaken refuses to replace another tool's filter at our place
// (priority 1, handle 1) of hook p: a replace would silently drop it.
func slotTaken(idx int, p Program, name string) error {
	l, err := netlink.LinkByIndex(idx)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", name, err)
	}
	fs, err := netlinksafe.FilterList(l, tcParent(p))
	if err != nil {
		return fmt.Errorf("list tc %s filters of uplink %s: %w", p.Attach, name, err)
	}
	for _, f := range fs {
		a := f.Attrs()
		if a.Priority == 1 && a.Handle == 1 {
			return fmt.Errorf("uplink %s: another tool's %s filter holds priority 1, handle 1 of the %s hook, where the uplink program goes without tcx", name, f.Type(), p.Attach)
		}
	}
	return nil
}

// foreignUplinkFilter refuses a second pin directory in the netns, as
// foreignUplinkProgram does for tcx: our filter running a program none of
// this pinDir's pins is.
func foreignUplinkFilter(pinRoot string, p Program, name string, id ebpf.ProgramID) error {
	for _, pp := range ProgramPins(pinRoot) {
		prog, err := ebpf.LoadPinnedProgram(pp.Path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue
		}
		have, err := progID(prog)
		prog.Close()
		if err == nil && have == id {
			return nil
		}
	}
	return fmt.Errorf("uplink %s already runs %s (program id %d) of another pin directory: "+
		"one pinDir serves a network namespace (give every network of this node the same pinDir)", name, p.Name, id)
}

// removeUplinkTC deletes our filters from a link (no longer an uplink, or
// the node moved to tcx links: called after the link is in place).
func removeUplinkTC(idx int) {
	for _, p := range uplinkPrograms() {
		if f, _ := uplinkFilter(idx, p); f != nil {
			_ = netlink.FilterDel(f)
		}
	}
}

// UplinkFilter is one uplink hook run by a cls_bpf filter.
type UplinkFilter struct {
	Ifindex int
	Link    string // device name
	Hook    Program
	ProgID  ebpf.ProgramID
}

// UplinkFilters lists our uplink filters on the links of this netns.
func UplinkFilters() ([]UplinkFilter, error) {
	hs, err := ClsactHolders()
	if err != nil {
		return nil, err
	}
	var out []UplinkFilter
	for _, h := range hs {
		for _, p := range uplinkPrograms() {
			f, err := uplinkFilter(h.Ifindex, p)
			if err != nil || f == nil {
				continue
			}
			out = append(out, UplinkFilter{Ifindex: h.Ifindex, Link: h.Name, Hook: p, ProgID: ebpf.ProgramID(f.Id)})
		}
	}
	return out, nil
}

// upgradeUplinkFilters swaps every uplink filter to this build's program.
func upgradeUplinkFilters(loaded map[string]*ebpf.Program) (seen, swapped int, errs error) {
	fs, err := UplinkFilters()
	if err != nil {
		return 0, 0, err
	}
	for _, f := range fs {
		seen++
		next := loaded[f.Hook.Name]
		if next == nil {
			errs = errors.Join(errs, fmt.Errorf("uplink %s: %s not loaded", f.Link, f.Hook.Name))
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
		if err := replaceUplinkFilter(f.Ifindex, f.Hook, next.FD()); err != nil {
			errs = errors.Join(errs, fmt.Errorf("uplink %s: %w", f.Link, err))
			continue
		}
		swapped++
	}
	return seen, swapped, errs
}
