// Package agent is the node agent: it owns the pinned datapath while running
// and answers the read-only inspection commands.
package agent

import (
	"context"
	"fmt"
	"log"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// Run makes sure bpffs and the pinned datapath exist, then stays up until ctx
// ends. Pins outlive it: stopping or restarting the agent leaves pods alone.
func Run(ctx context.Context, pinRoot string, logger *log.Logger, opts ...Option) error {
	var rc runConfig
	for _, o := range opts {
		o(&rc)
	}
	dp, err := datapath.Ensure(pinRoot)
	if err != nil {
		return fmt.Errorf("ensure datapath at %s: %w", pinRoot, err)
	}
	defer dp.Close()
	fi, _ := dp.FromContainer.Info()
	ti, _ := dp.ToContainer.Info()
	fid, _ := fi.ID()
	tid, _ := ti.ID()
	logger.Printf("datapath ready at %s (maps layout v%d, programs %s id %d, %s id %d)",
		pinRoot, mapsLayout(), fi.Name, fid, ti.Name, tid)
	if rc.hostPorts {
		runHostPorts(ctx, dp, &rc, logger)
	}
	<-ctx.Done()
	logger.Printf("stopping; pinned datapath stays in place")
	return nil
}
