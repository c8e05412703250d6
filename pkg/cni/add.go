package cni

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
)

// undo is a stack of cleanups run when ADD fails part way.
type undo []func() error

func (u *undo) push(f func() error) { *u = append(*u, f) }

// run undoes in reverse order and says whether anything could not be undone.
func (u *undo) run() error {
	var errs error
	for i := len(*u) - 1; i >= 0; i-- {
		errs = errors.Join(errs, (*u)[i]())
	}
	return errs
}

// nsGetNstype is NS_GET_NSTYPE from linux/nsfs.h: _IO(0xb7, 0x3).
const nsGetNstype = 0xb703

// openNetns opens CNI_NETNS and refuses anything but a network namespace
// other than the one the plugin runs in (the node's): configuring the node's
// own netns as a pod would replace its default route.
func openNetns(path string) (ns.NetNS, error) {
	envErr := func(format string, a ...any) error {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %q: ", path)+fmt.Sprintf(format, a...), "")
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

// checkDirs refuses a pin or state directory that another user owns or may
// write to (see safedir), before anything in them is read or written.
func checkDirs(conf *NetConf) error {
	if err := safedir.Check(conf.PinDir); err != nil {
		return confError("pinDir: %v", err)
	}
	if err := safedir.Check(conf.StateDir); err != nil {
		return confError("stateDir: %v", err)
	}
	if err := safedir.Check(recordDir(conf.StateDir, conf.Name)); err != nil {
		return confError("stateDir: %v", err)
	}
	return nil
}

// ipamError keeps the IPAM plugin's error code and says who failed. A plugin
// that crashed or printed no error has no code (libcni reports 0, which is
// success's): that is an internal error.
func ipamError(plugin string, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		code := te.Code
		if code == 0 {
			code = types.ErrInternal
		}
		return types.NewError(code, fmt.Sprintf("ipam plugin %q: %s", plugin, te.Msg), te.Details)
	}
	if strings.Contains(err.Error(), "failed to find plugin") {
		return confError("ipam.type: %v (is it in CNI_PATH?)", err)
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("ipam plugin %q: %v", plugin, err), "")
}

func ensureDatapath(conf *NetConf) (*datapath.Datapath, error) {
	dp, err := datapath.Ensure(conf.PinDir)
	if err != nil {
		return nil, types.NewError(errPluginNotAvailable, fmt.Sprintf("datapath at %s: %v", conf.PinDir, err), "")
	}
	return dp, nil
}

// Add is the CNI ADD verb.
func Add(args *skel.CmdArgs) (err error) {
	tr := newTracer()
	defer tr.done("ADD")
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := validateIPAM(args.StdinData, conf); err != nil {
		return err
	}
	if err := validateRuntimeConfig(conf); err != nil {
		return err
	}
	podMAC, err := requestedMAC(conf, args.Args)
	if err != nil {
		return err
	}
	netns, err := openNetns(args.Netns)
	if err != nil {
		return err
	}
	defer netns.Close()
	if err := checkDirs(conf); err != nil {
		return err
	}
	var cookie uint64
	if err := netns.Do(func(ns.NetNS) (e error) { cookie, e = datapath.NetnsCookie(); return e }); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("CNI_NETNS %q: %v", args.Netns, err), "")
	}

	tr.mark("parse")
	dp, err := ensureDatapath(conf)
	if err != nil {
		return err
	}
	defer dp.Close() // after the undo below, which uses the maps
	tr.mark("datapath")

	// Claim the attachment before creating anything: a second ADD of it (a
	// runtime retrying, two ADDs racing) is refused here and touches nothing
	// of the first, its IPAM reservation least of all. The claim is the
	// provisional record, so an ADD killed from here on is findable.
	hostIf := HostIfName(args.ContainerID, args.IfName)
	rec := &Record{
		ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns, HostIf: hostIf,
		NetnsCookie: cookie, Provisional: true, Pid: os.Getpid(), Created: time.Now().UTC(),
	}
	rec.PodNamespace, rec.PodName = podIdentity(args.Args)
	claim, err := claimAttachment(conf, rec)
	if err != nil {
		return err
	}
	defer claim.Close() // the lock: held until the complete record replaces the provisional one
	var u undo
	defer func() {
		if err == nil {
			return
		}
		// The provisional record goes last, and only if everything else
		// did: what could not be undone stays findable by DEL and GC.
		if u.run() == nil {
			_ = removeRecord(conf.StateDir, conf.Name, args.ContainerID, args.IfName)
		}
	}()
	tr.mark("claim")
	crashpoint("claimed")
	// The veth without our record: this network's record was lost, or
	// another network attached the same container ID and interface name.
	if l, lerr := netlink.LinkByName(hostIf); lerr == nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf(
			"CNI_CONTAINERID %q, CNI_IFNAME %q: the host veth of this attachment exists already, as %s, with no record in %s: DEL it before adding it again",
			args.ContainerID, args.IfName, holderOf(l.Attrs().Index), recordDir(conf.StateDir, conf.Name)), "")
	}

	// Node-level hostPort hooks: set up the first time (an RCU wait per
	// uplink), else only the node addresses are refreshed; either way in
	// parallel with the veth and IPAM below.
	hooksWait := func() error { return nil }
	// Set before the error is sent: the uplink programs are attached even
	// when the error only concerns the socket hooks (no cgroup2 visible),
	// which ipMasq does not need.
	var uplinksReady bool
	// ipMasq needs the uplink program for the replies.
	if len(conf.portMappings) > 0 || conf.IPMasq {
		ch := make(chan error, 1)
		go func() {
			h, e := dp.EnsureHostPorts(hostPortOptions(conf))
			uplinksReady = h != nil
			ch <- e
		}()
		var once sync.Once
		var hooksErr error
		hooksWait = func() error {
			once.Do(func() { hooksErr = <-ch })
			return hooksErr
		}
		// Never exit with the setup half done.
		defer hooksWait()
	}

	// IPAM runs in its own process: start it now and create and attach the
	// veth meanwhile, so the tcx attach's RCU wait overlaps the exec.
	type ipamOut struct {
		res types.Result
		err error
	}
	ipamCh := make(chan ipamOut, 1)
	go func() {
		r, e := ipam.ExecAdd(conf.IPAM.Type, args.StdinData)
		ipamCh <- ipamOut{r, e}
	}()

	p := &plan{hostIf: hostIf, ifname: args.IfName, mtu: conf.MTU, podMAC: podMAC}
	if p.hostMAC, err = randomMAC(); err == nil && p.podMAC == nil {
		p.podMAC, err = randomMAC()
	}
	if err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	hostLink, vethErr := createVeth(p, netns)
	if vethErr == nil {
		// Same order as DEL: the veth first (detaching the programs), then
		// pins, link entry and counters, which in-flight packets could re-create.
		idx := hostLink.Attrs().Index
		u.push(func() error {
			_, sfErr := dp.Maps.DeleteStackFlowsOf(idx)
			return errors.Join(deleteLink(hostIf), datapath.RemoveLinkPins(conf.PinDir, hostIf),
				dp.Maps.DeleteLink(idx), dp.Maps.DeleteLimits(idx), dp.Maps.ResetStats(idx), sfErr)
		})
		tr.mark("veth")
		_, vethErr = dp.Attach(hostLink.Attrs().Index, hostIf, conf.attachMode)
		tr.mark("attach")
	}
	out := <-ipamCh
	tr.mark("ipam-wait")
	if out.err != nil {
		// Not undone: only this ADD's own reservation may be released, and
		// a failed IPAM ADD made none (the runtime's DEL covers a plugin
		// that reserved and then failed).
		return ipamError(conf.IPAM.Type, out.err)
	}
	u.push(func() error { return ipam.ExecDel(conf.IPAM.Type, args.StdinData) })
	crashpoint("ipam")
	if vethErr != nil {
		return types.NewError(types.ErrInternal, vethErr.Error(), "")
	}
	res, err := current.NewResultFromResult(out.res)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("ipam plugin %q result: %v", conf.IPAM.Type, err), "")
	}
	if len(res.IPs) == 0 {
		return types.NewError(types.ErrInternal, fmt.Sprintf("ipam plugin %q returned no IP addresses", conf.IPAM.Type), "")
	}

	full, err := newPlan(res, hostIf, args.IfName, conf.MTU)
	if err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	full.hostMAC, full.podMAC = p.hostMAC, p.podMAC

	var v4, v6 bool
	for _, ipc := range res.IPs {
		if isV4(ipc.Address.IP) {
			v4 = true
		} else {
			v6 = true
		}
	}
	if v6 && conf.MTU != 0 && conf.MTU < minMTU6 {
		// validateIPAM catches it when the ranges show it; other IPAM
		// plugins reveal the family only now.
		return confError("mtu %d is below %d, the least IPv6 works with, and ipam plugin %q gave an IPv6 address", conf.MTU, minMTU6, conf.IPAM.Type)
	}
	if err := enableForwarding(v4, v6); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}

	// Map entries first: the programs are attached already and drop what they
	// do not know.
	ifindex := hostLink.Attrs().Index
	var podIPs []net.IP
	for _, ipc := range res.IPs {
		podIPs = append(podIPs, ipc.Address.IP)
	}
	hps, err := planHostPorts(conf.portMappings, podIPs, ifindex)
	if err != nil {
		return err
	}
	if err := dp.Maps.ResetStats(ifindex); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	if err := dp.Maps.PutLink(ifindex, maps.NewLinkInfo(full.podMAC, full.hostMAC)); err != nil {
		return mapError(err)
	}
	// Limits before the endpoint entries whose flags point at them. Validated
	// already; the undo of the veth removes them.
	lim, _ := parseBandwidth(conf.RuntimeConfig.Bandwidth)
	if err := lim.queueIngress(hostLink); err != nil {
		return netlinkError(err)
	}
	if err := lim.install(dp.Maps, ifindex); err != nil {
		return mapError(err)
	}
	info := maps.NewEndpointInfo(ifindex, full.podMAC, full.hostMAC, lim.endpointFlags())
	if len(hps) > 0 {
		info.Flags |= maps.EndpointFlagHostPort
	}
	if conf.IPMasq {
		// Hooks and cluster CIDRs before the flag that makes the pod use them.
		if err := hooksWait(); err != nil && !uplinksReady {
			return types.NewError(errPluginNotAvailable, fmt.Sprintf("ipMasq uplink hooks at %s: %v", conf.PinDir, err), "")
		}
		if err := dp.Maps.AddClusterCIDRs(clusterCIDRs(conf, res)); err != nil {
			return mapError(err)
		}
		info.Flags |= maps.EndpointFlagMasq
		tr.mark("masq")
	}
	// BPF_NOEXIST: an address has one owner. Another live attachment holding
	// it (two networks with overlapping ranges, an IPAM bug) refuses this ADD;
	// a leftover of a vanished veth does not.
	for _, ipc := range res.IPs {
		ip := ipc.Address.IP
		if err := dp.Maps.InsertEndpoint(ip, info, linkAlive); err != nil {
			var taken *maps.EndpointTakenError
			if errors.As(err, &taken) {
				return confError("pod address %s from ipam plugin %q is already %s's: an address has one owner (overlapping ranges of two networks?); nothing of it was changed",
					ip, conf.IPAM.Type, holderOf(taken.Ifindex))
			}
			return mapError(err)
		}
		u.push(func() error { return dp.Maps.DeleteEndpoint(ip, ifindex) })
	}
	tr.mark("maps")
	crashpoint("endpoints")

	if len(hps) > 0 {
		if err := hooksWait(); err != nil {
			return types.NewError(errPluginNotAvailable, fmt.Sprintf("hostPort hooks at %s: %v", conf.PinDir, err), "")
		}
		tr.mark("hostport-hooks")
		// BPF_NOEXIST: of two ADDs racing for a hostPort exactly one wins,
		// and the loser undoes everything, mappings it did get included.
		for _, h := range hps {
			if err := dp.Maps.InsertHostPort(h); err != nil {
				return hostPortError(conf, h, err)
			}
			u.push(func() error { return dp.Maps.DeleteHostPort(h) })
		}
		tr.mark("hostports")
	}

	if err := configureHost(full, hostLink, ownerAlias(conf.Name, args.ContainerID, args.IfName)); err != nil {
		return netlinkError(err)
	}
	crashpoint("host")
	// The pod's rules outlive its interface: the undo of the veth does not
	// remove them.
	u.push(func() error {
		return netns.Do(func(ns.NetNS) error {
			if full.table != 0 {
				deleteRules(full.table)
			}
			return nil
		})
	})
	if err := configurePod(full, netns); err != nil {
		return netlinkError(err)
	}
	// Every pod's netns is registered, so the sock_ops hook can pace its TCP
	// towards rate-limited pods; the hook itself goes on with the first limit.
	var egressBps uint64
	if lim.egress != nil {
		egressBps = lim.egress.RateBps
	}
	created, err := dp.Maps.EnsureNetns(cookie, egressBps, lim.rcvWnd(hostLink.Attrs().MTU))
	if err != nil {
		return mapError(err)
	}
	if created {
		u.push(func() error { return dp.Maps.DeleteNetns(cookie) })
	}
	if lim.egress != nil || lim.ingress != nil {
		if err := dp.EnsurePacing(conf.CgroupRoot); err != nil {
			return types.NewError(types.ErrInternal, fmt.Sprintf("bandwidth: %v", err), "")
		}
	}
	crashpoint("pod")

	tr.mark("netlink")
	rec.Provisional, rec.Pid = false, 0
	rec.HostIfindex, rec.HostMAC, rec.PodMAC = ifindex, full.hostMAC.String(), full.podMAC.String()
	for _, ipc := range res.IPs {
		rec.IPs = append(rec.IPs, ipc.Address.IP.String())
	}
	if len(hps) > 0 {
		rec.HostPorts = recordHostPorts(hps)
	}
	rec.Masq = conf.IPMasq
	rec.PodTable = full.table
	if err := writeRecord(conf.StateDir, conf.Name, rec); err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
	crashpoint("recorded")

	return types.PrintResult(buildResult(conf, res, full, args), conf.CNIVersion)
}

// mapError is a failed map write as a CNI error: a full map is code 11 (it
// has room again once pods go), anything else internal.
func mapError(err error) error {
	if errors.Is(err, maps.ErrFull) {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// netlinkError: a route another interface holds is code 7 (two networks
// configured to overlap), anything else internal.
func netlinkError(err error) error {
	var c *conflictError
	if errors.As(err, &c) {
		return confError("%s", c.msg)
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// claimAttachment writes the provisional record of the attachment, or
// refuses the ADD when the attachment has a record already.
func claimAttachment(conf *NetConf, rec *Record) (*os.File, error) {
	for try := 0; ; try++ {
		f, err := claimRecord(conf.StateDir, conf.Name, rec)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, errClaimed) {
			return nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("stateDir: %v", err), "")
		}
		old, rerr := readRecord(conf.StateDir, conf.Name, rec.ContainerID, rec.IfName)
		if rerr != nil {
			return nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("stateDir: record of %s/%s: %v", rec.ContainerID, rec.IfName, rerr), "")
		}
		if old == nil && try < 3 {
			continue // removed by a DEL meanwhile: claim again
		}
		return nil, retryError(conf, rec, old)
	}
}

// retryError refuses an ADD of an attachment that has a record: the CNI spec
// forbids a second ADD without a DEL in between. Code 4: the CNI_CONTAINERID
// and CNI_IFNAME the runtime passed name an attachment that exists, the one
// variable-level mistake the runtime can act on (DEL first); 11 while
// another ADD of it is still running, which ends by itself.
func retryError(conf *NetConf, rec, old *Record) error {
	who := fmt.Sprintf("CNI_CONTAINERID %q, CNI_IFNAME %q on network %q", rec.ContainerID, rec.IfName, conf.Name)
	switch {
	case old == nil:
		return types.NewError(types.ErrTryAgainLater, who+": its record keeps changing (a DEL and an ADD racing); try again", "")
	case !old.Provisional:
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf(
			"%s: this attachment exists already (host veth %s, IPs %s, added %s): ADD may not be repeated without a DEL; the attachment is left as it is",
			who, old.HostIf, strings.Join(old.IPs, ", "), old.Created.Format(time.RFC3339)), "")
	case recordBusy(conf.StateDir, conf.Name, old):
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf(
			"%s: another ADD of this attachment is in progress (pid %d)", who, old.Pid), "")
	default:
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf(
			"%s: an earlier ADD of this attachment (pid %d) did not finish and left it half made: DEL it first", who, old.Pid), "")
	}
}

func buildResult(conf *NetConf, ipamRes *current.Result, p *plan, args *skel.CmdArgs) *current.Result {
	ctr := 1
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: p.hostIf, Mac: p.hostMAC.String()},
			{Name: p.ifname, Mac: p.podMAC.String(), Sandbox: args.Netns, Mtu: p.mtu},
		},
		DNS: conf.DNS,
	}
	if ipamRes.DNS.Nameservers != nil || ipamRes.DNS.Domain != "" || ipamRes.DNS.Search != nil || ipamRes.DNS.Options != nil {
		r.DNS = ipamRes.DNS
	}
	for _, ipc := range ipamRes.IPs {
		c := *ipc
		c.Interface = &ctr
		r.IPs = append(r.IPs, &c)
	}
	for _, rt := range p.mainRoutes {
		r.Routes = append(r.Routes, &types.Route{Dst: *rt.dst, GW: rt.gw})
	}
	return r
}

// cniArg returns the value of one key of CNI_ARGS ("K1=V1;K2=V2").
func cniArg(cniArgs, key string) string {
	for _, kv := range strings.Split(cniArgs, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// podIdentity pulls K8S_POD_NAMESPACE and K8S_POD_NAME out of CNI_ARGS.
func podIdentity(cniArgs string) (namespace, name string) {
	return cniArg(cniArgs, "K8S_POD_NAMESPACE"), cniArg(cniArgs, "K8S_POD_NAME")
}

// requestedMAC is the MAC the runtime asks the pod interface to have: the
// "mac" capability (runtimeConfig.mac), else CNI_ARGS MAC, as the tuning
// plugin reads them; nil for a random one. It must be a unicast Ethernet
// address: the datapath never learns a group address as a pod's.
func requestedMAC(conf *NetConf, cniArgs string) (net.HardwareAddr, error) {
	check := func(v string, bad func(format string, a ...any) error) (net.HardwareAddr, error) {
		mac, err := net.ParseMAC(v)
		switch {
		case err != nil || len(mac) != 6:
			return nil, bad("%q is not an Ethernet MAC address", v)
		case mac[0]&1 != 0:
			return nil, bad("%s is a group (multicast) address, not an interface's", mac)
		case mac.String() == "00:00:00:00:00:00":
			return nil, bad("%s is not an interface's address", mac)
		}
		return mac, nil
	}
	if v := conf.RuntimeConfig.Mac; v != "" {
		return check(v, func(format string, a ...any) error {
			return confError("runtimeConfig.mac: "+format, a...)
		})
	}
	if v := cniArg(cniArgs, "MAC"); v != "" {
		return check(v, func(format string, a ...any) error {
			return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS MAC: "+format, a...), "")
		})
	}
	return nil, nil
}

// clusterCIDRs are the configured clusterCIDRs, else the subnets of the
// pod's addresses as the IPAM result gives them.
func clusterCIDRs(conf *NetConf, res *current.Result) []netip.Prefix {
	if len(conf.clusterCIDRs) > 0 {
		return conf.clusterCIDRs
	}
	var out []netip.Prefix
	for _, ipc := range res.IPs {
		ones, _ := ipc.Address.Mask.Size()
		a, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		if a.Is4() && ones > 32 {
			ones -= 96
		}
		out = append(out, netip.PrefixFrom(a, ones).Masked())
	}
	return out
}
