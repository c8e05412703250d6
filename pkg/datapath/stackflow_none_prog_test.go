package datapath

import (
	"net"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// runFrom is run with the skb's ingress_ifindex set: the host veth the
// stack forwarded the packet from (to_container's sender).
func runFrom(t *testing.T, p *ebpf.Program, frame []byte, ingress uint32) uint32 {
	t.Helper()
	ret, _ := testRunOut(t, p, frame, ingress)
	return ret
}

// TestStackFlowNoneFastPath: an address entry as ADD writes it carries
// EP_F_SF_NONE, and from_container's same-node fast path looks no stack
// flow of it up (issue 30); the first flow the stack delivers to the
// address clears it for good before its record exists, so the reply of
// that flow (and of every later one) still goes back through the stack.
// An entry without the bit (an older build's ADD) is looked up as before.
func TestStackFlowNoneFastPath(t *testing.T) {
	none := uint32(maps.EndpointFlagStackFlowsNone)
	for _, tc := range []struct {
		name         string
		flags        uint32 // the backend's entry
		podIP, dstIP net.IP
	}{
		{"entry as ADD writes it", none, podIP, dstIP},
		{"entry of an older build", 0, podIP, dstIP},
		{"IPv6", none, podIP6, dstIP6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			podIP, dstIP := tc.podIP, tc.dstIP
			dp := testDatapath(t)
			must(t, putEndpoint(dp.Maps, podIP, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, tc.flags)))
			must(t, putEndpoint(dp.Maps, dstIP, maps.NewEndpointInfo(dstIfindex, dstMAC, dstHost, none)))
			// The backend (podIP, port 80) answering the client pod
			// (dstIP): no flow recorded yet, so straight to the client.
			reply := packet(podMAC, protoTCP, podIP, dstIP, 80, 40010, ackFlag)
			if ret := runFrom(t, dp.FromContainer, reply, 0); ret != actRedirect {
				t.Fatalf("reply of no recorded flow: verdict %d, want the redirect", ret)
			}
			if e, err := dp.Maps.Endpoints().Lookup(podIP); err != nil || e.Flags&none != tc.flags&none {
				t.Fatalf("backend's entry after a fast-path packet: flags %#x (%v), want EP_F_SF_NONE %#x", e.Flags, err, tc.flags&none)
			}

			// The stack delivers the client's segment, DNATed by a Service,
			// forwarded from the client's host veth.
			in := packet(hostMAC, protoTCP, dstIP, podIP, 40010, 80, ackFlag)
			copy(in[0:6], podMAC)
			if ret := runFrom(t, dp.ToContainer, in, dstIfindex); ret != actOK {
				t.Fatalf("to_container: verdict %d", ret)
			}
			e, err := dp.Maps.Endpoints().Lookup(podIP)
			must(t, err)
			if e.Flags&none != 0 {
				t.Fatalf("backend's entry keeps EP_F_SF_NONE (flags %#x) after the stack delivered it a recorded flow", e.Flags)
			}
			if c, err := dp.Maps.Endpoints().Lookup(dstIP); err != nil || c.Flags&none == 0 {
				t.Fatalf("client's entry lost EP_F_SF_NONE (flags %#x, %v): only the receiving address's is cleared", c.Flags, err)
			}
			// Its reply meets the record: to the stack, which translates it back.
			if ret := runFrom(t, dp.FromContainer, reply, 0); ret != actOK {
				t.Fatalf("reply of a recorded flow: verdict %d, want the stack (%d)", ret, actOK)
			}
			// Another flow of the backend is looked up too, and misses.
			other := packet(podMAC, protoTCP, podIP, dstIP, 81, 40011, ackFlag)
			if ret := runFrom(t, dp.FromContainer, other, 0); ret != actRedirect {
				t.Fatalf("reply of another, unrecorded flow: verdict %d, want the redirect", ret)
			}
		})
	}
}
