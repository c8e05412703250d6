package events

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

func rec(seq uint64, typ, verdict, pod, proto string) Record {
	return Record{Seq: seq, Time: time.Unix(int64(seq), 0), Type: typ, Verdict: verdict, Pod: pod, Protocol: proto}
}

func TestFilter(t *testing.T) {
	r := Record{Type: "drop", Verdict: "dropped", Pod: "a/x", DstPod: "b/y", Protocol: "icmpv6", Time: time.Unix(100, 0)}
	for _, c := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Verdict: "dropped"}, true},
		{Filter{Verdict: "forwarded"}, false},
		{Filter{Pod: "a/x"}, true},
		{Filter{Pod: "b/y"}, true}, // either end
		{Filter{Pod: "c/z"}, false},
		{Filter{Protocol: "icmp"}, true}, // both ICMPs
		{Filter{Protocol: "icmpv6"}, true},
		{Filter{Protocol: "tcp"}, false},
		{Filter{Since: time.Unix(99, 0)}, true},
		{Filter{Since: time.Unix(101, 0)}, false},
	} {
		if got := c.f.Match(&r); got != c.want {
			t.Errorf("%+v matches %v, want %v", c.f, got, c.want)
		}
	}
	for _, bad := range []Filter{{Verdict: "DROP"}, {Pod: "noslash"}, {Protocol: "http"}} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
	if (Filter{Protocol: "47"}).Validate() != nil {
		t.Error("a protocol number is refused")
	}
}

// TestRingAndSubscribe: the ring keeps the last Keep records in order;
// Last filters; a subscriber gets what comes after its history, and one
// too slow loses records counted as slow, never blocking the reader.
func TestRingAndSubscribe(t *testing.T) {
	r := NewReader(Options{Keep: 3})
	push := r.add
	for i := 0; i < 5; i++ {
		push(rec(0, "drop", "dropped", "a/x", "udp"))
	}
	last := r.Last(Filter{}, 10)
	if len(last) != 3 || last[0].Seq != 3 || last[2].Seq != 5 {
		t.Fatalf("last: %+v", last)
	}
	if l := r.Last(Filter{}, 1); len(l) != 1 || l[0].Seq != 5 {
		t.Fatalf("last 1: %+v", l)
	}
	hist, sub := r.Subscribe(Filter{Verdict: "forwarded"}, 10)
	defer sub.Close()
	if len(hist) != 0 {
		t.Fatalf("history of forwarded: %+v", hist)
	}
	push(rec(0, "flow-start", "forwarded", "a/x", "tcp"))
	push(rec(0, "drop", "dropped", "a/x", "tcp"))
	if got := <-sub.C(); got.Seq != 6 {
		t.Fatalf("subscriber got %+v", got)
	}
	for i := 0; i < subscriberBuffer+10; i++ {
		push(rec(0, "flow-start", "forwarded", "a/x", "tcp"))
	}
	if sub.Slow() != 10 {
		t.Errorf("slow %d, want 10", sub.Slow())
	}
}

// TestRecordOutput: a decoded datapath event renders as one JSON line that
// parses back, and as a table row naming what matters.
func TestRecordOutput(t *testing.T) {
	e := maps.Event{TsNs: 5e9, Ifindex: 7, Len: 98, Type: uint8(maps.EventDrop), Dir: uint8(maps.DirEgress),
		Reason: uint8(maps.ReasonDropSpoofIP), Family: 2, Proto: 1, Sport: 8 << 8, Ethertype: 0x0008}
	copy(e.Saddr[:], []byte{10, 0, 0, 9})
	copy(e.Daddr[:], []byte{192, 0, 2, 1})
	r := newRecord(&e, time.Unix(0, 0), nil)
	if r.Verdict != "dropped" || r.Reason != "drop_spoof_ip" || r.Src != "10.0.0.9" || r.Dst != "192.0.2.1" || r.Protocol != "icmp" || r.SrcPort != 8 {
		t.Fatalf("record %+v", r)
	}
	var b bytes.Buffer
	if err := WriteJSON(&b, &r); err != nil {
		t.Fatal(err)
	}
	if strings.Count(b.String(), "\n") != 1 {
		t.Errorf("not one line: %q", b.String())
	}
	var back Record
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Reason != r.Reason || !back.Time.Equal(r.Time) {
		t.Errorf("round trip: %+v %v", back, err)
	}
	b.Reset()
	WriteRow(&b, &r)
	for _, want := range []string{"DROPPED", "drop_spoof_ip", "egress", "if7", "icmp", "10.0.0.9", "type 8 code 0"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("row %q lacks %q", b.String(), want)
		}
	}
	b.Reset()
	WriteRow(&b, &Record{Type: "lost", Lost: &Losses{RateLimited: 3}})
	if !strings.Contains(b.String(), "LOST") || !strings.Contains(b.String(), "3 events over the rate limit") {
		t.Errorf("lost row %q", b.String())
	}
}

// TestMetricsBound: past MaxPodSeries pods, events count under _other.
func TestMetricsBound(t *testing.T) {
	m := newMetricSet(2)
	for _, p := range []string{"a/1", "a/2", "a/3", "a/1", ""} {
		m.count(&Record{Type: "drop", Pod: p, Direction: "egress", Reason: "drop_proto"})
	}
	if len(m.pods) != 2 || m.over != 1 || m.drops[dropKey{OtherPod, "egress", "drop_proto"}] != 1 || m.drops[dropKey{"a/1", "egress", "drop_proto"}] != 2 || m.drops[dropKey{"", "egress", "drop_proto"}] != 1 {
		t.Errorf("pods %v over %v drops %v", m.pods, m.over, m.drops)
	}
	m.prune(map[string]bool{"a/2": true})
	if len(m.pods) != 1 || m.drops[dropKey{"a/1", "egress", "drop_proto"}] != 0 {
		t.Errorf("after prune: pods %v drops %v", m.pods, m.drops)
	}
}
