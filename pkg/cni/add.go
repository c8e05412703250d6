package cni

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// add is the CNI ADD verb: once the attachment is claimed, IPAM runs in its
// own process while the endpoint opens the datapath and creates and
// attaches the veth; then the features install their part, the
// endpoint publishes the attachment and its record is written. A failure
// undoes everything this ADD made (the IPAM reservation only if this ADD's
// IPAM call made it) and is a CNI error naming the cause.
func add(args *skel.CmdArgs) (err error) {
	tr := endpoint.NewTracer()
	defer tr.Done("ADD")
	warmExec() // before the IPAM plugin's exec
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.net.IPv4Only, err = validateIPAM(args.StdinData, conf.IPAM.Type, conf.net.MTU); err != nil {
		return err
	}
	if err := conf.validateFeatures(); err != nil {
		return err
	}
	if err := checkChain(conf.Name, conf.CNIConfDir); err != nil {
		return err
	}
	if conf.net.AttachMode == string(datapath.AttachTCX) && !datapath.HaveTCX() {
		return endpoint.ConfError("attachMode: tcx links (Linux 6.6) are not available on this node (the kernel lacks them, or %s forces them off): use auto or tc", datapath.ForceFallbackEnv)
	}
	podMAC, err := endpoint.RequestedMAC(conf.RuntimeConfig.Mac, args.Args)
	if err != nil {
		return err
	}
	id := endpoint.ID{ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns, Args: args.Args}
	a, err := endpoint.Claim(conf.net, id, conf.features, tr)
	if err != nil {
		return err
	}
	defer a.Close()
	defer func() {
		if err != nil {
			a.Abort()
		}
	}()
	defer maps.RecoverPin(&err) // a bad pin found at first use: undone as any failure

	// IPAM runs in its own process and is the longest step: start it now,
	// and open the datapath and create and attach the veth meanwhile.
	a.StartIPAM(func() (types.Result, error) { return ipamAdd(conf.IPAM.Type, args.StdinData) },
		func() error { return ipamDel(conf.IPAM.Type, args.StdinData) })
	if err := a.OpenDatapath(); err != nil {
		return err
	}
	vethErr := a.CreateVeth(podMAC)
	res, ipamErr := a.WaitIPAM()
	if ipamErr != nil {
		return endpoint.IPAMError(conf.IPAM.Type, ipamErr)
	}
	endpoint.Crashpoint("ipam")
	if vethErr != nil {
		return vethErr
	}
	if err := a.Plan(conf.IPAM.Type, res); err != nil {
		return err
	}
	if err := a.Install(); err != nil {
		return err
	}
	if err := a.Publish(); err != nil {
		return err
	}
	if err := a.Commit(); err != nil {
		return err
	}
	tr.Mark("commit")
	return types.PrintResult(a.Result(conf.DNS), conf.CNIVersion)
}
