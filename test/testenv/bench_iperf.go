package testenv

import (
	"encoding/json"
	"fmt"
)

// IperfJSON is the part of iperf3 -J output the benchmarks read.
type IperfJSON struct {
	Intervals []struct {
		Sum IperfSum `json:"sum"`
	} `json:"intervals"`
	End struct {
		SumSent        IperfSum `json:"sum_sent"`
		SumReceived    IperfSum `json:"sum_received"`
		CPUUtilization struct {
			HostTotal   float64 `json:"host_total"`
			RemoteTotal float64 `json:"remote_total"`
		} `json:"cpu_utilization_percent"`
	} `json:"end"`
	Error string `json:"error"`
}

// IperfSum is one of iperf3's sums (an interval's or the whole run's).
type IperfSum struct {
	Start         float64 `json:"start"`
	End           float64 `json:"end"`
	Seconds       float64 `json:"seconds"`
	Bytes         uint64  `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Retransmits   *int64  `json:"retransmits"`
	Sender        bool    `json:"sender"`
}

// ParseIperf decodes iperf3 -J output; who names the process in errors.
func ParseIperf(out []byte, who string) (*IperfJSON, error) {
	var j IperfJSON
	if err := json.Unmarshal(out, &j); err != nil {
		return nil, fmt.Errorf("%s: output is not iperf3 JSON: %v\n%s", who, err, Tail(string(out)))
	}
	if j.Error != "" {
		return nil, fmt.Errorf("%s: iperf3 error: %s", who, j.Error)
	}
	return &j, nil
}
