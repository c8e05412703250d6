package cni

import (
	"context"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// The IPAM plugin's verbs, delegated as the CNI library does. Not through
// plugins' pkg/ipam: it imports pkg/ip, which brings iptables and nftables
// helpers whose package initialisation (compiled regexps) every ADD and
// DEL paid for without using them (issue 30).

func ipamAdd(plugin string, conf []byte) (types.Result, error) {
	return invoke.DelegateAdd(context.TODO(), plugin, conf, nil)
}

func ipamDel(plugin string, conf []byte) error {
	return invoke.DelegateDel(context.TODO(), plugin, conf, nil)
}

// ipamDelWithoutArgs runs the IPAM plugin's DEL of args' attachment with
// no CNI_ARGS: for an IPAM plugin that refused DEL's (argsRefused), as
// host-local releases by container ID and interface name alone.
func ipamDelWithoutArgs(plugin string, conf []byte, args *skel.CmdArgs) error {
	path, err := invoke.FindInPath(plugin, filepath.SplitList(args.Path))
	if err != nil {
		return err
	}
	return invoke.ExecPluginWithoutResult(context.TODO(), path, conf, &invoke.Args{
		Command: "DEL", ContainerID: args.ContainerID, NetNS: args.Netns, IfName: args.IfName, Path: args.Path,
	}, nil)
}

func ipamCheck(plugin string, conf []byte) error {
	return invoke.DelegateCheck(context.TODO(), plugin, conf, nil)
}

// warmExec runs, in the background, the check that the os package makes
// once per process before its first child (pidfd_open, waitid and
// pidfd_send_signal on itself, then a clone(CLONE_PIDFD) of a child that
// exits at once): called at the start of a verb, it is done by the time
// the IPAM plugin is exec'd, where it lay on the verb's critical path
// (issue 30). os.FindProcess makes the same check; the process handle it
// returns is released. A verb that execs nothing wasted one short clone.
// The verb defers the returned wait: it never exits with that child
// unreaped (a verb failing at once, on a bad configuration).
func warmExec() (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Release()
		}
	}()
	return func() { <-done }
}
