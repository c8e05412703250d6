// Package datapath owns the BPF objects of a node: it loads and pins the
// programs and maps once (whoever comes first, under a lock), and attaches the
// pinned programs to each pod's host veth.
package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
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
	progs, err := loadPrograms(pinRoot, m, corePrograms, mode)
	if err != nil {
		m.Close()
		return nil, err
	}
	dp := &Datapath{PinRoot: pinRoot, Maps: m}
	dp.setCore(progs)
	return dp, nil
}

// Ensure opens the node's datapath, creating and pinning maps and programs
// first when they are missing. Safe to call from many processes at once: the
// slow path runs under an exclusive lock on the pin directory.
func Ensure(pinRoot string) (*Datapath, error) {
	if err := EnsureBPFFS(pinRoot); err != nil {
		return nil, err
	}
	if dp, err := Open(pinRoot); err == nil {
		return dp, nil
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

	// Another process may have finished while we waited for the lock.
	if dp, err := Open(pinRoot); err == nil {
		return dp, nil
	}
	if err := ensureLocks(pinRoot); err != nil {
		return nil, err
	}
	m, err := maps.Create(MapsDir(pinRoot))
	if err != nil {
		return nil, err
	}
	return withPrograms(pinRoot, m, loadMissing)
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
