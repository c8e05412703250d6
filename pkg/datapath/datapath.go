// Package datapath owns the BPF objects of a node: it loads and pins the
// programs and maps once (whoever comes first, under a lock), and attaches the
// pinned programs to each pod's host veth.
package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// DefaultPinRoot is where a node's datapath is pinned unless configured otherwise.
const DefaultPinRoot = "/sys/fs/bpf/ebpf-cni"

// Datapath is a node's pinned maps and programs, opened.
type Datapath struct {
	PinRoot       string
	Maps          *maps.Maps
	FromContainer *ebpf.Program // host veth ingress: packets from the pod
	ToContainer   *ebpf.Program // host veth egress: packets to the pod
	SockOps       *ebpf.Program // cgroup2 root sock_ops: TCP pacing for rate limits

	// After EnsureLean the programs above are nil until first needed
	// (program); fds holds bare fds of pinned programs (progFD).
	fds map[string]int

	seeded bool // EnsureSeeded's seed ran (a migration runs it before its swap)

	// Netlink, when set, is a kept socket of the node's netns that Attach's
	// tc requests go through (an ADD's, see endpoint's rtnl); nil: a socket
	// per request, in the calling thread's netns.
	Netlink *netlink.Handle
}

// nl is the handle Attach's requests go through.
func (dp *Datapath) nl() *netlink.Handle {
	if dp.Netlink != nil {
		return dp.Netlink
	}
	return &netlink.Handle{} // no sockets: the library opens one per request
}

// setCore fills the program fields from loadPrograms' result.
func (dp *Datapath) setCore(progs map[string]*ebpf.Program) {
	dp.FromContainer = progs[progFromContainer.Name]
	dp.ToContainer = progs[progToContainer.Name]
	dp.SockOps = progs[progSockOps.Name]
}

// Open opens an existing pinned datapath without creating anything. The error
// wraps os.ErrNotExist when it was never set up (or by another build).
func Open(pinRoot string) (*Datapath, error) {
	m, err := OpenMaps(pinRoot)
	if err != nil {
		return nil, err
	}
	return withPrograms(pinRoot, m, openPinned)
}

// withPrograms opens (mode openPinned) or loads (loadMissing) the core
// programs over the maps m; on error m is closed.
func withPrograms(pinRoot string, m *maps.Maps, mode loadMode) (*Datapath, error) {
	progs, err := loadPrograms(pinRoot, m, coreProgramsOf(pinRoot), mode)
	if err != nil {
		m.Close()
		return nil, err
	}
	dp := &Datapath{PinRoot: pinRoot, Maps: m}
	dp.setCore(progs)
	return dp, nil
}

// Ensure opens the node's datapath, creating and pinning maps (sized by s)
// and programs first when they are missing, and migrating the attachments
// of an older map layout (see migrateLayout). Safe to call from many
// processes at once: the slow path runs under an exclusive lock on the pin
// directory. Datapath pinned with another sizing is a *maps.SizingError;
// maps of a newer layout are a *NewerLayoutError, and nothing is touched.
func Ensure(pinRoot string, s maps.Sizing) (*Datapath, error) { return EnsureSeeded(pinRoot, s, nil) }

// EnsureSeeded is Ensure with seed run on this build's maps before any
// link runs this build's programs over them: before a migration swaps the
// links (migrateLayout), or before the caller's Upgrade when the maps were
// there. The agent seeds what its programs need from the start and an
// older build's maps may lack (the node addresses among the cluster
// CIDRs: without them a pod's UDP reply to another node's address is
// masqueraded, and a NodePort flow kube-proxy SNATed is lost).
func EnsureSeeded(pinRoot string, s maps.Sizing, seed func(*maps.Maps)) (*Datapath, error) {
	dp, err := ensure(pinRoot, s, seed)
	if err == nil && seed != nil && !dp.seeded {
		seed(dp.Maps)
	}
	return dp, err
}

func ensure(pinRoot string, s maps.Sizing, seed func(*maps.Maps)) (*Datapath, error) {
	if err := EnsureBPFFS(pinRoot); err != nil {
		return nil, err
	}
	if err := RefuseNewerLayout(pinRoot); err != nil {
		return nil, err
	}
	if dp, err := Open(pinRoot); err == nil {
		return checkSizing(dp, s)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}

	if err := os.MkdirAll(pinRoot, 0o700); err != nil {
		return nil, fmt.Errorf("create pin directory %s: %w", pinRoot, err)
	}
	unlock, err := lockDir(pinRoot)
	if err != nil {
		return nil, err
	}
	defer unlock()

	// Another process may have finished while we waited for the lock
	// (a newer build's migration among them).
	if err := RefuseNewerLayout(pinRoot); err != nil {
		return nil, err
	}
	if dp, err := Open(pinRoot); err == nil {
		return checkSizing(dp, s)
	}
	if err := ensureLocks(pinRoot); err != nil {
		return nil, err
	}
	if older := olderLayouts(pinRoot); len(older) > 0 {
		return migrateLayout(pinRoot, s, older, seed)
	}
	if err := readoptMaps(pinRoot); err != nil {
		return nil, err
	}
	m, err := maps.Create(MapsDir(pinRoot), s)
	if err != nil {
		return nil, err
	}
	// Fresh maps hold no per-pod table: the programs skip the map (a
	// migration's maps are synced after the copy: readyToSwap).
	if err := m.StackFlows().SyncNoParts(); err != nil {
		m.Close()
		return nil, err
	}
	dp, err := withPrograms(pinRoot, m, loadMissing)
	if err != nil {
		// The first load on the node: a kernel too old says so here.
		if miss := MissingRequired(); len(miss) > 0 {
			err = fmt.Errorf("%w (the kernel lacks %s, which the datapath needs: docs/compat.md)", err, strings.Join(miss, ", "))
		}
	}
	return dp, err
}

func checkSizing(dp *Datapath, s maps.Sizing) (*Datapath, error) {
	if err := dp.Maps.CheckSizing(s); err != nil {
		dp.Close()
		return nil, err
	}
	return dp, nil
}

// EnsureLean is Ensure for a pod's ADD: it opens the maps but none of
// the programs, which are opened when first needed (program, progFD).
// Opening a pinned program as an *ebpf.Program reads its BTF back from
// the kernel (about 0.15 ms each, three of them, in every ADD's process);
// attaching cls_bpf filters needs only an fd.
func EnsureLean(pinRoot string, s maps.Sizing) (*Datapath, error) {
	if err := EnsureBPFFS(pinRoot); err != nil {
		return nil, err
	}
	dp, err := OpenLean(pinRoot)
	if err == nil {
		return checkSizing(dp, s)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return Ensure(pinRoot, s) // first use on this node: set it up
}

// OpenLean is Open with the programs left to first use (see EnsureLean):
// for DEL, which needs none of them. The error wraps os.ErrNotExist when
// the datapath was never set up (or by another build).
func OpenLean(pinRoot string) (*Datapath, error) {
	m, err := maps.OpenPinned(MapsDir(pinRoot))
	if err != nil {
		return nil, err
	}
	for _, p := range coreProgramsOf(pinRoot) {
		if _, err := os.Stat(progPin(pinRoot, p)); err != nil {
			m.Close()
			return nil, fmt.Errorf("program %s: %w", p.Name, err)
		}
	}
	return &Datapath{PinRoot: pinRoot, Maps: m}, nil
}

// OpenMapsLean opens the node's maps alone (no program, no spec parsed),
// whichever build of this layout pinned the programs: DEL tears an
// attachment down from the maps, and the first DEL after an upgrade within
// a layout finds only the earlier build's programs pinned (OpenLean takes
// that for a node never set up, and the pod's entries would stay). The
// error wraps os.ErrNotExist when no maps of this layout are pinned.
func OpenMapsLean(pinRoot string) (*Datapath, error) {
	m, err := maps.OpenPinned(MapsDir(pinRoot))
	if err != nil {
		return nil, err
	}
	return &Datapath{PinRoot: pinRoot, Maps: m}, nil
}

// program is one of the core programs, opened now if a lean open left it
// out.
func (dp *Datapath) program(p Program) (*ebpf.Program, error) {
	field := map[string]**ebpf.Program{
		progFromContainer.Name: &dp.FromContainer, progToContainer.Name: &dp.ToContainer, progSockOps.Name: &dp.SockOps,
	}[p.Name]
	if field == nil {
		return nil, fmt.Errorf("%s is not a core program", p.Name)
	}
	if *field == nil {
		progs, err := loadPrograms(dp.PinRoot, dp.Maps, []Program{p}, openPinned)
		if err != nil {
			return nil, err
		}
		*field = progs[p.Name]
	}
	return *field, nil
}

// progFD is an fd of a core program: the open program's, or a bare one
// from its pin (bpfObjGet) when a lean open did not open it.
func (dp *Datapath) progFD(p Program) (int, error) {
	if prog, _ := dp.loaded(p); prog != nil {
		return prog.FD(), nil
	}
	if fd, ok := dp.fds[p.Name]; ok {
		return fd, nil
	}
	fd, err := bpfObjGet(progPin(dp.PinRoot, p))
	if err != nil {
		return -1, fmt.Errorf("open pinned program %s: %w", progPin(dp.PinRoot, p), err)
	}
	if dp.fds == nil {
		dp.fds = map[string]int{}
	}
	dp.fds[p.Name] = fd
	return fd, nil
}

// loaded is a core program if it is open.
func (dp *Datapath) loaded(p Program) (*ebpf.Program, bool) {
	switch p.Name {
	case progFromContainer.Name:
		return dp.FromContainer, dp.FromContainer != nil
	case progToContainer.Name:
		return dp.ToContainer, dp.ToContainer != nil
	case progSockOps.Name:
		return dp.SockOps, dp.SockOps != nil
	}
	return nil, false
}

// Close releases the handles; pins stay.
func (dp *Datapath) Close() {
	if dp.Maps != nil {
		dp.Maps.Close()
	}
	for _, p := range []*ebpf.Program{dp.FromContainer, dp.ToContainer, dp.SockOps} {
		if p != nil {
			p.Close()
		}
	}
	for _, fd := range dp.fds {
		unix.Close(fd)
	}
}

// lockDir takes an exclusive flock on a directory (bpffs holds no regular
// files, but a directory fd can carry a lock).
func lockDir(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for locking: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// readoptMaps pins again, from this build's pinned programs, each map of
// the layout whose pin is gone (removed by hand or by another tool) while
// those programs still use it. Created anew instead (maps.Create), it
// would take the verbs' writes where no program reads. Only this build's
// programs (their pins carry its objects' hash) are asked: they were
// loaded with this layout's maps.
func readoptMaps(pinRoot string) error {
	dir := MapsDir(pinRoot)
	missing := map[string]string{} // the kernel's (truncated) name: the pin's
	for _, name := range maps.PinnedNames() {
		if _, err := os.Lstat(filepath.Join(dir, name)); errors.Is(err, os.ErrNotExist) {
			missing[kernelProgName(name)] = name // maps' names are cut alike
		}
	}
	for _, p := range catalog {
		if len(missing) == 0 {
			return nil
		}
		prog, err := ebpf.LoadPinnedProgram(progPin(pinRoot, p), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open pinned program %s: %w", progPin(pinRoot, p), err)
		}
		info, err := prog.Info()
		prog.Close()
		if err != nil {
			return fmt.Errorf("program %s: %w", progPin(pinRoot, p), err)
		}
		ids, _ := info.MapIDs()
		for _, id := range ids {
			if err := readopt(dir, id, missing); err != nil {
				return err
			}
		}
	}
	return nil
}

// Readopt is readoptMaps under the pin directory's lock, for DEL: a pod's
// entries are in the maps its programs read even when a pin of one of
// them is gone, and DEL creates nothing (Ensure would). Nothing to do on
// a node never set up.
func Readopt(pinRoot string) error {
	if _, err := os.Stat(filepath.Join(pinRoot, progsDir)); err != nil {
		return nil // no programs pinned: no map to take from them
	}
	if RefuseNewerLayout(pinRoot) != nil {
		// A newer build's datapath (a rollback): its maps are not this
		// layout's to pin; DEL leaves its entries to the newer agent's
		// reconciler when the node rolls forward again.
		return nil
	}
	unlock, err := lockDir(pinRoot)
	if err != nil {
		return err
	}
	defer unlock()
	return readoptMaps(pinRoot)
}

// readopt pins the map id under dir if it is one of missing (and strikes
// it off).
func readopt(dir string, id ebpf.MapID, missing map[string]string) error {
	m, err := ebpf.NewMapFromID(id)
	if errors.Is(err, os.ErrPermission) {
		// Only by ID can a map without a pin be reached: say so rather
		// than create the missing maps anew where no program reads.
		var names []string
		for _, n := range missing {
			names = append(names, n)
		}
		sort.Strings(names)
		return fmt.Errorf("the pins of %s under %s are gone while pinned programs use their maps; pinning them again opens maps by ID, which needs CAP_SYS_ADMIN: %w",
			strings.Join(names, ", "), dir, err)
	}
	if err != nil {
		return nil // gone meanwhile
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return err
	}
	name, ok := missing[info.Name]
	if !ok {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := m.Pin(filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("pin again map %s, which the pinned programs use: %w", filepath.Join(dir, name), err)
	}
	delete(missing, info.Name)
	return nil
}
