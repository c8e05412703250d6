package endpoint

import (
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

func TestParsePortMappingsErrors(t *testing.T) {
	cases := []struct {
		name    string
		pms     []PortMapping
		mention string
	}{
		{"hostPort 0", []PortMapping{{HostPort: 0, ContainerPort: 80, Protocol: "tcp"}}, "runtimeConfig.portMappings[0].hostPort: 0 is out of range"},
		{"hostPort 70000", []PortMapping{{HostPort: 80, ContainerPort: 80}, {HostPort: 70000, ContainerPort: 80, Protocol: "tcp"}}, "runtimeConfig.portMappings[1].hostPort: 70000 is out of range"},
		{"containerPort", []PortMapping{{HostPort: 80, ContainerPort: 65536}}, "runtimeConfig.portMappings[0].containerPort: 65536"},
		{"protocol", []PortMapping{{HostPort: 80, ContainerPort: 80, Protocol: "gre"}}, `runtimeConfig.portMappings[0].protocol: "gre"`},
		{"sctp", []PortMapping{{HostPort: 80, ContainerPort: 80, Protocol: "sctp"}}, `runtimeConfig.portMappings[0].protocol: "sctp" is not supported`},
		{"hostIP", []PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "1.2.3"}}, `runtimeConfig.portMappings[0].hostIP: "1.2.3"`},
		{"multicast hostIP", []PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "ff02::1"}}, "runtimeConfig.portMappings[0].hostIP"},
		{"clash", []PortMapping{{HostPort: 80, ContainerPort: 80}, {HostPort: 80, ContainerPort: 81, Protocol: "TCP"}}, "runtimeConfig.portMappings[1].hostPort"},
		{"clash wildcard v6", []PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "::"}, {HostPort: 80, ContainerPort: 81}}, "portMappings[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parsePortMappings(c.pms)
			assertCNIError(t, err, types.ErrInvalidNetworkConfig, c.mention)
		})
	}
}

func TestParsePortMappings(t *testing.T) {
	pms, err := parsePortMappings([]PortMapping{
		{HostPort: 80, ContainerPort: 8080},                                     // tcp, both families
		{HostPort: 80, ContainerPort: 8080, Protocol: "UDP", HostIP: "0.0.0.0"}, // udp, IPv4 only
		{HostPort: 53, ContainerPort: 53, Protocol: "udp", HostIP: "fd00::1"},
		{HostPort: 80, ContainerPort: 8080, Protocol: "tcp"},    // duplicate of [0]: merged
		{HostPort: 80, ContainerPort: 8081, HostIP: "10.0.0.1"}, // specific beside wildcard: fine
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pms) != 4 {
		t.Fatalf("%d mappings, want 4 (one duplicate merged): %+v", len(pms), pms)
	}
	if pms[0].proto != maps.ProtoTCP || !pms[0].v4 || !pms[0].v6 || pms[0].hostIP != nil {
		t.Errorf("[0] %+v", pms[0])
	}
	if pms[1].proto != maps.ProtoUDP || !pms[1].v4 || pms[1].v6 || pms[1].hostIP != nil {
		t.Errorf("[1] %+v", pms[1])
	}
	if pms[2].v4 || !pms[2].v6 || !pms[2].hostIP.Equal(net.ParseIP("fd00::1")) {
		t.Errorf("[2] %+v", pms[2])
	}

	pod4, pod6 := net.ParseIP("10.1.0.5"), net.ParseIP("fd00:1::5")
	hps, err := planHostPorts(pms, []net.IP{pod4, pod6}, 7)
	if err != nil {
		t.Fatal(err)
	}
	// [0] x2 families, [1] v4, [2] v6, [4] v4
	if len(hps) != 5 {
		t.Fatalf("%d entries, want 5: %+v", len(hps), hps)
	}
	for _, h := range hps {
		if h.Ifindex != 7 || (h.IPv6 && !h.PodIP.Equal(pod6)) || (!h.IPv6 && !h.PodIP.Equal(pod4)) {
			t.Errorf("entry %+v", h)
		}
	}
	// An IPv4-only pod: wildcards shrink to IPv4, an IPv6 hostIP is an error.
	if _, err := planHostPorts(pms[:2], []net.IP{pod4}, 7); err != nil {
		t.Errorf("IPv4-only pod, wildcard mappings: %v", err)
	}
	_, err = planHostPorts(pms, []net.IP{pod4}, 7)
	assertCNIError(t, err, types.ErrInvalidNetworkConfig, "runtimeConfig.portMappings[2].hostIP: fd00::1 is IPv6, but the pod has no IPv6 address")
}

func TestHostPortRecordRoundTrip(t *testing.T) {
	in := []maps.HostPort{
		{Proto: maps.ProtoTCP, HostPort: 80, PodIP: net.ParseIP("10.1.0.5").To4(), PodPort: 8080, Ifindex: 3},
		{HostIP: net.ParseIP("fd00::1"), IPv6: true, Proto: maps.ProtoUDP, HostPort: 53, PodIP: net.ParseIP("fd00:1::5"), PodPort: 53, Ifindex: 3},
	}
	for i, r := range recordHostPorts(in) {
		got, ok := recordedHostPort(r, 3)
		if !ok || got.Listen() != in[i].Listen() || !got.PodIP.Equal(in[i].PodIP) || got.PodPort != in[i].PodPort || got.Key() != in[i].Key() {
			t.Errorf("round trip of %+v: %+v %v", in[i], got, ok)
		}
	}
}
