package events

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// OtherPod is the pod label of the events of pods beyond the metrics'
// bound (Options.MaxPodSeries).
const OtherPod = "_other"

// metricSet counts the records by pod for the metrics. Label cardinality
// is bounded: at most MaxPodSeries pods have series of their own (the
// first seen; a pod's series go when its attachment record does), the
// others are counted under namespace "" and pod OtherPod; events of an
// interface without a pod record have both labels "". Reasons and
// directions are the datapath's enums, so a metric has at most
// (MaxPodSeries+2) x reasons x 2 series.
type metricSet struct {
	max int

	mu    sync.Mutex
	drops map[dropKey]float64
	flows map[flowKey]float64
	pods  map[string]bool // pods with series of their own
	over  float64         // events counted under OtherPod
}

type dropKey struct{ pod, dir, reason string }
type flowKey struct{ pod, dir, typ string }

func newMetricSet(max int) *metricSet {
	return &metricSet{max: max, drops: map[dropKey]float64{}, flows: map[flowKey]float64{}, pods: map[string]bool{}}
}

func (m *metricSet) count(r *Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pod := r.Pod
	if pod != "" && !m.pods[pod] {
		if len(m.pods) < m.max {
			m.pods[pod] = true
		} else {
			pod = OtherPod
			m.over++
		}
	}
	switch r.Type {
	case "drop":
		m.drops[dropKey{pod, r.Direction, r.Reason}]++
	case "flow-start", "flow-end":
		m.flows[flowKey{pod, r.Direction, r.Type}]++
	} // a trace event is a packet counted already: no series of its own
}

// prune forgets the series of pods not in live.
func (m *metricSet) prune(live map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p := range m.pods {
		if live[p] {
			continue
		}
		delete(m.pods, p)
		for k := range m.drops {
			if k.pod == p {
				delete(m.drops, k)
			}
		}
		for k := range m.flows {
			if k.pod == p {
				delete(m.flows, k)
			}
		}
	}
}

func splitPod(p string) (ns, name string) {
	if p == OtherPod {
		return "", OtherPod
	}
	ns, name, _ = strings.Cut(p, "/")
	return ns, name
}

var (
	dropDesc = prometheus.NewDesc("ebpf_cni_drop_events_total",
		"Drop events read from the datapath, by the pod of the host veth (namespace, pod), direction and reason. At most MaxPodSeries pods have their own series; the others count under pod=\"_other\".",
		[]string{"namespace", "pod", "direction", "reason"}, nil)
	flowDesc = prometheus.NewDesc("ebpf_cni_flow_events_total",
		"Flow events (type flow-start or flow-end) read from the datapath, labelled as ebpf_cni_drop_events_total.",
		[]string{"namespace", "pod", "direction", "type"}, nil)
	lostDesc = prometheus.NewDesc("ebpf_cni_events_lost_total",
		"Events not delivered: rate_limited (over the per-CPU rate), ring_full (the ring buffer was full), slow_observer (an observe client fell behind).",
		[]string{"cause"}, nil)
	sentDesc = prometheus.NewDesc("ebpf_cni_events_sent_total", "Events the datapath wrote to the ring buffer.", nil, nil)
	overDesc = prometheus.NewDesc("ebpf_cni_events_pods_over_limit_total",
		"Events counted under pod=\"_other\" because MaxPodSeries pods had series already.", nil, nil)
)

// Describe implements prometheus.Collector.
func (r *Reader) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dropDesc, flowDesc, lostDesc, sentDesc, overDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (r *Reader) Collect(ch chan<- prometheus.Metric) {
	m := r.met
	m.mu.Lock()
	for k, v := range m.drops {
		ns, name := splitPod(k.pod)
		ch <- prometheus.MustNewConstMetric(dropDesc, prometheus.CounterValue, v, ns, name, k.dir, k.reason)
	}
	for k, v := range m.flows {
		ns, name := splitPod(k.pod)
		ch <- prometheus.MustNewConstMetric(flowDesc, prometheus.CounterValue, v, ns, name, k.dir, k.typ)
	}
	ch <- prometheus.MustNewConstMetric(overDesc, prometheus.CounterValue, m.over)
	m.mu.Unlock()
	select {
	case <-r.ready:
	default:
		return // not reading yet
	}
	st, err := r.Status()
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(sentDesc, prometheus.CounterValue, float64(st.Sent))
	ch <- prometheus.MustNewConstMetric(lostDesc, prometheus.CounterValue, float64(st.LostRate), "rate_limited")
	ch <- prometheus.MustNewConstMetric(lostDesc, prometheus.CounterValue, float64(st.LostRing), "ring_full")
	ch <- prometheus.MustNewConstMetric(lostDesc, prometheus.CounterValue, float64(st.SlowReaders), "slow_observer")
}
