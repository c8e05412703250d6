package cni

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
)

// check is the CNI CHECK verb: the interfaces, addresses, routes, attached
// programs and map entries must match prevResult. The error names the first
// thing that does not.
func check(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.IPAM.Type == "" {
		return endpoint.ConfError("ipam: missing")
	}
	if err := conf.validateFeatures(); err != nil {
		return err
	}
	prev, err := conf.prevResult()
	if err != nil {
		return err
	}
	if err := ipamCheck(conf.IPAM.Type, args.StdinData); err != nil {
		return endpoint.IPAMError(conf.IPAM.Type, err)
	}
	id := endpoint.ID{ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns, Args: args.Args}
	return endpoint.Check(conf.net, id, prev, conf.features)
}
