package cni

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ipam"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
)

// Add is the CNI ADD verb: IPAM runs in its own process while the endpoint
// creates and attaches the veth; then the features install their part, the
// endpoint publishes the attachment and its record is written. A failure
// undoes everything this ADD made (the IPAM reservation only if this ADD's
// IPAM call made it) and is a CNI error naming the cause.
func Add(args *skel.CmdArgs) (err error) {
	tr := endpoint.NewTracer()
	defer tr.Done("ADD")
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := validateIPAM(args.StdinData, conf.IPAM.Type, conf.net.MTU); err != nil {
		return err
	}
	if err := conf.validateFeatures(); err != nil {
		return err
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
	vethErr := a.CreateVeth(podMAC)
	out := <-ipamCh
	tr.Mark("ipam-wait")
	if out.err != nil {
		// Not undone: only this ADD's own reservation may be released, and
		// a failed IPAM ADD made none (the runtime's DEL covers a plugin
		// that reserved and then failed).
		return endpoint.IPAMError(conf.IPAM.Type, out.err)
	}
	a.OnUndo(func() error { return ipam.ExecDel(conf.IPAM.Type, args.StdinData) })
	endpoint.Crashpoint("ipam")
	if vethErr != nil {
		return vethErr
	}
	if err := a.Plan(conf.IPAM.Type, out.res); err != nil {
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
	return types.PrintResult(a.Result(conf.DNS), conf.CNIVersion)
}
