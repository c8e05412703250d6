package inspect

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Every report renders through Write: tables aligned, blocks apart, the
// footer after a blank line; JSON is the value itself; an unknown format
// is an error naming it.
func TestWrite(t *testing.T) {
	r := &CTDump{
		Flows: []CTRow{{Kind: "nat", Protocol: "tcp", Client: "192.0.2.9:4000", Dialled: "192.0.2.1:80", Pod: "10.0.0.2:8080", PodSees: "192.0.2.9:4000", Ifindex: 7,
			State: "established", IdleSecs: 2, ExpiresSecs: 3598}},
		Counters: map[string]uint64{"reply": 2, "ct_new": 1},
	}
	var b bytes.Buffer
	if err := Write(&b, r, "table"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	want := []string{
		"KIND  PROTO  CLIENT          DIALLED       POD            POD SEES        IFINDEX  INTERFACE  STATE                                     AGE",
		"nat   tcp    192.0.2.9:4000  192.0.2.1:80  10.0.0.2:8080  192.0.2.9:4000  7        -          established (idle 2s, expires in 59m58s)  -",
		"",
		"1 entries; counters: ct_new=1 reply=2",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), strings.Join(want, "\n"))
	}

	b.Reset()
	if err := Write(&b, r, "json"); err != nil {
		t.Fatal(err)
	}
	var back CTDump
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back.Flows) != 1 || back.Counters["reply"] != 2 {
		t.Errorf("json round trip: %v %+v\n%s", err, back, b.String())
	}

	st := &StatusReport{Healthy: true, Version: "v", PinDir: "/p", MapLayout: 1, Sizing: &maps.Sizing{MaxPods: 110, HostPortsPerPod: 32},
		Maps: []maps.Usage{
			{Name: "cni_links", Type: "Hash", Entries: 2, MaxEntries: 220, Memlock: 30 << 10},
			{Name: "cni_hp_stats", Type: "PerCPUArray", Entries: -1, MaxEntries: 8, Memlock: 504},
		},
		Memory:   MemorySummary{CPUs: 2, MemlockBytes: 30<<10 + 504, FullBytes: 3 << 20},
		Warnings: []string{"map cni_links is 95% full"}}
	b.Reset()
	if err := Write(&b, st, ""); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"datapath:   healthy\n", "sized for:  maxPods 110, maxHostPortsPerPod 32\n",
		"warning:    map cni_links is 95% full\n",
		"\n\nMAP           TYPE         ENTRIES  MAX  FILL  MEMLOCK\ncni_links     Hash         2        220  1%    30.0 KiB\ncni_hp_stats  PerCPUArray  -        8    -     0.5 KiB\n",
		"map memory (memlock): 30.5 KiB now, 3.0 MiB with every map full (2 possible CPUs)\n\nPROGRAM PIN", "node hooks: -\n"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("status lacks %q:\n%s", s, b.String())
		}
	}
	if err := Write(&b, st, "yaml"); err == nil || !strings.Contains(err.Error(), `"yaml"`) {
		t.Errorf("format yaml: %v", err)
	}
}
