package datapath

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// AttachMode selects the kernel hook used on host veths.
type AttachMode string

const (
	// AttachAuto uses tcx where the kernel has it, else clsact + cls_bpf.
	AttachAuto AttachMode = "auto"
	// AttachTCX requires tcx links (kernel 6.6+).
	AttachTCX AttachMode = "tcx"
	// AttachTC uses a clsact qdisc with direct-action cls_bpf filters.
	AttachTC AttachMode = "tc"
)

// ParseAttachMode validates a configured mode; "" means auto.
func ParseAttachMode(s string) (AttachMode, error) {
	switch AttachMode(s) {
	case "", AttachAuto:
		return AttachAuto, nil
	case AttachTCX, AttachTC:
		return AttachMode(s), nil
	}
	return "", fmt.Errorf("unknown attach mode %q (want auto, tcx or tc)", s)
}

// tcParent is the clsact parent of a host veth hook in tc mode.
func tcParent(p Program) uint32 {
	if p.Attach == ebpf.AttachTCXIngress {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

// Attach attaches the datapath to both directions of a host veth. tcx links
// are pinned so they outlive this process; with tc the filters live on the
// device. Both hooks attach concurrently: each tcx attach waits out an RCU
// grace period under RTNL, and two waits overlap. deferTCX (the agent is
// alive) attaches cls_bpf filters instead where the mode is tcx, marked as
// waiting for tcx: the agent moves them to pinned tcx links when no verb
// runs (Migrate), so the verb pays no grace period. It returns the mode
// the veth has now.
func (dp *Datapath) Attach(ifindex int, hostIf string, mode AttachMode, deferTCX bool) (AttachMode, error) {
	if mode == AttachAuto || mode == "" {
		mode = AttachTCX
		if haveTCX() != nil {
			mode = AttachTC
		}
	} else if mode == AttachTCX {
		if err := haveTCX(); err != nil {
			return mode, fmt.Errorf("attachMode tcx: tcx links (Linux 6.6) are not available (%v): use attachMode auto or tc", err)
		}
	}
	if mode == AttachTC || deferTCX {
		return AttachTC, dp.attachTC(ifindex, mode == AttachTCX)
	}
	if err := mkdirFor(LinkPinPath(dp.PinRoot, hostIf, DirIngress)); err != nil {
		return mode, err
	}
	// Under the links lock, programs opened and links pinned: a GC or
	// reconcile that took an earlier veth's pins of this name for orphans
	// removes them before these are pinned, not after
	// (TestGCOrphanPinsAgainstReAdd); an upgrade's look at the links,
	// which it holds the lock from until its last swap, sees this veth
	// or is over (and programs a lean open left unopened are opened here,
	// from the pins it left).
	unlock, err := lockLinksShared(dp.PinRoot) // shared: other ADDs bind other names
	if err != nil {
		return mode, err
	}
	defer unlock()
	for _, p := range hostVethPrograms { // opened before the goroutines: program is not safe for concurrent use
		if _, err := dp.program(p); err != nil {
			return mode, err
		}
	}
	errs := make(chan error, len(hostVethPrograms))
	for _, p := range hostVethPrograms {
		go func(p Program) { errs <- dp.attachTCX(ifindex, hostIf, p) }(p)
	}
	for range hostVethPrograms {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		// This process holds no link fd: the pins are the last references.
		// Only this veth's: a pin refused (attachTCXProg) is another's.
		_ = RemoveLinkPinsOn(dp.PinRoot, hostIf, ifindex)
	}
	return mode, err
}

func (dp *Datapath) attachTCX(ifindex int, hostIf string, p Program) error {
	prog, err := dp.program(p)
	if err != nil {
		return err
	}
	return attachTCXProg(dp.PinRoot, ifindex, hostIf, p, prog)
}

// attachTCXProg attaches prog to hook p of a host veth as a tcx link and
// pins it under the veth's name. A pin there already is replaced when its
// link is attached to no device (an earlier veth of this name, gone) or to
// this one; one attached to another device is refused, not replaced: the
// pin is that link's last reference, and removing it detached the other
// device's programs (a host veth an operator renamed keeps its pins under
// the attachment's name, orphanPin; attack30b's pins shared by two veths).
// No name is safe to move it to: its own attachment's DEL, the sweeps and
// the agent's reap find pins by name.
func attachTCXProg(pinRoot string, ifindex int, hostIf string, p Program, prog *ebpf.Program) error {
	path := LinkPinPath(pinRoot, hostIf, p.Link)
	if other := pinnedElsewhere(path, ifindex); other != 0 {
		return fmt.Errorf("pin tcx link of %s at %s: the link pinned there is attached to another device (ifindex %d), "+
			"whose programs replacing it would detach: not replaced (delete or rename that device, or move its pins)", hostIf, path, other)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: p.Attach})
	if err != nil {
		return fmt.Errorf("attach tcx %s program to %s: %w", p.Link, hostIf, err)
	}
	defer l.Close()
	os.Remove(path) // a stale pin of an earlier veth of this name is detached already
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin tcx link of %s at %s: %w", hostIf, path, err)
	}
	return nil
}

// tcFilterName names a host veth's cls_bpf filter: "ebpf-cni-<dir>" where
// the attachment's mode is tc, "ebpf-cni-tcx-<dir>" where it waits to be
// moved to tcx (Attach with deferTCX).
func tcFilterName(p Program, pending bool) string {
	if pending {
		return tcPendingPrefix + p.Link
	}
	return tcFilterPrefix + p.Link
}

const (
	tcFilterPrefix  = "ebpf-cni-"
	tcPendingPrefix = "ebpf-cni-tcx-"
)

func (dp *Datapath) attachTC(ifindex int, pending bool) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := dp.nl().QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("add clsact qdisc to ifindex %d: %w", ifindex, err)
	}
	for _, p := range hostVethPrograms {
		fd, err := dp.progFD(p)
		if err != nil {
			return err
		}
		if err := replaceFilter(dp.nl(), ifindex, p, fd, tcFilterName(p, pending)); err != nil {
			return err
		}
	}
	return nil
}

// replaceFilter puts prog on hook p of a host veth as its cls_bpf filter
// (handle 1, priority 1): added, or swapped in place for the one there
// (the kernel replaces a filter's program atomically).
func replaceFilter(h *netlink.Handle, ifindex int, p Program, progFD int, name string) error {
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex, Parent: tcParent(p), Handle: 1,
			Protocol: unix.ETH_P_ALL, Priority: 1,
		},
		Fd: progFD, Name: name, DirectAction: true,
	}
	if err := h.FilterReplace(f); err != nil {
		return fmt.Errorf("attach tc %s filter to ifindex %d: %w", p.Link, ifindex, err)
	}
	return nil
}

// Attached checks that this datapath's programs are attached to both hooks of
// a host veth, and names the first hook where they are not.
func (dp *Datapath) Attached(ifindex int, hostIf string) error {
	for _, p := range hostVethPrograms {
		prog, err := dp.program(p)
		if err != nil {
			return err
		}
		want, err := progID(prog)
		if err != nil {
			return err
		}
		ok, err := tcxHas(ifindex, p, want)
		if err != nil {
			return err
		}
		if !ok {
			if ok, err = tcHas(ifindex, p, want); err != nil {
				return err
			}
		}
		if !ok {
			return fmt.Errorf("program %s is not attached to %s %s", prog.String(), hostIf, p.Link)
		}
	}
	return nil
}

func progID(p *ebpf.Program) (ebpf.ProgramID, error) {
	info, err := p.Info()
	if err != nil {
		return 0, fmt.Errorf("read program info: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return 0, errors.New("kernel does not report program IDs")
	}
	return id, nil
}

func tcxHas(ifindex int, p Program, want ebpf.ProgramID) (bool, error) {
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: p.Attach})
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) {
			return false, nil
		}
		return false, fmt.Errorf("query tcx %s programs of ifindex %d: %w", p.Link, ifindex, err)
	}
	for _, p := range res.Programs {
		if p.ID == want {
			return true, nil
		}
	}
	return false, nil
}

func tcHas(ifindex int, p Program, want ebpf.ProgramID) (bool, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return false, fmt.Errorf("find ifindex %d: %w", ifindex, err)
	}
	fs, err := netlinksafe.FilterList(l, tcParent(p))
	if err != nil {
		return false, nil // no clsact qdisc
	}
	for _, f := range fs {
		if bf, ok := f.(*netlink.BpfFilter); ok && ebpf.ProgramID(bf.Id) == want {
			return true, nil
		}
	}
	return false, nil
}

var (
	tcxOnce sync.Once
	tcxErr  error
)

// haveTCX reports whether the datapath uses tcx: the kernel has it and
// EBPF_CNI_FORCE_FALLBACK does not force clsact + cls_bpf instead.
func haveTCX() error {
	if isForced(FeatTCX) {
		return fmt.Errorf("%w: forced off by %s", ebpf.ErrNotSupported, ForceFallbackEnv)
	}
	return kernelHasTCX()
}

// HaveTCX is haveTCX for the agent (which moves pods to tcx only with it).
func HaveTCX() bool { return haveTCX() == nil }

// kernelHasTCX reports whether the kernel supports tcx. cilium/ebpf's probe
// is internal; querying loopback's tcx egress is cheap and tells the same.
func kernelHasTCX() error {
	tcxOnce.Do(func() {
		_, err := link.QueryPrograms(link.QueryOptions{Target: 1, Attach: ebpf.AttachTCXEgress})
		if err != nil && (errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL)) {
			tcxErr = ebpf.ErrNotSupported
		}
	})
	return tcxErr
}
