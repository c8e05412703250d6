package cni

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
)

// status is the CNI STATUS verb: error 50 when the datapath cannot be used.
func status(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := conf.net.CheckDirs(); err != nil {
		return err
	}
	if _, err := datapath.Forced(); err != nil {
		return endpoint.ConfError("%w", err)
	}
	if miss := datapath.MissingRequired(); len(miss) > 0 {
		return endpoint.Errorf(endpoint.ErrUnavailable, "the kernel lacks %s, which the datapath needs (docs/compat.md)", strings.Join(miss, ", "))
	}
	dp, err := datapath.Ensure(conf.net.PinDir, conf.net.Sizing())
	if err != nil {
		return endpoint.Errorf(endpoint.ErrUnavailable, "datapath at %s is not usable: %w", conf.net.PinDir, err)
	}
	dp.Close()
	// A successful STATUS prints nothing on stdout (CNI spec); the runtime
	// logs the plugin's stderr: which features are in use and which
	// fallbacks replace the others.
	fmt.Fprintln(os.Stderr, "ebpf-cni: "+datapath.FallbackSummary())
	if conf.IPAM.Type != "" {
		if err := invoke.DelegateStatus(context.TODO(), conf.IPAM.Type, args.StdinData, nil); err != nil {
			return endpoint.IPAMError(conf.IPAM.Type, err)
		}
	}
	return nil
}
