package main

import (
	"fmt"
	"os"

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
