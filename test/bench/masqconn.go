package main

// New connections per second through masquerade, inside the hostport part
// (issue 30): the newest pod of 1, 200 and 1000 on the node dials a server
// outside the node (outside4, on the remote's lo, over the node's uplink):
// ebpf-cni ipMasq (BPF SNAT at the uplink's egress) beside ptp ipMasq
// (iptables MASQUERADE, one chain and POSTROUTING rule per pod) and the
// routed baseline's pod dialling the same server with no translation and
// no programs (hostport.go). The pods are cheap: they only exist, with
// their veths and map entries or rules.

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// masqPoint is one configuration at one population.
type masqPoint struct {
	Config        string    `json:"config"`
	Pods          int       `json:"pods"`
	ConnsPerSec   float64   `json:"connsPerSec"`
	ConnErrors    int64     `json:"connErrors"`
	RoutedPerSec  float64   `json:"routedConnsPerSec"`
	VsRouted      float64   `json:"vsRouted"`
	ConnSamples   []float64 `json:"connsPerSecSamples"`
	RoutedSamples []float64 `json:"routedConnsPerSecSamples"`
	Load1         float64   `json:"load1"`
}

// masqConfigs are ptp with ipMasq and ebpf-cni with ipMasq, in that order.
func (b *bench) masqConfigs() []*config {
	ebpfNet := mustCIDR("10.236.0.0/16")
	ptpNet := mustCIDR("10.235.0.0/16")
	return []*config{
		{
			key: "ptp-masq", label: "ptp ipMasq (iptables)", netName: "bench-ptp-masq", subnet: ptpNet, hostPorts: true,
			list: map[string]any{"plugins": []any{map[string]any{"type": "ptp", "ipMasq": true, "ipam": b.hostLocal(ptpNet)}}},
		},
		{
			key: "ebpf-masq", label: "ebpf-cni ipMasq", netName: "bench-ebpf-masq", subnet: ebpfNet, hostPorts: true,
			list: map[string]any{"plugins": []any{map[string]any{
				"type": "ebpf-cni", "pinDir": b.pinDir, "stateDir": b.state, "ipam": b.hostLocal(ebpfNet), "maxPods": b.maxPods(),
				"ipMasq": true, "clusterCIDRs": []string{ebpfNet.String()},
			}}},
		},
	}
}

func isMasqConfig(c *config) bool { return strings.HasSuffix(c.key, "-masq") }

// masqScale measures c's masquerade at every -masq-scale point.
func (b *bench) masqScale(ctx context.Context, c *config, base hpBase, d time.Duration, start time.Time) error {
	o := b.opts
	pop := &population{b: b, c: c, ctx: ctx, caps: func(int) string { return "" }}
	target := net.JoinHostPort(outside4.String(), "80")
	for _, p := range o.masqScale {
		if err := pop.grow(p); err != nil {
			return err
		}
		// The newest pod dials: ptp's rule for it is the last of POSTROUTING.
		pod := pop.newest().pod
		measure := func() (float64, int64, error) {
			rate, f, err := connRate(ctx, pod, target, o.workers, d)
			if err == nil && rate == 0 {
				err = fmt.Errorf("no connection from %s to %s succeeded (%d failed)", pod.Path(), target, f)
			}
			return rate, f, err
		}
		rates, bases, failed, err := alternate(measure, base.routedOut)
		if err != nil {
			return err
		}
		rate, routed := testenv.Median(rates), testenv.Median(bases[0])
		pt := masqPoint{Config: c.key, Pods: p, ConnsPerSec: rate, ConnErrors: failed, RoutedPerSec: routed, VsRouted: rate / routed,
			ConnSamples: rates, RoutedSamples: bases[0], Load1: testenv.Load1()}
		b.res.HostPort.Masq = append(b.res.HostPort.Masq, pt)
		logf("  masquerade %-22s %4d pods: %7.0f conn/s (routed, no masquerade %7.0f, %.2fx, %d failed), load %.2f (%s)",
			c.label, p, rate, routed, pt.VsRouted, failed, pt.Load1, time.Since(start).Round(time.Second))
	}
	return pop.removeAll()
}

// masqRows are the summary rows of the masquerade measurements.
func (r *results) masqRows() []testenv.Row {
	h := r.HostPort
	if h == nil {
		return nil
	}
	var rows []testenv.Row
	for _, cfg := range []string{"ebpf-masq", "ptp-masq"} {
		for _, pt := range h.Masq {
			if pt.Config != cfg {
				continue
			}
			row := testenv.NewRow("new connections/s via masquerade", r.labels[cfg], "conn/s",
				fmt.Sprintf("pod to outside, %s on the node, %d clients, %.0f s", plural(pt.Pods, "pod"), h.Workers, h.ConnSecs), "conn/s", pt.ConnSamples)
			row.Against("routed, no masquerade", testenv.Median(pt.RoutedSamples))
			row.Load = loadStr(pt.Load1)
			if cfg == "ebpf-masq" {
				row.Goal(fmt.Sprintf("≥ %.2f× routed", targetConnsRouted), row.Ratio >= targetConnsRouted)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// masqMarkdown renders the masquerade section of the report.
func (r *results) masqMarkdown() string {
	h := r.HostPort
	if h == nil || len(h.Masq) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## New connections through masquerade\n\n")
	fmt.Fprintf(&b, "New TCP connections per second from the newest pod of the node to a server outside it (%s:80 on the remote netns, over the node's uplink; dial, read 1 byte until the server's close, close; %d client goroutines, %d runs of %.0f s alternating with the routed baseline: a pod on a node netns of its own with no programs, dialling the same server by plain routing with no masquerade; medians).\n\n", outside4, h.Workers, connRounds, h.ConnSecs)
	fmt.Fprintf(&b, "| config | pods on the node | conn/s | routed conn/s | × routed | failed | load |\n|---|---:|---:|---:|---:|---:|---:|\n")
	pts := append([]masqPoint(nil), h.Masq...)
	sort.SliceStable(pts, func(i, j int) bool { return pts[i].Pods < pts[j].Pods })
	for _, p := range pts {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %.2f× | %d | %.1f |\n", r.labels[p.Config], p.Pods, p.ConnsPerSec, p.RoutedPerSec, p.VsRouted, p.ConnErrors, p.Load1)
	}
	return b.String()
}
