package endpoint

import (
	"fmt"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
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
// The calling thread's, not /proc/self's: that is the main thread's, which
// may be the one another goroutine's ns.Do holds in a pod's netns. A
// goroutine not locked to its thread runs on one in the node's netns.
func isOwnNetns(fd int) bool {
	var pod, self unix.Stat_t
	return unix.Fstat(fd, &pod) == nil && unix.Stat("/proc/thread-self/ns/net", &self) == nil &&
		pod.Dev == self.Dev && pod.Ino == self.Ino
}

// netnsLockWait is how long a teardown waits for the lock of its pod's
// netns (lockNetns): the other holder is a verb of another interface of
// the pod (or, rarely, of a pod sharing the lock's stripe), which holds it
// for tens of milliseconds.
const netnsLockWait = 5 * time.Second

// lockNetns takes the lock of a pod's netns, named by its nsfs inode (which
// every path of the netns, a bind mount or /proc/<pid>/ns/net, opens) among
// pinDir's locks (datapath.LockNetns): a directory of the node's, not the
// nsfs inode itself, whose flock any process of the pod could take and
// hold (attack30: each verb of the pod then waited netnsLockWait and went
// on without the lock). A teardown holds it from its look at the pod's
// other interfaces until its own veth is gone, so that of two DELs of a
// pod's two interfaces side by side, the second sees the first's veth gone
// and removes the pod's netns entry (each saw the other's and kept it). An
// ADD holds it while it ensures the pod's netns entry (Publish), so that a
// DEL of another interface beside it does not delete the entry after the
// ADD found it there. release drops it; nil when not had (no datapath set
// up; a holder past netnsLockWait: the verb goes on without it).
func lockNetns(pinDir string, netns ns.NetNS) (release func()) {
	var st unix.Stat_t
	if unix.Fstat(int(netns.Fd()), &st) != nil {
		return nil
	}
	return datapath.LockNetns(pinDir, st.Ino, netnsLockWait)
}

// netnsHold is a pod's netns held open and locked (lockNetns) by a
// teardown; Close unlocks it and closes the netns.
type netnsHold struct {
	netns   ns.NetNS
	release func()
}

func (h *netnsHold) Close() {
	if h.release != nil {
		h.release()
	}
	h.netns.Close()
}
