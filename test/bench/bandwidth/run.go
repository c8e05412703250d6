package bandwidth

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// run measures every rate and direction for every configuration. Rates are
// the outer loop and the configuration order alternates, so drift and
// background load hit both alike.
func (b *bench) run(ctx context.Context) error {
	start := time.Now()
	// Namespaces deleted just before (by an earlier benchmark) are torn down
	// by kernel threads for a while: let that finish first.
	waited, calm := testenv.WaitCalm(ctx, 30*time.Second)
	b.res.Calm = fmt.Sprintf("waited %s for no other runnable task before measuring", waited.Round(100*time.Millisecond))
	if !calm {
		b.res.Calm = fmt.Sprintf("the machine was still busy after waiting %s", waited.Round(100*time.Millisecond))
	}
	logf("%s", b.res.Calm)
	for _, c := range b.configs {
		p, err := b.addPod(c, "peer", "")
		if p != nil {
			c.peer = p
		}
		if err != nil {
			return err
		}
		logf("%s: peer pod %s (unlimited)", c.label, p.ip)
	}
	for i, rateMb := range b.opts.ratesMb {
		rate := rateMb * 1_000_000
		for j := range b.configs {
			c := b.configs[(i+j)%len(b.configs)]
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := b.measureRate(ctx, c, rate); err != nil {
				return fmt.Errorf("%s at %d Mbit/s: %w", c.label, rateMb, err)
			}
		}
	}
	for _, c := range b.configs {
		if err := b.delPod(c, c.peer, ""); err != nil {
			return err
		}
		c.peer = nil
		l, err := b.leftovers(c)
		if err != nil {
			return err
		}
		if len(l) > 0 {
			return fmt.Errorf("%s left state behind after DEL:\n  %s", c.label, strings.Join(l, "\n  "))
		}
	}
	b.res.Elapsed = time.Since(start).Round(time.Second).String()
	logf("measurements done in %s", b.res.Elapsed)
	return b.res.write(b.opts.outDir)
}

// directions: egress = the limited pod sends to the peer pod; ingress = the
// peer pod sends to it (same node, paced); remote = the remote host sends to
// it through the node's uplink (not paced: issue 15).
var directions = []string{"egress", "ingress", "remote"}

// measureRate adds a pod limited to rate in both directions, measures idle
// latency, then both directions under load, and deletes the pod.
func (b *bench) measureRate(ctx context.Context, c *config, rate uint64) error {
	args := capArgs(rate)
	name := fmt.Sprintf("limited-%dM", rate/1_000_000)
	limited, err := b.addPod(c, name, args)
	if err != nil {
		if limited != nil {
			_ = b.delPod(c, limited, args)
		}
		return err
	}
	err = b.measurePod(ctx, c, limited, rate)
	if derr := b.delPod(c, limited, args); err == nil {
		err = derr
	}
	return err
}

func (b *bench) measurePod(ctx context.Context, c *config, limited *pod, rate uint64) error {
	info, err := b.limiterInfo(c, limited, rate)
	if err != nil {
		return err
	}
	b.res.addLimiter(c.key, rate, info)
	logf("%s %d Mbit/s: pod %s; %s", c.label, rate/1_000_000, limited.ip, info)
	idle, err := b.ping(ctx, c.peer, limited.ip, b.opts.idlePings)
	if err != nil {
		return fmt.Errorf("idle ping: %w", err)
	}
	if idle.Received == 0 {
		return fmt.Errorf("idle ping: no reply from %s", limited.ip)
	}
	idleRemote, err := b.ping(ctx, c.remote, limited.ip, b.opts.idlePings)
	if err != nil {
		return fmt.Errorf("idle ping from the remote host: %w", err)
	}
	if idleRemote.Received == 0 {
		return fmt.Errorf("idle ping: no reply from %s to the remote host", limited.ip)
	}
	for _, dir := range directions {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := b.measure(ctx, c, limited, rate, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		r.PingIdle = idle
		if dir == "remote" {
			r.PingIdle = idleRemote
		}
		b.res.Runs = append(b.res.Runs, r)
		logf("  %-13s %4d Mbit/s %-7s %s", c.label, rate/1_000_000, dir, r.summary())
	}
	return nil
}
