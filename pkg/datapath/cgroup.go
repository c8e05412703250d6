package datapath

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// pacingLinkPath is the pin of the node's sock_ops link.
func pacingLinkPath(pinRoot string) string {
	return filepath.Join(pinRoot, "links", "node_sock_ops")
}

// NetnsCookie returns the cookie of the calling thread's network namespace.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("read netns cookie: %w", err)
	}
	return c, nil
}

// EnsurePacing attaches the sock_ops program to the cgroup2 root once per
// node (a pinned link, so it outlives the process) and registers the calling
// thread's netns as the node's. Cheap when already done: one stat.
func (dp *Datapath) EnsurePacing(cgroupRoot string) error {
	path := pacingLinkPath(dp.PinRoot)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	unlock, err := lockDir(dp.PinRoot)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	root, err := CgroupRoot(cgroupRoot)
	if err != nil {
		return err
	}
	cookie, err := NetnsCookie()
	if err != nil {
		return err
	}
	if err := dp.Maps.PutNetns(cookie, 0, maps.FlagNetnsNode); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create link pin directory: %w", err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: ebpf.AttachCGroupSockOps, Program: dp.SockOps})
	if err != nil {
		return fmt.Errorf("attach sock_ops to cgroup %s: %w", root, err)
	}
	defer l.Close()
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin sock_ops link at %s: %w", path, err)
	}
	return nil
}
