package testenv

import (
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NewNetNS creates a network namespace and bind-mounts it at path (a file
// that must not exist yet), like `ip netns add` but at a path of our choice.
func NewNetNS(path string) (ns.NetNS, error) {
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
		RemoveNetNSPath(path)
		return nil, err
	}
	return n, nil
}

// RemoveNetNS closes, unmounts and removes a namespace made by NewNetNS.
func RemoveNetNS(n ns.NetNS) error {
	path := n.Path()
	n.Close()
	return RemoveNetNSPath(path)
}

func RemoveNetNSPath(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// VethBetween joins two namespaces with a veth pair, a /24 on each end, and
// sets lo and both ends up.
func VethBetween(a ns.NetNS, aName string, aIP net.IP, z ns.NetNS, zName string, zIP net.IP) error {
	up := func(name string, ip net.IP) error {
		for _, n := range []string{"lo", name} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if n == name {
				addr, _ := netlink.ParseAddr(ip.String() + "/24")
				if err := netlink.AddrAdd(l, addr); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	}
	err := a.Do(func(ns.NetNS) error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: zName, PeerNamespace: netlink.NsFd(int(z.Fd()))}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		return up(aName, aIP)
	})
	if err != nil {
		return err
	}
	return z.Do(func(ns.NetNS) error { return up(zName, zIP) })
}

// SetupNode brings lo up in a node namespace and puts addr (a CIDR) on it.
func SetupNode(node ns.NetNS, addr string) error {
	return node.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(lo, a); err != nil {
			return fmt.Errorf("add %s to lo: %w", addr, err)
		}
		return nil
	})
}

// RouteVia adds a default route via gw in a namespace.
func RouteVia(n ns.NetNS, dev string, gw net.IP) error {
	return n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw})
	})
}
