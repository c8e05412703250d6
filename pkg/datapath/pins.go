package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// The layout of a pin directory. This file is the only code that builds
// paths below it:
//
//	<pinDir>/maps_v<N>/<map>                   maps of layout N (maps.LayoutVersion)
//	<pinDir>/maps_v<N>_staging/<map>           maps being migrated from an older layout (migrate.go)
//	<pinDir>/progs/<program>_<object hash>     programs, by build (see progPin)
//	<pinDir>/links/<host veth>_<ingress|egress> tcx links of pods' host veths
//	<pinDir>/node/<hook>                       node-wide hook links (catalog: Program.Link)
//	<pinDir>/locks/<agent|busy|links>          flocked directories (locks.go)
//	<pinDir>/locks/netns/<stripe>              a pod netns's lock, by its nsfs inode (LockNetns)
//
// links/ holds nothing but host veth links, so anything there whose veth is
// gone is an orphan; a handed-off veth's pins are renamed with it
// (state.HandedOffName). node/ holds the links that outlive every pod.
const (
	progsDir = "progs"
	linksDir = "links"
	nodeDir  = "node"
	locksDir = "locks"
)

// lockPath is the file of one of the locks of locks.go.
func lockPath(pinRoot, name string) string { return filepath.Join(pinRoot, locksDir, name) }

// MapsDir is where the maps of this build's layout are pinned.
func MapsDir(pinRoot string) string { return LayoutMapsDir(pinRoot, maps.LayoutVersion) }

// LayoutMapsDir is where the maps of map layout v are (or were) pinned.
func LayoutMapsDir(pinRoot string, v int) string {
	return filepath.Join(pinRoot, fmt.Sprintf("maps_v%d", v))
}

// StagingMapsDir is where the maps of this build's layout are made while
// an older layout's are migrated (bpffs refuses names with a dot).
func StagingMapsDir(pinRoot string) string { return MapsDir(pinRoot) + "_staging" }

// oldLayout is a map directory an older build pinned.
type oldLayout struct {
	dir     string
	version int
}

// olderLayouts lists the map directories of layouts before this build's,
// oldest first.
func olderLayouts(pinRoot string) []oldLayout {
	ents, _ := os.ReadDir(pinRoot)
	var out []oldLayout
	for _, e := range ents {
		v, ok := strings.CutPrefix(e.Name(), "maps_v")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || !e.IsDir() || n >= maps.LayoutVersion {
			continue
		}
		out = append(out, oldLayout{filepath.Join(pinRoot, e.Name()), n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out
}

// OpenMaps opens the pinned maps of this build's layout (read-only users:
// dumps, metrics, tests). The error wraps os.ErrNotExist when the datapath
// was never set up.
func OpenMaps(pinRoot string) (*maps.Maps, error) { return maps.Open(MapsDir(pinRoot)) }

// progPin is where a program is pinned: the name carries a hash of its
// object, so a new build never picks up an older build's program.
func progPin(pinRoot string, p Program) string {
	return filepath.Join(pinRoot, progsDir, progPinName(p, p.obj.in(pinRoot)))
}

func progPinName(p Program, o *object) string {
	return fmt.Sprintf("%s_%s", p.Name, o.hash())
}

// hash is the start of the object's SHA-256 in hex, once per process and
// taken from objHashes (make generate) when the object's size and CRC-32
// match it: an ADD names three programs, and hashing their 0.1-0.4 MB
// objects was a tenth of its CPU time (issue 30). The IEEE polynomial, not
// Castagnoli's: Go builds CRC-32C's tables at the first MakeTable, which
// cost an ADD more than the sum itself (0.2 ms, perf), and IEEE's runs on
// the CPU's carry-less multiply with no table to build. A stale table (objects rebuilt without make generate) costs the
// SHA-256 again, never a wrong name; TestObjHashesCurrent fails on it.
func (o *object) hash() string {
	o.hashOnce.Do(func() {
		if k, ok := objHashes[o.name]; ok && k.size == len(o.bytes) && k.crc == crc32.ChecksumIEEE(o.bytes) {
			o.hashHex = k.sha
			return
		}
		h := sha256.Sum256(o.bytes)
		o.hashHex = hex.EncodeToString(h[:6])
	})
	return o.hashHex
}

// objHash is what objhashgen records of an object.
type objHash struct {
	size int
	crc  uint32
	sha  string
}

// LinkPinPath is where the tcx link of a host veth's hook is pinned; dir
// is "ingress" or "egress" (Program.Link of the host veth programs).
func LinkPinPath(pinRoot, hostIf, dir string) string {
	return filepath.Join(pinRoot, linksDir, hostIf+"_"+dir)
}

// nodePin is where a node-wide hook's link is pinned: a cgroup hook under
// its Link name, an uplink hook under its Link prefix and the uplink's name.
func nodePin(pinRoot string, p Program, ifname string) string {
	return filepath.Join(pinRoot, nodeDir, p.Link+ifname)
}

// uplinkPins are the pinned links of uplink hook p, by uplink name.
func uplinkPins(pinRoot string, p Program) map[string]string {
	out := map[string]string{}
	ents, _ := os.ReadDir(filepath.Join(pinRoot, nodeDir))
	for _, e := range ents {
		if name, ok := strings.CutPrefix(e.Name(), p.Link); ok {
			out[name] = filepath.Join(pinRoot, nodeDir, e.Name())
		}
	}
	return out
}

// PacingLinkPin is where the node's sock_ops (TCP pacing) link is pinned.
func PacingLinkPin(pinRoot string) string { return nodePin(pinRoot, progSockOps, "") }

// legacyPacingPin is where builds before node/ held the sock_ops link; see
// migratePacingPin.
func legacyPacingPin(pinRoot string) string { return filepath.Join(pinRoot, linksDir, "node_sock_ops") }

// ProgramPin is one pinned program.
type ProgramPin struct {
	Name    string // base name under progs/
	Path    string
	Current bool // one of this build's programs
}

// ProgramPins lists the pinned programs, this build's and others'.
func ProgramPins(pinRoot string) []ProgramPin {
	current := map[string]bool{}
	for _, p := range catalog {
		current[progPinName(p, p.obj.in(pinRoot))] = true
	}
	ents, _ := readPinDir(filepath.Join(pinRoot, progsDir))
	var out []ProgramPin
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || isSymlink(e) {
			continue
		}
		out = append(out, ProgramPin{Name: e.Name(), Path: filepath.Join(pinRoot, progsDir, e.Name()), Current: current[e.Name()]})
	}
	return out
}

// VethLinkPin is one pinned tcx link of a host veth.
type VethLinkPin struct {
	HostIf string
	Dir    string // ingress or egress
	Path   string
}

// VethLinkPins lists the link pins of host veths; names of any other shape
// (none are made) are not reported.
func VethLinkPins(pinRoot string) []VethLinkPin {
	dirs := map[string]bool{}
	for _, p := range catalog {
		if p.Scope == ScopeHostVeth {
			dirs[p.Link] = true
		}
	}
	ents, _ := readPinDir(filepath.Join(pinRoot, linksDir))
	var out []VethLinkPin
	for _, e := range ents {
		if isSymlink(e) {
			continue
		}
		name := e.Name()
		i := strings.LastIndexByte(name, '_')
		if i <= 0 || !dirs[name[i+1:]] {
			continue
		}
		out = append(out, VethLinkPin{HostIf: name[:i], Dir: name[i+1:], Path: filepath.Join(pinRoot, linksDir, name)})
	}
	return out
}

// ForOrphanVethLinkPins calls fn for each host veth link pin whose veth no
// longer exists in this netns (a pod gone without DEL, a DEL that failed
// part way; its name may be another tool's link now: the pin's link is
// attached to no device then; a veth renamed keeps its pins: orphanPin), with the links lock held from the look to the last fn. The
// look is under it as a DEL's hand-off renames the pins, then the veth,
// and a look between the two took the live veth's pins for orphans
// (TestHandOffSeenWhole); fn is under it too, as an ADD
// that makes a veth of the same name and pins its links meanwhile (the
// same container added again) waits, so fn never removes a live pod's pin
// taken for an orphan (TestGCOrphanPinsAgainstReAdd).
func ForOrphanVethLinkPins(pinRoot string, fn func(VethLinkPin) error) error {
	unlock, err := LockLinksIfPresent(pinRoot)
	if err != nil {
		return err
	}
	defer unlock()
	var orphans []VethLinkPin
	for _, p := range VethLinkPins(pinRoot) {
		if orphanPin(p) {
			orphans = append(orphans, p)
		}
	}
	holdpoint("orphan-pins") // between the look and the removal
	var errs error
	for _, p := range orphans {
		errs = errors.Join(errs, fn(p))
	}
	return errs
}

// orphanPin tells whether a host veth's link pin is an orphan: its tcx
// link is attached to no device (the veth went, whatever link has its name
// now), or, a pin that is no readable tcx link, no link has its name. A
// tcx link attached to a device is that device's whatever its name: the
// pod's host veth an operator renamed (`ip link set NAME name ...`) keeps
// its pins under the attachment's host veth name, and removing them would
// detach its programs (TestOrphanPinsRenamedVethKept).
func orphanPin(p VethLinkPin) bool {
	if info, err := pinnedLinkInfo(p.Path); err == nil && info.TCX() != nil {
		return info.TCX().Ifindex == 0
	}
	l, err := netlinksafe.LinkByName(p.HostIf)
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || (err == nil && !pinnedOnLink(p.Path, l.Attrs().Index))
}

// pinnedOnLink tells whether a link pin's tcx link is attached to ifindex.
// A pin whose device went (ifindex 0) is not, though a link of its name
// exists: another tool's, made under the name since (the pod's host veth is
// identified by the device, never by the name alone). A pin that cannot be
// read is taken for attached: kept.
func pinnedOnLink(path string, ifindex int) bool {
	info, err := pinnedLinkInfo(path)
	if err != nil {
		return true
	}
	t := info.TCX()
	return t == nil || int(t.Ifindex) == ifindex
}

// RemoveOrphanVethLinkPins removes the orphaned host veth link pins (see
// ForOrphanVethLinkPins) and returns them.
func RemoveOrphanVethLinkPins(pinRoot string) ([]VethLinkPin, error) {
	var gone []VethLinkPin
	err := ForOrphanVethLinkPins(pinRoot, func(p VethLinkPin) error {
		if err := os.Remove(p.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		gone = append(gone, p)
		return nil
	})
	return gone, err
}

// RemoveLinkPins deletes the tcx link pins of a host veth; idempotent. A pin
// is the link's last reference, so removing it detaches a live link; DEL
// deletes the veth first, so it only drops defunct links (no grace period).
// tc filters need no work: they go with the device.
func RemoveLinkPins(pinRoot, hostIf string) error {
	var errs error
	for _, p := range catalog {
		if p.Scope != ScopeHostVeth {
			continue
		}
		path := LinkPinPath(pinRoot, hostIf, p.Link)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = errors.Join(errs, fmt.Errorf("remove link pin %s: %w", path, err))
		}
	}
	return errs
}

// RemoveLinkPinsOn is RemoveLinkPins for the veth at ifindex only: a pin
// whose tcx link is attached to another device is that device's (a veth
// renamed keeps its pins under its attachment's name) and stays; removing
// it would detach its programs. An ADD undoing its attach calls it.
func RemoveLinkPinsOn(pinRoot, hostIf string, ifindex int) error {
	var errs error
	for _, p := range hostVethPrograms {
		path := LinkPinPath(pinRoot, hostIf, p.Link)
		if pinnedElsewhere(path, ifindex) != 0 {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = errors.Join(errs, fmt.Errorf("remove link pin %s: %w", path, err))
		}
	}
	return errs
}

// pinnedElsewhere is the device a link pin's tcx link is attached to when
// that is another than ifindex; 0 when it is ifindex, none (its device
// gone), or the pin is no readable tcx link (or absent).
func pinnedElsewhere(path string, ifindex int) int {
	info, err := pinnedLinkInfo(path)
	if err != nil || info.TCX() == nil {
		return 0
	}
	if idx := int(info.TCX().Ifindex); idx != 0 && idx != ifindex {
		return idx
	}
	return 0
}

// MoveLinkPins renames the tcx link pins of host veth from to those of
// to (a rename keeps the links attached); missing pins are fine. Call it
// with the links lock held (LockLinks). Only those of the veth at ifindex
// (or of no device): a pin whose tcx link is attached to another device (a
// veth renamed away from from keeps its pins under it) stays where it is.
// A DEL's hand-off calls it: the pins it moves are reaped (removed) with
// its veth.
func MoveLinkPins(pinRoot, from, to string, ifindex int) error {
	var errs error
	for _, p := range hostVethPrograms {
		src, dst := LinkPinPath(pinRoot, from, p.Link), LinkPinPath(pinRoot, to, p.Link)
		if pinnedElsewhere(src, ifindex) != 0 {
			continue
		}
		if err := os.Rename(src, dst); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = errors.Join(errs, fmt.Errorf("move link pin %s to %s: %w", src, dst, err))
		}
	}
	return errs
}

// NodeHookPin is one pinned node-wide hook link.
type NodeHookPin struct {
	Name string // base name under node/: cgroup_<hook>, uplink_<if>, uplink-egress_<if>
	Path string
	// Symlink: planted in node/ (the datapath pins no symlink); never
	// loaded through.
	Symlink bool
}

// NodeHookPins lists the pinned node-wide hook links.
func NodeHookPins(pinRoot string) []NodeHookPin {
	ents, _ := readPinDir(filepath.Join(pinRoot, nodeDir))
	var out []NodeHookPin
	for _, e := range ents {
		out = append(out, NodeHookPin{Name: e.Name(), Path: filepath.Join(pinRoot, nodeDir, e.Name()), Symlink: isSymlink(e)})
	}
	return out
}

// pinnedLinks lists every pinned link of the datapath, host veths' and the
// node's, for Upgrade.
func pinnedLinks(pinRoot string) ([]string, error) {
	var out []string
	for _, d := range []string{linksDir, nodeDir} {
		ents, err := os.ReadDir(filepath.Join(pinRoot, d))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, e := range ents {
			out = append(out, filepath.Join(pinRoot, d, e.Name()))
		}
	}
	return out, nil
}

// mkdirFor creates the directory a pin goes into.
func mkdirFor(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create pin directory %s: %w", filepath.Dir(path), err)
	}
	return nil
}

// migratePacingPin moves the sock_ops link an older build pinned in links/
// to node/, where node-wide links live now (a rename keeps the link
// attached). Call with the pin directory locked.
func migratePacingPin(pinRoot string) error {
	old := legacyPacingPin(pinRoot)
	if _, err := os.Stat(old); err != nil {
		return nil
	}
	to := PacingLinkPin(pinRoot)
	if _, err := os.Stat(to); err == nil {
		// Both: the old one is a second sock_ops link; drop it.
		dropLinkPin(old)
		return nil
	}
	if err := mkdirFor(to); err != nil {
		return err
	}
	if err := os.Rename(old, to); err != nil {
		return fmt.Errorf("move sock_ops link pin %s to %s: %w", old, to, err)
	}
	return nil
}

// dropLinkPin detaches and unpins a pinned link (or removes whatever file
// is there).
func dropLinkPin(path string) {
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		l.Unpin()
		l.Close()
		return
	}
	os.Remove(path)
}

// readPinDir lists a directory of the pin directory, never through a
// symlink planted in its place: bpffs takes symlinks, and loading a pin
// through one would take another program's object for ours.
func readPinDir(dir string) ([]os.DirEntry, error) {
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		if err == nil {
			err = fmt.Errorf("%s is not a directory", dir)
		}
		return nil, err
	}
	return os.ReadDir(dir)
}

// isSymlink: an entry of a pin directory that is a symlink (never made by
// the datapath) names something else's object.
func isSymlink(e os.DirEntry) bool { return e.Type()&os.ModeSymlink != 0 }

// programByID opens program id: by its ID where the kernel allows that
// (CAP_SYS_ADMIN: BPF_PROG_GET_FD_BY_ID), else among the programs pinned
// in pinRoot, this build's and older builds'. The DaemonSet's agent has
// only CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON: by ID it could neither name
// the programs of the uplink and cgroup links an older build attached (so
// an upgrade left them on the old programs and maps) nor move a pod from
// its cls_bpf filters to tcx. Every program our links and filters run is
// pinned until no link runs it any more (upgradeLocked).
func programByID(pinRoot string, id ebpf.ProgramID) (*ebpf.Program, error) {
	p, err := ebpf.NewProgramFromID(id)
	if err == nil || !errors.Is(err, os.ErrPermission) {
		return p, err
	}
	for _, pin := range ProgramPins(pinRoot) {
		q, perr := ebpf.LoadPinnedProgram(pin.Path, &ebpf.LoadPinOptions{ReadOnly: true})
		if perr != nil {
			continue
		}
		if info, ierr := q.Info(); ierr == nil {
			if qid, ok := info.ID(); ok && qid == id {
				return q, nil
			}
		}
		q.Close()
	}
	return nil, fmt.Errorf("%w (and no program pinned in %s has id %d)", err, filepath.Join(pinRoot, progsDir), id)
}
