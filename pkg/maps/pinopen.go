package maps

import (
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// loadPinnedMap opens the map pinned at p, as ebpf.LoadPinnedMap does
// without its readlink of /proc/self/fd to learn the object's type: every
// verb opens some 40 pins, and that readlink was a third of the cost of each
// (issue 30). A pin that holds no map fails the caller's check against the
// map's spec (compatible) instead. A missing pin wraps os.ErrNotExist.
func loadPinnedMap(p string) (*ebpf.Map, error) {
	path, err := unix.BytePtrFromString(p)
	if err != nil {
		return nil, err
	}
	attr := struct {
		pathname  uint64
		bpfFD     uint32
		fileFlags uint32
	}{pathname: uint64(uintptr(unsafe.Pointer(path)))}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(path)
	if errno != 0 {
		return nil, errno // the callers name the pin
	}
	return ebpf.NewMapFromFD(int(fd)) // closes fd on error
}
