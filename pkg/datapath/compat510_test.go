package datapath

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
)

// What the compat build may use on Linux 5.10: the release each helper,
// program type, attach type and map type first appeared in, from the
// kernel commits iovisor/bcc's docs/kernel-versions.md lists (reading, not
// a run on 5.10: docs/compat.md). A helper or type missing here fails
// TestCompatBuildFits510 until someone looks its release up.
var (
	helperSince = map[asm.BuiltinFunc]string{
		asm.FnMapLookupElem: "3.19", asm.FnMapUpdateElem: "3.19", asm.FnMapDeleteElem: "3.19",
		asm.FnKtimeGetNs: "4.1", asm.FnL3CsumReplace: "4.1", asm.FnL4CsumReplace: "4.1",
		asm.FnSkbStoreBytes: "4.1", asm.FnRedirect: "4.4", asm.FnSkbLoadBytes: "4.5",
		asm.FnCsumDiff: "4.6", asm.FnSkbChangeTail: "4.9", asm.FnGetSocketCookie: "4.12",
		asm.FnCsumUpdate: "4.9", // 36bbef52c7eb (a hostPort later IPv6 fragment, lib/pkt.h pkt_rewrite)
		asm.FnFibLookup:  "4.18", asm.FnSkLookupUdp: "4.20", asm.FnSkRelease: "4.20", asm.FnSpinLock: "5.1",
		asm.FnSpinUnlock: "5.1", asm.FnSkbEcnSetCe: "5.1", asm.FnSkcLookupTcp: "5.2",
		asm.FnJiffies64:      "5.5", // 5576b991e9c1; inlined by the verifier (the flow events' hot slots)
		asm.FnGetNetnsCookie: "5.7", // cgroup sock_addr only; sock_ops 5.15 (features.go)
		asm.FnRingbufReserve: "5.8", asm.FnRingbufSubmit: "5.8",
		// 5.10 with the nexthop parameters: ba452c9e996d reached the bpf
		// tree on 2020-10-22, before 5.10-rc1 ("before helper API is frozen").
		asm.FnRedirectNeigh: "5.10", asm.FnRedirectPeer: "5.10",
		asm.FnTimerInit: "5.15", asm.FnTimerSetCallback: "5.15", asm.FnTimerStart: "5.15",
		asm.FnTimerCancel: "5.15", asm.FnLoop: "5.17",
	}
	progTypeSince = map[ebpf.ProgramType]string{ebpf.SchedCLS: "4.1", ebpf.CGroupSockAddr: "4.17"}
	attachSince   = map[ebpf.AttachType]string{
		ebpf.AttachNone: "4.1", ebpf.AttachCGroupInet4Connect: "4.17", ebpf.AttachCGroupInet6Connect: "4.17",
		ebpf.AttachCGroupUDP4Sendmsg: "4.18", ebpf.AttachCGroupUDP6Sendmsg: "4.18",
		ebpf.AttachCGroupUDP4Recvmsg: "5.2", ebpf.AttachCGroupUDP6Recvmsg: "5.2",
		ebpf.AttachCgroupInet4GetPeername: "5.8", ebpf.AttachCgroupInet6GetPeername: "5.8",
	}
	mapSince = map[ebpf.MapType]string{
		ebpf.Hash: "3.19", ebpf.Array: "3.19", ebpf.PerCPUHash: "4.6", ebpf.PerCPUArray: "4.6",
		ebpf.LRUHash: "4.10", ebpf.LPMTrie: "4.11", ebpf.HashOfMaps: "4.12", ebpf.ArrayOfMaps: "4.12", ebpf.RingBuf: "5.8",
	}
)

// newerThan510 tells whether release v ("5.15") came after 5.10.
func newerThan510(v string) bool {
	maj, min, _ := strings.Cut(v, ".")
	a, _ := strconv.Atoi(maj)
	b, _ := strconv.Atoi(min)
	return a > 5 || a == 5 && b > 10
}

// TestCompatBuildFits510: every helper, program type, attach type, map type,
// instruction and BTF kind of the compat build is in Linux 5.10 (the floor
// docs/compat.md claims), so a change that brings in a newer one fails here,
// on any kernel, instead of at a 5.10 node's first load. It found bpf_loop
// (5.17) in tcp_syn_wscale, which the compat build called.
func TestCompatBuildFits510(t *testing.T) {
	var used []string
	for _, o := range []*object{objFromContainer, objToContainer, objFromUplink, objToUplink, objSock} {
		spec, err := o.compat.load()
		if err != nil {
			t.Fatal(err)
		}
		said := map[string]bool{}
		bad := func(format string, args ...any) {
			if m := fmt.Sprintf("%s: "+format, append([]any{o.compat.name}, args...)...); !said[m] {
				said[m] = true
				t.Error(m)
			}
		}
		for _, m := range spec.Maps {
			if v, ok := mapSince[m.Type]; !ok || newerThan510(v) {
				bad("map %s is a %v (since %q)", m.Name, m.Type, v)
			}
		}
		for _, p := range spec.Programs {
			if v, ok := progTypeSince[p.Type]; !ok || newerThan510(v) {
				bad("program %s is a %v (since %q)", p.Name, p.Type, v)
			}
			if v, ok := attachSince[p.AttachType]; !ok || newerThan510(v) {
				bad("program %s attaches as %v (since %q)", p.Name, p.AttachType, v)
			}
			for _, ins := range p.Instructions {
				op := ins.OpCode
				switch {
				case ins.IsBuiltinCall():
					fn := asm.BuiltinFunc(ins.Constant)
					v, ok := helperSince[fn]
					if !ok || newerThan510(v) {
						bad("program %s calls %v (since %q)", p.Name, fn, v)
					}
					used = append(used, fmt.Sprintf("%v %v (%s)", p.Type, fn, v))
				case ins.IsKfuncCall():
					bad("program %s calls a kfunc (5.13 at the earliest): %v", p.Name, ins)
				case op.Class().IsStore() && op.Mode() == asm.AtomicMode && ins.Constant != int64(asm.Add):
					// Only the plain add (BPF_XADD, 4.x): fetch and the other
					// atomics came in 5.12.
					bad("program %s uses atomic %#x (5.12): %v", p.Name, ins.Constant, ins)
				case op.Class().IsLoad() && op.Mode() == asm.MemSXMode,
					op.Class().IsALU() && ins.Offset != 0,
					op.Class() == asm.ALU64Class && op.ALUOp() == asm.Swap,
					op.Class() == asm.Jump32Class && op.JumpOp() == asm.Ja:
					bad("program %s uses a cpu v4 instruction (6.6): %v", p.Name, ins)
				}
			}
		}
		// cilium/ebpf rewrites decl/type tags and enum64 for kernels without
		// them (btf/marshal.go), not floats (5.13).
		if spec.Types != nil {
			for typ, err := range spec.Types.All() {
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := typ.(*btf.Float); ok {
					bad("BTF has a float (5.13): %v", typ)
				}
			}
		}
	}
	sort.Strings(used)
	t.Logf("helpers of the compat build: %s", strings.Join(compact(used), "; "))
}

func compact(s []string) []string {
	var out []string
	for i, x := range s {
		if i == 0 || s[i-1] != x {
			out = append(out, x)
		}
	}
	return out
}
