package cni

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// undo is a stack of cleanups run when ADD fails part way.
type undo []func()

func (u *undo) push(f func()) { *u = append(*u, f) }
func (u *undo) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
}

func openNetns(path string) (ns.NetNS, error) {
	netns, err := ns.GetNS(path)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_NETNS %q: cannot open network namespace: %v", path, err), "")
	}
	return netns, nil
}

// ipamError keeps the IPAM plugin's error code and says who failed.
func ipamError(plugin string, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		return types.NewError(te.Code, fmt.Sprintf("ipam plugin %q: %s", plugin, te.Msg), te.Details)
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
	netns, err := openNetns(args.Netns)
	if err != nil {
		return err
	}
	defer netns.Close()

	tr.mark("parse")
	dp, err := ensureDatapath(conf)
	if err != nil {
		return err
	}
	defer dp.Close()
	tr.mark("datapath")

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

	var u undo
	defer func() {
		if err != nil {
			u.run()
		}
	}()

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
	u.push(func() {
		// Also on failure: the IPAM plugin may have reserved before failing.
		_ = ipam.ExecDel(conf.IPAM.Type, args.StdinData)
	})

	hostIf := HostIfName(args.ContainerID, args.IfName)
	p := &plan{hostIf: hostIf, ifname: args.IfName, mtu: conf.MTU}
	if p.hostMAC, err = randomMAC(); err == nil {
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
		u.push(func() {
			_ = deleteLink(hostIf)
			_ = datapath.RemoveLinkPins(conf.PinDir, hostIf)
			_ = dp.Maps.DeleteLink(idx)
			_ = dp.Maps.DeleteLimits(idx)
			_ = dp.Maps.ResetStats(idx)
			_, _ = dp.Maps.DeleteStackFlowsOf(idx)
		})
		tr.mark("veth")
		_, vethErr = dp.Attach(hostLink.Attrs().Index, hostIf, conf.attachMode)
		tr.mark("attach")
	}
	out := <-ipamCh
	tr.mark("ipam-wait")
	if out.err != nil {
		return ipamError(conf.IPAM.Type, out.err)
	}
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
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	// Limits before the endpoint entries whose flags point at them. Validated
	// already; the undo of the veth removes them.
	lim, _ := parseBandwidth(conf.RuntimeConfig.Bandwidth)
	if err := lim.install(dp.Maps, ifindex); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
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
			return types.NewError(types.ErrInternal, err.Error(), "")
		}
		info.Flags |= maps.EndpointFlagMasq
		tr.mark("masq")
	}
	for _, ipc := range res.IPs {
		ip := ipc.Address.IP
		if err := dp.Maps.PutEndpoint(ip, info); err != nil {
			return types.NewError(types.ErrInternal, err.Error(), "")
		}
		u.push(func() { _ = dp.Maps.DeleteEndpoint(ip, ifindex) })
	}
	tr.mark("maps")

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
			u.push(func() { _ = dp.Maps.DeleteHostPort(h) })
		}
		tr.mark("hostports")
	}

	if err := configureHost(full, hostLink); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	if err := configurePod(full, netns); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	// Every pod's netns is registered, so the sock_ops hook can pace its TCP
	// towards rate-limited pods; the hook itself goes on with the first limit.
	var egressBps uint64
	if lim.egress != nil {
		egressBps = lim.egress.RateBps
	}
	if err := dp.Maps.PutNetns(full.netnsCookie, egressBps, 0); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	cookie := full.netnsCookie
	u.push(func() { _ = dp.Maps.DeleteNetns(cookie) })
	if lim.egress != nil || lim.ingress != nil {
		if err := dp.EnsurePacing(conf.CgroupRoot); err != nil {
			return types.NewError(types.ErrInternal, fmt.Sprintf("bandwidth: %v", err), "")
		}
	}

	tr.mark("netlink")
	rec := &Record{
		ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
		HostIf: hostIf, HostIfindex: ifindex, HostMAC: full.hostMAC.String(), PodMAC: full.podMAC.String(),
		NetnsCookie: full.netnsCookie,
	}
	for _, ipc := range res.IPs {
		rec.IPs = append(rec.IPs, ipc.Address.IP.String())
	}
	if len(hps) > 0 {
		rec.HostPorts = recordHostPorts(hps)
	}
	rec.Masq = conf.IPMasq
	rec.PodNamespace, rec.PodName = podIdentity(args.Args)
	if err := writeRecord(conf.StateDir, conf.Name, rec); err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
	u.push(func() { _ = removeRecord(conf.StateDir, conf.Name, args.ContainerID, args.IfName) })

	return types.PrintResult(buildResult(conf, res, full, args), conf.CNIVersion)
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
	for _, rt := range p.routes {
		r.Routes = append(r.Routes, &types.Route{Dst: *rt.dst, GW: rt.gw})
	}
	return r
}

// podIdentity pulls K8S_POD_NAMESPACE and K8S_POD_NAME out of CNI_ARGS.
func podIdentity(cniArgs string) (namespace, name string) {
	for _, kv := range strings.Split(cniArgs, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			namespace = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	return namespace, name
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
