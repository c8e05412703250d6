package endpoint

import (
	"errors"
	"fmt"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// nsGetNstype is NS_GET_NSTYPE from linux/nsfs.h: _IO(0xb7, 0x3).
const nsGetNstype = 0xb703

// OpenNetns opens CNI_NETNS and refuses anything but a network namespace
// other than the one the plugin runs in (the node's): configuring the node's
// own netns as a pod would replace its default route.
func OpenNetns(path string) (ns.NetNS, error) {
	envErr := func(format string, a ...any) error {
		return Errorf(ErrEnv, "CNI_NETNS %q: %s", path, fmt.Sprintf(format, a...))
	}
	netns, err := ns.GetNS(path)
	if err != nil {
		return nil, envErr("cannot open network namespace: %v", err)
	}
	fd := int(netns.Fd())
	typ, err := unix.IoctlRetInt(fd, nsGetNstype)
	if err != nil || typ != unix.CLONE_NEWNET {
		netns.Close()
		return nil, envErr("is not a network namespace")
	}
	if isOwnNetns(fd) {
		netns.Close()
		return nil, envErr("is the node's own network namespace (the one the plugin runs in), not a pod's")
	}
	return netns, nil
}

// isOwnNetns tells whether a netns fd is the plugin's own netns (the node's).
func isOwnNetns(fd int) bool {
	var pod, self unix.Stat_t
	return unix.Fstat(fd, &pod) == nil && unix.Stat("/proc/self/ns/net", &self) == nil &&
		pod.Dev == self.Dev && pod.Ino == self.Ino
}

// netnsLockWait is how long a teardown waits for the lock of its pod's
// netns (lockNetns): the other holder is a teardown of another interface
// of the pod, which holds it for tens of milliseconds.
const netnsLockWait = 5 * time.Second

// lockNetns takes the lock of a pod's netns: an exclusive flock on its
// nsfs file, which every path of the netns (a bind mount, /proc/<pid>/ns/net)
// opens as the one inode, and so the one lock. A teardown holds it from its
// look at the pod's other interfaces until its own veth is gone, so that of
// two DELs of a pod's two interfaces side by side, the second sees the
// first's veth gone and removes the pod's netns entry (each saw the other's
// and kept it). An ADD holds it while it ensures the pod's netns entry
// (Publish), so that a DEL of another interface beside it does not delete
// the entry after the ADD found it there. The lock goes with the fd
// (netns.Close, or unlockNetnsFile). Not had within
// netnsLockWait (a holder that is not ours), the teardown goes on without it.
func lockNetns(netns ns.NetNS) bool {
	fd := int(netns.Fd())
	deadline := time.Now().Add(netnsLockWait)
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return true
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) || time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// unlockNetnsFile releases the lock lockNetns took, keeping the netns open.
func unlockNetnsFile(netns ns.NetNS) {
	_ = unix.Flock(int(netns.Fd()), unix.LOCK_UN)
}
