// Package events follows the datapath's events (bpf/lib/events.h): the
// agent's Reader reads the ring buffer, names pods from the attachment
// records, keeps the last events in memory, counts them for metrics and
// serves them on a unix socket; `ebpf-agent observe` is its client.
package events

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Record is one event as observe shows it: the datapath's record with the
// pods named.
type Record struct {
	Seq       uint64    `json:"seq"` // the agent's count of events, from 1 at its start
	Time      time.Time `json:"time"`
	Type      string    `json:"type"`    // drop, flow-start, flow-end, trace
	Verdict   string    `json:"verdict"` // dropped, forwarded
	Reason    string    `json:"reason"`  // the counter's reason: drop_spoof_ip, forward, redirect, ...
	Direction string    `json:"direction"`
	// The endpoint whose host veth saw the packet.
	Pod       string `json:"pod,omitempty"` // namespace/name
	Container string `json:"container,omitempty"`
	Interface string `json:"interface,omitempty"`
	Ifindex   uint32 `json:"ifindex"`

	Family   string `json:"family,omitempty"`   // ipv4, ipv6; empty when not IP
	Protocol string `json:"protocol,omitempty"` // tcp, udp, icmp, icmpv6, sctp, a number, or the ethertype when not IP
	Src      string `json:"src,omitempty"`
	Dst      string `json:"dst,omitempty"`
	SrcPort  uint16 `json:"srcPort,omitempty"` // ICMP: the type
	DstPort  uint16 `json:"dstPort,omitempty"` // ICMP: the code
	SrcPod   string `json:"srcPod,omitempty"`  // when the address is a pod's of this node
	DstPod   string `json:"dstPod,omitempty"`
	TCPFlags string `json:"tcpFlags,omitempty"`
	Length   uint32 `json:"length,omitempty"`
	Policy   uint32 `json:"policy,omitempty"` // a policy drop's rule
	// Trace events: the program that decided, and the map entry it used
	// (a redirect's other endpoint's ifindex, a policy drop's rule).
	Program   string `json:"program,omitempty"`
	Entry     uint32 `json:"entry,omitempty"`
	IdleEnded bool   `json:"idleEnded,omitempty"`
	// Type "lost": events lost since the previous report, never filtered.
	Lost *Losses `json:"lost,omitempty"`
}

// protoName names an IP protocol number.
func protoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

func tcpFlags(f uint8) string {
	var out []string
	for i, n := range []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"} {
		if f&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return strings.Join(out, "|")
}

// newRecord turns a datapath event into a Record, naming what names can.
func newRecord(e *maps.Event, boot time.Time, n *names) Record {
	r := Record{
		Time:      e.Time(boot),
		Type:      e.Kind().String(),
		Reason:    e.Why().String(),
		Direction: e.Direction().String(),
		Ifindex:   e.Ifindex,
		Length:    e.Len,
		Policy:    e.Aux,
		Verdict:   "forwarded",
	}
	switch e.Kind() {
	case maps.EventDrop:
		r.Verdict = "dropped"
	case maps.EventTrace:
		r.Program, r.Entry = e.TraceProgram()
		r.Policy = 0
		if e.Why().IsDrop() {
			r.Verdict = "dropped"
		}
		if e.Why() == maps.ReasonDropPolicy {
			r.Policy = r.Entry
		}
	}
	if n != nil {
		r.Pod, r.Container, r.Interface = n.endpoint(e.Ifindex)
	}
	switch e.Family {
	case 2, 10:
		r.Family = "ipv4"
		if e.Family == 10 {
			r.Family = "ipv6"
		}
		r.Protocol = protoName(e.Proto)
		r.Src, r.Dst = e.Src().String(), e.Dst().String()
		r.SrcPort, r.DstPort = e.SrcPort(), e.DstPort()
		if e.Proto == 6 {
			r.TCPFlags = tcpFlags(e.TcpFlags)
		}
		if n != nil {
			r.SrcPod, r.DstPod = n.podOf(e.Src()), n.podOf(e.Dst())
		}
	default:
		if et := e.EtherType(); et != 0 {
			r.Protocol = fmt.Sprintf("ethertype 0x%04x", et)
			if et == 0x0806 {
				r.Protocol = "arp"
			}
		}
	}
	if e.Kind() == maps.EventFlowEnd && e.TcpFlags == 0 {
		r.IdleEnded = true
	}
	return r
}

// Filter selects records; the zero Filter selects all.
type Filter struct {
	Pod      string    // namespace/name: the endpoint's pod, or the pod at either end
	Verdict  string    // dropped, forwarded
	Protocol string    // tcp, udp, icmp (v4 and v6), sctp, arp, or a number
	Since    time.Time // records at or after
}

// Validate checks the filter's words.
func (f Filter) Validate() error {
	switch f.Verdict {
	case "", "dropped", "forwarded":
	default:
		return fmt.Errorf("--verdict %q: want dropped or forwarded", f.Verdict)
	}
	if f.Pod != "" && strings.Count(f.Pod, "/") != 1 {
		return fmt.Errorf("--pod %q: want namespace/name", f.Pod)
	}
	switch p := strings.ToLower(f.Protocol); p {
	case "", "tcp", "udp", "icmp", "icmpv6", "sctp", "arp":
	default:
		if _, err := strconv.ParseUint(p, 10, 8); err != nil {
			return fmt.Errorf("--protocol %q: want tcp, udp, icmp, icmpv6, sctp, arp or an IP protocol number", f.Protocol)
		}
	}
	return nil
}

// Match tells whether r passes the filter.
func (f Filter) Match(r *Record) bool {
	if f.Verdict != "" && r.Verdict != f.Verdict {
		return false
	}
	if f.Pod != "" && r.Pod != f.Pod && r.SrcPod != f.Pod && r.DstPod != f.Pod {
		return false
	}
	if p := strings.ToLower(f.Protocol); p != "" && r.Protocol != p && !(p == "icmp" && r.Protocol == "icmpv6") {
		return false
	}
	if !f.Since.IsZero() && r.Time.Before(f.Since) {
		return false
	}
	return true
}

// WriteJSON writes r as one line of JSON.
func WriteJSON(w io.Writer, r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteJSONValue writes v as one line of JSON.
func WriteJSONValue(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

// TableHeader is the header line of WriteRow's table.
const TableHeader = "TIME          VERDICT    REASON                 DIR      POD                          PROTO   SOURCE                                  DESTINATION                             DETAIL"

// WriteRow writes r as one line of the readable table.
func WriteRow(w io.Writer, r *Record) error {
	if r.Lost != nil {
		_, err := fmt.Fprintf(w, "%-13s LOST       %d events over the rate limit, %d with the ring full (node-wide); %d this observer was too slow for\n",
			r.Time.Format("15:04:05.000"), r.Lost.RateLimited, r.Lost.RingFull, r.Lost.SlowObserver)
		return err
	}
	pod := r.Pod
	if pod == "" {
		pod = r.Interface
		if pod == "" {
			pod = "if" + strconv.Itoa(int(r.Ifindex))
		}
	}
	verdict := strings.ToUpper(r.Verdict)
	switch r.Type {
	case "flow-start":
		verdict = "FLOW-START"
	case "flow-end":
		verdict = "FLOW-END"
	case "trace":
		verdict = "TRACE"
	}
	detail := ""
	switch {
	case r.TCPFlags != "":
		detail = r.TCPFlags
	case r.Protocol == "icmp" || r.Protocol == "icmpv6":
		detail = fmt.Sprintf("type %d code %d", r.SrcPort, r.DstPort)
	}
	if r.IdleEnded {
		detail = strings.TrimSpace(detail + " idle")
	}
	if r.Policy != 0 {
		detail = strings.TrimSpace(fmt.Sprintf("%s policy %d", detail, r.Policy))
	}
	if r.Program != "" {
		detail = strings.TrimSpace(fmt.Sprintf("%s %s", r.Program, detail))
		if r.Entry != 0 && r.Policy == 0 {
			detail += fmt.Sprintf(" entry %d", r.Entry)
		}
	}
	_, err := fmt.Fprintf(w, "%-13s %-10s %-22s %-8s %-28s %-7s %-39s %-39s %s\n",
		r.Time.Format("15:04:05.000"), verdict, r.Reason, r.Direction, pod, dash(r.Protocol),
		end(r.Src, r.SrcPort, r.SrcPod, r.Protocol), end(r.Dst, r.DstPort, r.DstPod, r.Protocol), detail)
	return err
}

func end(addr string, port uint16, pod, proto string) string {
	if addr == "" {
		return "-"
	}
	s := addr
	if port != 0 && proto != "icmp" && proto != "icmpv6" {
		if strings.Contains(addr, ":") {
			s = "[" + addr + "]"
		}
		s += ":" + strconv.Itoa(int(port))
	}
	if pod != "" {
		s += " (" + pod + ")"
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
