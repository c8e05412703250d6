package testenv

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NewNS creates a named network namespace (under /var/run/netns) that is
// closed, unmounted and removed when the test ends, whatever its outcome.
func NewNS(t testing.TB) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		if err := RemoveNS(n); err != nil {
			t.Errorf("netns left behind: %v", err)
		}
	})
	return n
}

// RemoveNS closes, unmounts and removes a namespace NewNS (or testutils)
// made. A plain unmount can fail while the mount is busy (a mount namespace
// created meanwhile, a process entering it); the lazy one cannot.
func RemoveNS(n ns.NetNS) error {
	path := n.Path()
	n.Close()
	err := unix.Unmount(path, 0)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		err = unix.Unmount(path, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// ReadSysctl reads a /proc/sys file of the netns n.
func ReadSysctl(t testing.TB, n ns.NetNS, path string) string {
	t.Helper()
	var s string
	n.Do(func(ns.NetNS) error {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
		}
		s = strings.TrimSpace(string(b))
		return nil
	})
	return s
}

// WriteSysctl writes a /proc/sys file of the netns n.
func WriteSysctl(t testing.TB, n ns.NetNS, path, v string) {
	t.Helper()
	n.Do(func(ns.NetNS) error {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return nil
	})
}

// WaitIPv6Ready waits until no IPv6 address in netns is tentative, so that
// every up link there has a usable link-local address. Until then the
// kernel cannot solicit a neighbour from that link (a neighbour
// solicitation needs a non-tentative link-local source): a host that starts
// sending earlier queues its datagrams for a second or two and then
// delivers them in one burst. Labs whose hosts stand for machines that have
// long been up wait for this before their traffic starts.
func WaitIPv6Ready(t testing.TB, n ns.NetNS) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left = left[:0]
		err := n.Do(func(ns.NetNS) error {
			addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if a.Flags&unix.IFA_F_TENTATIVE != 0 {
					left = append(left, a.IPNet.String())
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("list addresses in %s: %v", n.Path(), err)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("IPv6 addresses still tentative in %s after 10 s: %v", n.Path(), left)
		}
	}
}
