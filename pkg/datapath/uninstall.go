package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Removal is one trace of the datapath that an uninstall removed.
type Removal struct {
	Kind string `json:"kind"`
	What string `json:"what"`
}

// DetachNodeHooks detaches and unpins every node-wide hook link of pinRoot
// (node/, and the pacing link an older build left under links/): the uplink
// programs' tcx links, the cgroup socket hooks and the pacing hook. A pin is
// the link's last reference once no process holds it, so unpinning detaches.
func DetachNodeHooks(pinRoot string) ([]Removal, error) {
	var (
		paths []string
		out   []Removal
		errs  error
	)
	for _, p := range NodeHookPins(pinRoot) {
		if p.Symlink {
			// Planted: the link it names is another's (held by its own
			// pin); only the symlink goes, unfollowed.
			if err := os.Remove(p.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = errors.Join(errs, fmt.Errorf("remove symlink %s: %w", p.Path, err))
			} else {
				out = append(out, Removal{"node hook", p.Name + " (a symlink, not followed)"})
			}
			continue
		}
		paths = append(paths, p.Path)
	}
	if fi, err := os.Lstat(legacyPacingPin(pinRoot)); err == nil && fi.Mode()&os.ModeSymlink == 0 {
		paths = append(paths, legacyPacingPin(pinRoot))
	}
	for _, path := range paths {
		what := filepath.Base(path)
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			// Not a link (a half-written pin): just the file.
			if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				errs = errors.Join(errs, fmt.Errorf("remove node hook pin %s: %w", path, rerr))
				continue
			}
			out = append(out, Removal{"node hook", what + " (unusable pin)"})
			continue
		}
		if info, err := l.Info(); err == nil {
			what += " " + describeLink(info)
		}
		if err := l.Unpin(); err != nil {
			errs = errors.Join(errs, fmt.Errorf("unpin node hook %s: %w", path, err))
		} else {
			out = append(out, Removal{"node hook", what})
		}
		l.Close()
	}
	return out, errs
}

// describeLink says where a link is attached, for the uninstall report.
func describeLink(info *link.Info) string {
	// By ID needs CAP_SYS_ADMIN: without it the report gives the ID.
	name := fmt.Sprintf("program %d ", info.Program)
	if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
		if pi, err := p.Info(); err == nil {
			name = pi.Name + " "
		}
		p.Close()
	}
	if t := info.TCX(); t != nil {
		dev := fmt.Sprintf("ifindex %d", t.Ifindex)
		if l, err := netlink.LinkByIndex(int(t.Ifindex)); err == nil {
			dev = l.Attrs().Name
		}
		dir := "ingress"
		if ebpf.AttachType(t.AttachType) == ebpf.AttachTCXEgress {
			dir = "egress"
		}
		return fmt.Sprintf("(%son tcx %s of %s)", name, dir, dev)
	}
	if c := info.Cgroup(); c != nil {
		return fmt.Sprintf("(%son cgroup id %d, %s)", name, c.CgroupId, ebpf.AttachType(c.AttachType))
	}
	return fmt.Sprintf("(%slink type %d)", name, info.Type)
}

// ownProgramIDs are the IDs of the programs pinned under progs/: what a
// stray attachment of this pin directory runs.
func ownProgramIDs(pinRoot string) map[ebpf.ProgramID]string {
	out := map[ebpf.ProgramID]string{}
	for _, p := range ProgramPins(pinRoot) {
		prog, err := ebpf.LoadPinnedProgram(p.Path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue
		}
		if info, err := prog.Info(); err == nil {
			if id, ok := info.ID(); ok {
				out[id] = p.Name
			}
		}
		prog.Close()
	}
	return out
}

// DetachStrays removes what runs this pin directory's programs in the
// current netns and on cgroupRoot without a pin under it: a tcx or cgroup
// link some process still holds (detached by its ID), and cls_bpf filters
// of ours (named ebpf-cni-*) on links that are not host veths (those are
// deleted with their veth). Call it before the programs are unpinned: their
// IDs are how a stray is told from another's program of the same name.
// cgroupRoot "" skips the cgroup.
func DetachStrays(pinRoot, cgroupRoot string) ([]Removal, error) {
	ours := ownProgramIDs(pinRoot)
	var (
		out  []Removal
		errs error
	)
	detach := func(where string, res *link.QueryResult) {
		for _, ap := range res.Programs {
			name, mine := ours[ap.ID]
			if !mine {
				continue
			}
			lid, ok := ap.LinkID()
			if !ok {
				continue // attached without a link: cgroup prog_attach, not made by this build
			}
			l, err := link.NewFromID(lid)
			if err != nil {
				continue // gone meanwhile
			}
			if err := l.Detach(); err != nil {
				errs = errors.Join(errs, fmt.Errorf("detach %s from %s: %w", name, where, err))
			} else {
				out = append(out, Removal{"stray link", fmt.Sprintf("%s on %s", name, where)})
			}
			l.Close()
		}
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	if len(ours) > 0 {
		for _, l := range links {
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
				if err != nil {
					continue // no tcx on this kernel or link
				}
				detach(fmt.Sprintf("tcx %s of %s", strings.TrimPrefix(at.String(), "TCX"), l.Attrs().Name), res)
			}
		}
		if cgroupRoot != "" {
			if f, err := os.Open(cgroupRoot); err == nil {
				for _, p := range catalog {
					if p.Scope != ScopeCgroup {
						continue
					}
					res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: p.Attach})
					if err == nil {
						detach(fmt.Sprintf("cgroup %s (%s)", cgroupRoot, p.Attach), res)
					}
				}
				f.Close()
			}
		}
	}
	rs, err := deleteStrayFilters(links)
	return append(out, rs...), errors.Join(errs, err)
}

// deleteStrayFilters deletes the cls_bpf filters of ours (named ebpf-cni-*)
// on links that are not host veths.
func deleteStrayFilters(links []netlink.Link) ([]Removal, error) {
	var (
		out  []Removal
		errs error
	)
	for _, l := range links {
		if isHostVethName(l.Attrs().Name) {
			continue
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlinksafe.FilterList(l, parent)
			if err != nil {
				continue
			}
			for _, f := range fs {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok || !strings.HasPrefix(bf.Name, tcFilterPrefix) {
					continue
				}
				if err := netlink.FilterDel(f); err != nil {
					errs = errors.Join(errs, fmt.Errorf("delete tc filter %s of %s: %w", bf.Name, l.Attrs().Name, err))
				} else {
					out = append(out, Removal{"tc filter", fmt.Sprintf("%s on %s", bf.Name, l.Attrs().Name)})
				}
			}
		}
	}
	return out, errs
}

// isHostVethName: a pod's host veth or a handed-off one (state's prefixes;
// datapath does not import state).
func isHostVethName(n string) bool {
	return strings.HasPrefix(n, "ebpf") && len(n) == 15 || strings.HasPrefix(n, "ebpz")
}

// RemovePinDir removes the pin directory and everything under it (maps of
// every layout, programs, links, locks), reporting each part; a missing
// directory is nothing to do. Detach the node hooks first (DetachNodeHooks):
// unpinning a link nobody holds detaches it, which must be a choice.
func RemovePinDir(pinRoot string) ([]Removal, error) {
	if err := CheckPinDir(pinRoot); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(pinRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pin directory %s: %w", pinRoot, err)
	}
	// The locks last: an uninstall's lock among them keeps ADDs off until
	// the rest is gone.
	sort.SliceStable(ents, func(i, j int) bool { return ents[j].Name() == locksDir && ents[i].Name() != locksDir })
	var out []Removal
	for _, e := range ents {
		path := filepath.Join(pinRoot, e.Name())
		kind := "pin"
		switch {
		case strings.HasPrefix(e.Name(), "maps_v"):
			kind = "maps"
		case e.Name() == progsDir:
			kind = "programs"
		case e.Name() == linksDir:
			kind = "link pins"
		case e.Name() == nodeDir:
			kind = "node hook pins"
		case e.Name() == locksDir:
			kind = "locks"
		}
		what := path
		if e.IsDir() {
			sub, _ := os.ReadDir(path)
			names := make([]string, 0, len(sub))
			for _, s := range sub {
				names = append(names, s.Name())
			}
			sort.Strings(names)
			what = path + " (empty)"
			if len(names) > 0 {
				what = fmt.Sprintf("%s (%d: %s)", path, len(names), abbreviate(names, 6))
			}
		}
		if err := os.RemoveAll(path); err != nil {
			return out, fmt.Errorf("remove %s: %w", path, err)
		}
		out = append(out, Removal{kind, what})
	}
	if err := unix.Rmdir(pinRoot); err != nil && !errors.Is(err, unix.ENOENT) {
		return out, fmt.Errorf("remove pin directory %s: %w", pinRoot, err)
	}
	out = append(out, Removal{"pin directory", pinRoot})
	return out, nil
}

// abbreviate joins names, the first n of them and a count of the rest.
func abbreviate(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, " ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], " "), len(names)-n)
}

// Runs tells whether a link runs one of this pin directory's programs
// (on tcx, or as a cls_bpf filter), or has a link pin under it: how a host
// veth of this datapath is told from another pin directory's.
func Runs(pinRoot string) func(l netlink.Link) bool {
	ours := ownProgramIDs(pinRoot)
	pinned := map[string]bool{}
	for _, p := range VethLinkPins(pinRoot) {
		pinned[p.HostIf] = true
	}
	return func(l netlink.Link) bool {
		if pinned[l.Attrs().Name] {
			return true
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			if res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at}); err == nil {
				for _, p := range res.Programs {
					if _, ok := ours[p.ID]; ok {
						return true
					}
				}
			}
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, _ := netlinksafe.FilterList(l, parent)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok {
					if _, mine := ours[ebpf.ProgramID(bf.Id)]; mine {
						return true
					}
				}
			}
		}
		return false
	}
}

// CheckPinDir refuses a directory that is not a pin directory of the
// datapath before anything is removed from it or loaded through it: a
// symlink, or one holding anything the datapath never makes there (the
// bpffs root, or the directory holding ours and other tools' pins, as
// `--pin-dir <ours>/..` names), or one of our entries replaced by a
// symlink. A missing directory is fine (nothing to remove).
func CheckPinDir(pinRoot string) error {
	fi, err := os.Lstat(pinRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pin directory %s: %w", pinRoot, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("pin directory %s is not a directory (%s): not a pin directory of ebpf-cni", pinRoot, fi.Mode().Type())
	}
	ents, err := os.ReadDir(pinRoot)
	if err != nil {
		return fmt.Errorf("read pin directory %s: %w", pinRoot, err)
	}
	var foreign []string
	for _, e := range ents {
		if !isPinDirEntry(e.Name()) || !e.IsDir() || isSymlink(e) {
			foreign = append(foreign, e.Name())
		}
	}
	if len(foreign) > 0 {
		sort.Strings(foreign)
		return fmt.Errorf("%s holds %s, which ebpf-cni never makes there (it makes maps_v<N>, progs, links, node, locks): not a pin directory of ebpf-cni, nothing removed; give the pinDir of the conflist",
			pinRoot, abbreviate(foreign, 6))
	}
	return nil
}

// isPinDirEntry: a name the datapath makes directly under the pin
// directory (pins.go's layout).
func isPinDirEntry(name string) bool {
	switch name {
	case progsDir, linksDir, nodeDir, locksDir:
		return true
	case markerCompat, markerFull, markerNoPacing, markerPacing: // the node's build and pacing choices (features.go)
		return true
	}
	v, ok := strings.CutPrefix(name, "maps_v")
	v = strings.TrimSuffix(v, "_staging")
	n, err := strconv.Atoi(v)
	return ok && err == nil && n > 0 && strconv.Itoa(n) == v
}

// RunsForeign tells whether a link runs a BPF program (on tcx, or as a
// cls_bpf filter) that is not one of this pin directory's: a host veth of
// another pin directory's datapath runs only its own programs.
func RunsForeign(pinRoot string) func(l netlink.Link) bool {
	ours := ownProgramIDs(pinRoot)
	return func(l netlink.Link) bool {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			if res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at}); err == nil {
				for _, p := range res.Programs {
					if _, ok := ours[p.ID]; !ok {
						return true
					}
				}
			}
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, _ := netlinksafe.FilterList(l, parent)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok {
					if _, mine := ours[ebpf.ProgramID(bf.Id)]; !mine {
						return true
					}
				}
			}
		}
		return false
	}
}
