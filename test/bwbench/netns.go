package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// newNetNS creates a network namespace and bind-mounts it at path (a file
// that must not exist yet), like `ip netns add` but at a path of our choice.
func newNetNS(path string) (ns.NetNS, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns mount point: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread ends up in the new namespace; it is never unlocked, so
		// the runtime discards it when this goroutine returns.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount network namespace at %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, err
	}
	n, err := ns.GetNS(path)
	if err != nil {
		removeNetNSPath(path)
		return nil, err
	}
	return n, nil
}

// removeNetNS closes, unmounts and removes a namespace made by newNetNS.
func removeNetNS(n ns.NetNS) error {
	path := n.Path()
	n.Close()
	return removeNetNSPath(path)
}

func removeNetNSPath(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
