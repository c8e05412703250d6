package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// The attach types of the plugin's node-wide socket hooks on the cgroup2
// root. Each node of the run attaches its own (from its private bpffs); they
// must be gone once the nodes are.
var sockHookTypes = map[string]ebpf.AttachType{
	"connect4": ebpf.AttachCGroupInet4Connect, "connect6": ebpf.AttachCGroupInet6Connect,
	"sendmsg4": ebpf.AttachCGroupUDP4Sendmsg, "sendmsg6": ebpf.AttachCGroupUDP6Sendmsg,
	"recvmsg4": ebpf.AttachCGroupUDP4Recvmsg, "recvmsg6": ebpf.AttachCGroupUDP6Recvmsg,
	"getpeername4": ebpf.AttachCgroupInet4GetPeername, "getpeername6": ebpf.AttachCgroupInet6GetPeername,
	"sock_ops": ebpf.AttachCGroupSockOps,
}

// cgroupRootProgs: "type/id" of every program attached to the cgroup2 root
// with those types.
func cgroupRootProgs() map[string]bool {
	m := map[string]bool{}
	root := ""
	for _, p := range cgroupMounts() {
		if isCgroup2(p) && (root == "" || len(p) < len(root)) {
			root = p
		}
	}
	if root == "" {
		return m
	}
	f, err := os.Open(root)
	if err != nil {
		return m
	}
	defer f.Close()
	for name, t := range sockHookTypes {
		r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: t})
		if err != nil {
			continue
		}
		for _, p := range r.Programs {
			m[fmt.Sprintf("%s/%d", name, p.ID)] = true
		}
	}
	return m
}

// ourCgroupProgs: the programs of the cgroup links pinned in the nodes'
// private bpffs (read through /proc/<holder>/root, the node's mount
// namespace), by ID. Other sessions' tests attach the same programs to the
// same cgroup2 root, so only these IDs tell the run's own hooks apart.
func (c *cluster) ourCgroupProgs() map[uint32]bool {
	ids := map[uint32]bool{}
	for _, n := range c.nodes {
		if n.holder == nil || n.holder.exited() {
			continue
		}
		root := fmt.Sprintf("/proc/%d/root/sys/fs/bpf", n.holder.cmd.Process.Pid)
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			l, err := link.LoadPinnedLink(p, nil)
			if err != nil {
				return nil // a map or program pin
			}
			defer l.Close()
			if info, err := l.Info(); err == nil && info.Type == link.CgroupType {
				ids[uint32(info.Program)] = true
			}
			return nil
		})
	}
	return ids
}

// attachedIDs: the IDs in cgroupRootProgs' "type/id" keys.
func attachedIDs() map[uint32]bool {
	ids := map[uint32]bool{}
	for k := range cgroupRootProgs() {
		_, id, _ := strings.Cut(k, "/")
		if n, err := strconv.ParseUint(id, 10, 32); err == nil {
			ids[uint32(n)] = true
		}
	}
	return ids
}
