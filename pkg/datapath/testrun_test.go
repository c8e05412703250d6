package datapath

import (
	"encoding/binary"
	"runtime"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The one frame runner of the program tests (BPF_PROG_TEST_RUN): testRun;
// run (prog_test.go) and testRunOut are its short forms. The packet bench
// copies this file and budget_test.go into a reference tree
// (test/bench/packet.go): it names nothing an older tree defines.

// testRun is one BPF_PROG_TEST_RUN of p on frame, the skb on lo (the
// endpoint's host veth in these tests) and coming in from ingress: the
// verdict, the kernel's run time in ns and the frame after it. cilium/ebpf
// gives the run time only without a context (Benchmark), and the
// masquerade and policy paths read ingress_ifindex from it.
func testRun(t testing.TB, p *ebpf.Program, frame []byte, ingress uint32) (uint32, uint32, []byte) {
	t.Helper()
	ret, dur, out, err := progTestRun(p, frame, ingress)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, dur, out
}

// progTestRun is testRun's run, its failure returned (for goroutines, which
// may not stop the test).
func progTestRun(p *ebpf.Program, frame []byte, ingress uint32) (uint32, uint32, []byte, error) {
	// Frames must be at least ETH_HLEN for test runs; pad like the wire does.
	out := make([]byte, len(frame)+64)
	ctx := make([]byte, 192) // struct __sk_buff
	binary.LittleEndian.PutUint32(ctx[36:], ingress)
	binary.LittleEndian.PutUint32(ctx[40:], loIfindex)
	attr := struct {
		progFD, retval, sizeIn, sizeOut uint32
		dataIn, dataOut                 uint64
		repeat, duration                uint32
		ctxSizeIn, ctxSizeOut           uint32
		ctxIn, ctxOut                   uint64
		flags, cpu, batch               uint32
		_                               uint32
	}{
		progFD: uint32(p.FD()), sizeIn: uint32(len(frame)), sizeOut: uint32(len(out)),
		dataIn: uint64(uintptr(unsafe.Pointer(&frame[0]))), dataOut: uint64(uintptr(unsafe.Pointer(&out[0]))),
		repeat: 1, ctxSizeIn: uint32(len(ctx)), ctxIn: uint64(uintptr(unsafe.Pointer(&ctx[0]))),
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(frame)
	runtime.KeepAlive(out)
	runtime.KeepAlive(ctx)
	if errno != 0 {
		return 0, 0, nil, errno
	}
	return attr.retval, attr.duration, out[:attr.sizeOut], nil
}

// testRunOut is testRun without the run time.
func testRunOut(t *testing.T, p *ebpf.Program, frame []byte, ingress uint32) (uint32, []byte) {
	t.Helper()
	ret, _, out := testRun(t, p, frame, ingress)
	return ret, out
}
