package endpoint

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// kinds are the endpoint's kinds of error by the CNI code pkg/cni gives them.
var kinds = map[uint]error{
	types.ErrInvalidNetworkConfig: ErrConfig, types.ErrInvalidEnvironmentVariables: ErrEnv,
	types.ErrTryAgainLater: ErrTryAgain, types.ErrIOFailure: ErrIO, types.ErrDecodingFailure: ErrDecode,
	50: ErrUnavailable, types.ErrInternal: ErrInternal,
}

func assertCNIError(t *testing.T, err error, code uint, mention string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want CNI error %d, got %v", code, err)
	}
	if e.Kind != kinds[code] {
		t.Fatalf("want code %d, got %v (%s)", code, e.Kind, e)
	}
	if !strings.Contains(e.Error(), mention) {
		t.Fatalf("message %q does not name %q", e, mention)
	}
}

func TestNewPlanRoutes(t *testing.T) {
	_, n4, _ := net.ParseCIDR("10.0.0.5/24")
	_, n6, _ := net.ParseCIDR("fd00::5/64")
	_, extra, _ := net.ParseCIDR("192.168.0.0/16")
	res := &current.Result{
		IPs: []*current.IPConfig{
			{Address: net.IPNet{IP: net.ParseIP("10.0.0.5").To4(), Mask: n4.Mask}, Gateway: net.ParseIP("10.0.0.1")},
			{Address: net.IPNet{IP: net.ParseIP("fd00::5"), Mask: n6.Mask}}, // no gateway: fallback
		},
		Routes: []*types.Route{{Dst: *extra}},
	}
	hostMAC, err := randomMAC()
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlan(res, &plan{hostIf: "ebpfx", ifname: "eth0", hostMAC: hostMAC})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range p.routes {
		got[r.dst.String()] = r.gw.String()
	}
	want := map[string]string{"192.168.0.0/16": "10.0.0.1", "0.0.0.0/0": "10.0.0.1", "::/0": "fe80::1"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("route %s via %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if len(p.gws) != 2 {
		t.Errorf("want a gateway per family, got %v", p.gws)
	}
	if len(p.hostMAC) != 6 || p.hostMAC[0]&1 != 0 || p.hostMAC[0]&2 == 0 {
		t.Errorf("host MAC %s is not unicast locally administered", p.hostMAC)
	}
}

func TestPodIdentity(t *testing.T) {
	ns, name := PodIdentity("IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1;K8S_POD_INFRA_CONTAINER_ID=x")
	if ns != "kube-system" || name != "coredns-1" {
		t.Fatalf("got %q %q", ns, name)
	}
}

func TestClusterCIDRs(t *testing.T) {
	res := &current.Result{IPs: []*current.IPConfig{
		{Address: net.IPNet{IP: net.ParseIP("10.244.1.7"), Mask: net.CIDRMask(24, 32)}},
		{Address: net.IPNet{IP: net.ParseIP("10.244.2.7").To16(), Mask: net.CIDRMask(120, 128)}}, // v4 in 16 bytes
		{Address: net.IPNet{IP: net.ParseIP("fd00::7"), Mask: net.CIDRMask(64, 128)}},
	}}
	a := &Attachment{IPs: res.IPs}
	m, err := newMasq(true, nil, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range m.cidrs(a) {
		got = append(got, p.String())
	}
	if want := "10.244.1.0/24 10.244.2.0/24 fd00::/64"; strings.Join(got, " ") != want {
		t.Fatalf("default cluster CIDRs %v, want %s", got, want)
	}
	if m, err = newMasq(true, []string{"10.244.9.9/16"}, "", 0); err != nil {
		t.Fatal(err)
	}
	if got := m.cidrs(a); len(got) != 1 || got[0].String() != "10.244.0.0/16" {
		t.Fatalf("configured cluster CIDRs %v", got)
	}
	// Configured CIDRs must cover each family the pod has: a dual-stack pod
	// with IPv4 ones only would masquerade its IPv6 to other nodes' pods.
	if err := m.coversFamilies(a); err == nil || !strings.Contains(err.Error(), "no IPv6 prefix") || !strings.Contains(err.Error(), "fd00::7") {
		t.Fatalf("IPv4-only clusterCIDRs for a dual-stack pod: %v, want an error naming the IPv6 address", err)
	}
	if m, err = newMasq(true, []string{"10.244.0.0/16", "::/0"}, "", 0); err != nil || m.coversFamilies(a) != nil {
		t.Fatalf("both families covered: %v %v", err, m.coversFamilies(a))
	}
	if m, err = newMasq(true, nil, "", 0); err != nil || m.coversFamilies(a) != nil {
		t.Fatalf("default clusterCIDRs: %v %v", err, m.coversFamilies(a))
	}
}
