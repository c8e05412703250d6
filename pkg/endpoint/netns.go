package endpoint

import (
	"fmt"

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
