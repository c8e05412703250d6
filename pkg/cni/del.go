package cni

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
)

// Del is the CNI DEL verb: best effort and idempotent. It needs neither the
// netns nor the veth to exist, and succeeds when called again.
func Del(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := checkDirs(conf); err != nil {
		return err
	}
	rec, err := readRecord(conf.StateDir, conf.Name, args.ContainerID, args.IfName)
	if err != nil {
		// A corrupt record must not block DEL: fall back to what can be derived.
		rec = nil
	}
	if rec != nil && recordBusy(conf.StateDir, conf.Name, rec) {
		// An ADD of this attachment is still at work: tear down what it
		// ends with, not what it has made so far.
		if !safedir.WaitUnlocked(recordPath(conf.StateDir, conf.Name, args.ContainerID, args.IfName), addWait) {
			return types.NewError(types.ErrTryAgainLater, fmt.Sprintf(
				"an ADD of CNI_CONTAINERID %q, CNI_IFNAME %q (pid %d) is still running after %s", args.ContainerID, args.IfName, rec.Pid, addWait), "")
		}
		if rec, err = readRecord(conf.StateDir, conf.Name, args.ContainerID, args.IfName); err != nil {
			rec = nil
		}
	}
	tr := newTracer()
	defer tr.done("DEL")
	// The IPAM release is a separate process: run it while tearing down.
	ipamErr := make(chan error, 1)
	go func() {
		if conf.IPAM.Type == "" {
			ipamErr <- nil
			return
		}
		if err := ipam.ExecDel(conf.IPAM.Type, args.StdinData); err != nil {
			ipamErr <- ipamError(conf.IPAM.Type, err)
			return
		}
		ipamErr <- nil
	}()
	errs := teardown(conf, args.ContainerID, args.IfName, args.Netns, rec, tr)
	tr.mark("teardown")
	errs = errors.Join(errs, <-ipamErr)
	tr.mark("ipam-wait")
	if errs != nil {
		var te *types.Error
		if errors.As(errs, &te) {
			return te
		}
		return types.NewError(types.ErrInternal, errs.Error(), "")
	}
	return nil
}

// addWait is how long DEL waits for an ADD of the same attachment to end.
const addWait = 30 * time.Second

// teardown removes everything ADD made on the node except the IPAM
// reservation: map entries, counters, link pins, the veth and the record.
// A provisional record (ADD killed part way) names the attachment but not
// its addresses or hostPorts: those are found by the host veth's ifindex.
func teardown(conf *NetConf, containerID, ifname, netnsPath string, rec *Record, tr *tracer) error {
	full := rec
	if rec != nil && rec.Provisional {
		full = nil
	}
	hostIf := HostIfName(containerID, ifname)
	ifindex := 0
	if l, err := netlink.LinkByName(hostIf); err == nil {
		ifindex = l.Attrs().Index
	} else if rec != nil && rec.HostIfindex != 0 {
		// The veth is gone; its old index is ours unless a new link took it.
		if l, err := netlink.LinkByIndex(rec.HostIfindex); err != nil || l.Attrs().Name == hostIf {
			ifindex = rec.HostIfindex
		}
	}

	tr.mark("lookup")
	var errs error
	dp, err := datapath.Open(conf.PinDir)
	switch {
	case err == nil:
		defer dp.Close()
	case errors.Is(err, os.ErrNotExist):
		dp = nil // never set up: nothing in maps
	default:
		errs = errors.Join(errs, fmt.Errorf("open datapath at %s: %w", conf.PinDir, err))
		dp = nil
	}

	// Order matters. 0: hostPort mappings, so no new flow is translated to
	// the pod. 1: endpoint entries go first, so no other pod redirects
	// into this one any more. 2: the veth goes, which detaches the programs;
	// once it returns no program runs for this ifindex. 3: only now the link
	// entry and counters: a packet in flight before 2 would re-create them.
	// The pod's hostPort, masquerade and stack flows are purged while the
	// veth is being deleted.
	var purge chan error
	if dp != nil {
		errs = errors.Join(errs, removeHostPorts(dp, full, ifindex))
		hp := full == nil || len(full.HostPorts) > 0
		masq := full == nil || full.Masq
		if ifindex != 0 {
			purge = make(chan error, 1)
			go func() {
				// Any pod may have flows the stack delivered to it (a Service's backend).
				_, err := dp.Maps.DeleteStackFlowsOf(ifindex)
				if hp {
					err = errors.Join(err, purgeHostPortFlows(dp, ifindex))
				}
				if masq {
					_, merr := dp.Maps.DeleteSNATOf(ifindex)
					err = errors.Join(err, merr)
				}
				purge <- err
			}()
		}
	}
	tr.mark("hostports")
	if dp != nil && ifindex != 0 {
		var ips []net.IP
		if full != nil {
			for _, s := range full.IPs {
				if ip := net.ParseIP(s); ip != nil {
					ips = append(ips, ip)
				}
			}
		} else {
			// No record (ADD died before writing it): find the entries by interface.
			eps, err := dp.Maps.ListEndpoints()
			errs = errors.Join(errs, err)
			for _, e := range eps {
				if int(e.Info.Ifindex) == ifindex {
					ips = append(ips, e.IP)
				}
			}
		}
		for _, ip := range ips {
			errs = errors.Join(errs, dp.Maps.DeleteEndpoint(ip, ifindex))
		}
	}
	// Inside the pod: the interface's rules go; the pod's netns entry goes
	// unless another interface of the pod still uses it.
	var recCookie uint64
	table := 0
	if rec != nil {
		recCookie, table = rec.NetnsCookie, rec.PodTable
		if netnsPath == "" {
			netnsPath = rec.Netns
		}
	}
	isOurs := func(idx int) bool {
		if dp == nil {
			return false
		}
		_, err := dp.Maps.LookupLink(idx)
		return err == nil
	}
	if cookie := podTeardown(netnsPath, ifname, recCookie, ifindex, table, isOurs); cookie != 0 && dp != nil {
		errs = errors.Join(errs, dp.Maps.DeleteNetns(cookie))
	}
	tr.mark("endpoints")
	// Deleting the veth before dropping the link pins also saves time:
	// unregistering the device detaches both tcx hooks, and releasing an
	// already detached link is free, whereas releasing an attached one waits
	// out an RCU grace period per hook.
	errs = errors.Join(errs, deleteLink(hostIf))
	tr.mark("veth")
	if purge != nil {
		errs = errors.Join(errs, <-purge)
		tr.mark("hostport-flows")
	}
	if dp != nil && ifindex != 0 {
		errs = errors.Join(errs, dp.Maps.DeleteLink(ifindex), dp.Maps.DeleteLimits(ifindex), dp.Maps.ResetStats(ifindex))
	}
	errs = errors.Join(errs, datapath.RemoveLinkPins(conf.PinDir, hostIf))
	tr.mark("pins")
	if errs == nil {
		// Keep the record while anything failed, so a retry or GC can finish.
		errs = removeRecord(conf.StateDir, conf.Name, containerID, ifname)
	}
	return errs
}
