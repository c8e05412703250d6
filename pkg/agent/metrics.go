package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// collector reads the pinned maps at every scrape: the kernel keeps the
// counters, the agent keeps no copy that could drift.
type collector struct {
	pinRoot, stateDir, version string

	packets, bytes, endpoints, healthy, info *prometheus.Desc

	mapEntries, mapMax, mapFill, mapMemlock, memFull *prometheus.Desc

	masqOverlap *prometheus.Desc

	mu          sync.Mutex
	removed     map[string]float64 // reconcile removals by kind, since start
	removedDesc *prometheus.Desc
}

func newCollector(pinRoot, stateDir, version string) *collector {
	labels := []string{"interface", "pod", "container", "direction", "reason"}
	return &collector{
		pinRoot: pinRoot, stateDir: stateDir, version: version,
		packets:     prometheus.NewDesc("ebpf_cni_packets_total", "Packets seen by the host-veth programs, by pod, direction (from the pod's view) and reason; reasons starting with drop_ were dropped.", labels, nil),
		bytes:       prometheus.NewDesc("ebpf_cni_bytes_total", "Bytes seen by the host-veth programs, labelled as ebpf_cni_packets_total.", labels, nil),
		endpoints:   prometheus.NewDesc("ebpf_cni_endpoints", "Pod IPs in the endpoints map.", nil, nil),
		healthy:     prometheus.NewDesc("ebpf_cni_datapath_healthy", "1 when the pinned datapath is usable and has no defunct attachments.", nil, nil),
		info:        prometheus.NewDesc("ebpf_cni_agent_info", "Agent build.", []string{"version"}, nil),
		removedDesc: prometheus.NewDesc("ebpf_cni_reconcile_removed_total", "Stale state removed by reconciliation, by kind.", []string{"kind"}, nil),
		mapEntries:  prometheus.NewDesc("ebpf_cni_map_entries", "Entries in use in each pinned map (hash maps and the LPM trie; arrays are always full and not reported).", []string{"map"}, nil),
		mapMax:      prometheus.NewDesc("ebpf_cni_map_max_entries", "Capacity of each pinned map.", []string{"map"}, nil),
		mapFill:     prometheus.NewDesc("ebpf_cni_map_fill_ratio", "Entries over capacity of each pinned map (0-1); status warns above 0.9.", []string{"map"}, nil),
		mapMemlock:  prometheus.NewDesc("ebpf_cni_map_memlock_bytes", "Kernel memory of each pinned map as the kernel accounts it (fdinfo memlock).", []string{"map"}, nil),
		memFull:     prometheus.NewDesc("ebpf_cni_maps_memlock_full_bytes", "Kernel memory all maps would take with every map full, on this node's CPUs.", nil, nil),
		masqOverlap: prometheus.NewDesc("ebpf_cni_masq_ephemeral_overlap_ports", "Masquerade ports the node's kernel may also pick for its own connections (in ip_local_port_range, not in ip_local_reserved_ports); status warns above 0. Absent without ipMasq.", nil, nil),
		removed:     map[string]float64{},
	}
}

func (c *collector) addRemoved(st []Stale) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range st {
		c.removed[s.Kind]++
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.bytes, c.endpoints, c.healthy, c.info, c.removedDesc,
		c.mapEntries, c.mapMax, c.mapFill, c.mapMemlock, c.memFull, c.masqOverlap} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, c.version)
	src := inspect.Source{PinDir: c.pinRoot, StateDir: c.stateDir}
	st := inspect.Status(src, c.version)
	h := 0.0
	if st.Healthy {
		h = 1
	}
	ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, h)
	for _, u := range st.Maps {
		ch <- prometheus.MustNewConstMetric(c.mapMax, prometheus.GaugeValue, float64(u.MaxEntries), u.Name)
		ch <- prometheus.MustNewConstMetric(c.mapMemlock, prometheus.GaugeValue, float64(u.Memlock), u.Name)
		if u.Entries >= 0 {
			ch <- prometheus.MustNewConstMetric(c.mapEntries, prometheus.GaugeValue, float64(u.Entries), u.Name)
			ch <- prometheus.MustNewConstMetric(c.mapFill, prometheus.GaugeValue, u.Fill(), u.Name)
		}
	}
	if st.Masq != nil {
		ch <- prometheus.MustNewConstMetric(c.masqOverlap, prometheus.GaugeValue, float64(st.Masq.Overlap))
	}
	if st.Memory.CPUs > 0 {
		ch <- prometheus.MustNewConstMetric(c.memFull, prometheus.GaugeValue, float64(st.Memory.FullBytes))
	}
	c.mu.Lock()
	for k, v := range c.removed {
		ch <- prometheus.MustNewConstMetric(c.removedDesc, prometheus.CounterValue, v, k)
	}
	c.mu.Unlock()

	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return
	}
	defer m.Close()
	if eps, err := m.Endpoints().List(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.endpoints, prometheus.GaugeValue, float64(len(eps)))
	}
	all, err := m.Stats().All()
	if err != nil {
		return
	}
	names := inspect.NewNames(src.StateDir)
	for idx, cs := range all {
		name := names.Interface(int(idx))
		container, pod := names.Pod(int(idx))
		for k, v := range cs {
			lv := []string{name, pod, container, k.Dir.String(), k.Reason.String()}
			ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(v.Packets), lv...)
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(v.Bytes), lv...)
		}
	}
}

// metricsServer serves the collector on its listener until ctx ends.
type metricsServer struct {
	ln  net.Listener
	srv *http.Server
}

// newMetricsServer listens now, so a taken address fails the agent's start.
func newMetricsServer(addr string, c *collector, more ...prometheus.Collector) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsHandler(c, more...))
	return &metricsServer{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}, nil
}

func (m *metricsServer) Run(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		m.srv.Close()
	}()
	if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// metricsHandler serves the collector on its own registry (no Go runtime
// noise unless asked for: operators scrape the datapath).
func metricsHandler(c *collector, more ...prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	reg.MustRegister(more...)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
