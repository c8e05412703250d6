package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BPFFSRoot is where the kernel's BPF filesystem is conventionally mounted.
const BPFFSRoot = "/sys/fs/bpf"

// EnsureBPFFS makes sure pinRoot lies on a BPF filesystem, mounting one at
// /sys/fs/bpf when pinRoot is below it and nothing is mounted there yet.
func EnsureBPFFS(pinRoot string) error {
	if !filepath.IsAbs(pinRoot) {
		return fmt.Errorf("pin directory %q is not an absolute path", pinRoot)
	}
	ok, err := onBPFFS(pinRoot)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	if pinRoot != BPFFSRoot && !strings.HasPrefix(pinRoot, BPFFSRoot+"/") {
		return fmt.Errorf("pin directory %s is not on a BPF filesystem (mount one with: mount -t bpf bpf <dir>)", pinRoot)
	}
	if err := os.MkdirAll(BPFFSRoot, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", BPFFSRoot, err)
	}
	if err := unix.Mount("bpffs", BPFFSRoot, "bpf", 0, "mode=0700"); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mount bpffs on %s: %w", BPFFSRoot, err)
	}
	if ok, err := onBPFFS(pinRoot); err != nil || !ok {
		return fmt.Errorf("pin directory %s is still not on a BPF filesystem after mounting %s", pinRoot, BPFFSRoot)
	}
	return nil
}

// onBPFFS reports whether the nearest existing ancestor of p is on bpffs.
func onBPFFS(p string) (bool, error) {
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return st.Type == unix.BPF_FS_MAGIC, nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("statfs %s: %w", p, err)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return false, nil
		}
		p = parent
	}
}

// bpfObjGet opens a pinned BPF object and returns its bare fd
// (BPF_OBJ_GET): what a netlink cls_bpf filter takes, without the info and
// BTF cilium/ebpf reads back to build an *ebpf.Program.
func bpfObjGet(path string) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	attr := struct {
		pathname  uint64
		bpfFD     uint32
		fileFlags uint32
	}{pathname: uint64(uintptr(unsafe.Pointer(p)))}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(p)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil // the kernel sets O_CLOEXEC on BPF fds
}
