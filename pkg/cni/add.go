package cni

import (
	"encoding/json"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
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
	defer warmExec()() // started before the IPAM plugin's exec
	warmJSON()
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := endpoint.CheckNames(conf.Name, args.IfName); err != nil {
		return err
	}
	if err := endpoint.CheckArgs(args.Args); err != nil {
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

// warmJSON builds, in the background, encoding/json's caches of the types
// an ADD encodes and decodes after parsing its configuration: the record
// (the claim, before the IPAM plugin starts), the IPAM plugin's result
// (decoded when it answers) and ours (printed last). A process's first use
// of a type reflects over all its fields, nested types included: a
// throwaway program (40 runs each, load 11) measured the record's first
// encoding at 214-296 µs cold and 13-14 µs warmed, the result's decoding
// 86-124 against 42-47, its indented encoding 68-110 against 21-25 (issue
// 30, docs/performance.md round 18). Started at the top of ADD, it runs on
// the other CPU while the configuration is parsed and the netns opened.
// json's caches are safe for concurrent use: a type the ADD asks for while
// this goroutine builds it is at worst built twice, as slow as unwarmed.
func warmJSON() {
	go func() {
		_, _ = json.Marshal(&state.Record{})
		_, _ = json.Marshal(&current.Result{})
	}()
}
