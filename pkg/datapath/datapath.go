// Package datapath owns the BPF objects of a node: it loads and pins the
// programs and maps once (whoever comes first, under a lock), and attaches the
// pinned programs to each pod's host veth.
package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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

type progDef struct {
	name string // C function name
	load func() (*ebpf.CollectionSpec, error)
	obj  []byte
}

func programs() []progDef {
	return []progDef{
		{"cni_from_container", loadFromContainer, _FromContainerBytes},
		{"cni_to_container", loadToContainer, _ToContainerBytes},
		{"cni_sock_ops", loadSockOps, _SockOpsBytes},
	}
}

// ProgPinPath is where a program is pinned: the name carries a hash of the
// object, so a new build never picks up an older build's program.
func progPinPath(pinRoot string, p progDef) string {
	h := sha256.Sum256(p.obj)
	return filepath.Join(pinRoot, "progs", fmt.Sprintf("%s_%s", p.name, hex.EncodeToString(h[:6])))
}

// Open opens an existing pinned datapath without creating anything. The error
// wraps os.ErrNotExist when it was never set up (or by another build).
func Open(pinRoot string) (*Datapath, error) {
	m, err := maps.Open(pinRoot)
	if err != nil {
		return nil, err
	}
	dp := &Datapath{PinRoot: pinRoot, Maps: m}
	progs := programs()
	out := dp.progSlots()
	for i, p := range progs {
		prog, err := ebpf.LoadPinnedProgram(progPinPath(pinRoot, p), nil)
		if err != nil {
			dp.Close()
			return nil, fmt.Errorf("open pinned program %s: %w", progPinPath(pinRoot, p), err)
		}
		*out[i] = prog
	}
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
	return create(pinRoot)
}

func create(pinRoot string) (_ *Datapath, err error) {
	m, err := maps.Create(pinRoot)
	if err != nil {
		return nil, err
	}
	dp := &Datapath{PinRoot: pinRoot, Maps: m}
	defer func() {
		if err != nil {
			dp.Close()
		}
	}()
	if err := os.MkdirAll(filepath.Join(pinRoot, "progs"), 0o700); err != nil {
		return nil, fmt.Errorf("create program pin directory: %w", err)
	}
	out := dp.progSlots()
	for i, p := range programs() {
		path := progPinPath(pinRoot, p)
		if prog, err := ebpf.LoadPinnedProgram(path, nil); err == nil {
			*out[i] = prog
			continue
		}
		spec, err := p.load()
		if err != nil {
			return nil, fmt.Errorf("parse embedded program %s: %w", p.name, err)
		}
		// Every map the program uses is the pinned one: programs never own maps.
		repl := make(map[string]*ebpf.Map)
		for name := range spec.Maps {
			pinned := m.Map(name)
			if pinned == nil {
				return nil, fmt.Errorf("program %s uses map %s, which pkg/maps does not pin", p.name, name)
			}
			repl[name] = pinned
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
		if err != nil {
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				return nil, fmt.Errorf("load program %s: %+v", p.name, ve)
			}
			return nil, fmt.Errorf("load program %s: %w", p.name, err)
		}
		prog := coll.DetachProgram(p.name)
		coll.Close()
		if prog == nil {
			return nil, fmt.Errorf("embedded object lacks program %s", p.name)
		}
		if err := prog.Pin(path); err != nil {
			prog.Close()
			return nil, fmt.Errorf("pin program %s at %s: %w", p.name, path, err)
		}
		*out[i] = prog
	}
	return dp, nil
}

// progSlots are the fields programs() loads into, in the same order.
func (dp *Datapath) progSlots() []**ebpf.Program {
	return []**ebpf.Program{&dp.FromContainer, &dp.ToContainer, &dp.SockOps}
}

// Close releases the handles; pins stay.
func (dp *Datapath) Close() {
	if dp.Maps != nil {
		dp.Maps.Close()
	}
	for _, p := range dp.progSlots() {
		if *p != nil {
			(*p).Close()
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
