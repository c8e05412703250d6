package cni

import (
	"errors"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
)

// del is the CNI DEL verb: best effort and idempotent. It needs neither the
// netns nor the veth to exist, and succeeds when called again. As ADD it
// passes the endpoint the IPAM plugin's call; the endpoint claims the
// attachment (waiting for an ADD of it still at work) and tears it down
// while the IPAM reservation is released.
func del(args *skel.CmdArgs) error {
	tr := endpoint.NewTracer()
	defer tr.Done("DEL")
	defer warmExec()() // started before the IPAM plugin's exec
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	var release func() error
	if conf.IPAM.Type != "" {
		release = func() error {
			err := ipamDel(conf.IPAM.Type, args.StdinData)
			if err != nil && argsRefused(err) && ipamDelWithoutArgs(conf.IPAM.Type, args.StdinData, args) == nil {
				return nil
			}
			if err != nil {
				return endpoint.IPAMError(conf.IPAM.Type, err)
			}
			return nil
		}
	}
	id := endpoint.ID{ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns, Args: args.Args}
	return endpoint.Delete(conf.net, id, release, tr)
}

// argsRefused tells whether the IPAM plugin refused DEL's CNI_ARGS as the
// CNI library's types.LoadArgs does ("ARGS: unknown args", "ARGS: invalid
// pair"...). DEL failing on it failed every retry, the attachment never
// deleted (names31); DEL then asks again without CNI_ARGS, which releases
// what an ADD with other, accepted, arguments reserved (and is nothing
// when the ADD's were the same, refused before reserving anything).
func argsRefused(err error) bool {
	var te *types.Error
	return errors.As(err, &te) && strings.HasPrefix(te.Msg, "ARGS: ")
}
