package cni

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestParseConfErrors(t *testing.T) {
	cases := []struct {
		name, conf string
		code       uint
		mention    string
	}{
		{"bad json", `{"name":`, types.ErrDecodingFailure, "decode"},
		{"mtu", `{"name":"n","type":"ebpf-cni","mtu":20,"ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "mtu"},
		{"pinDir", `{"name":"n","type":"ebpf-cni","pinDir":"rel","ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "pinDir"},
		{"stateDir", `{"name":"n","type":"ebpf-cni","stateDir":"rel","ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "stateDir"},
		{"attachMode", `{"name":"n","type":"ebpf-cni","attachMode":"xdp","ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "attachMode"},
		{"clusterCIDRs", `{"name":"n","type":"ebpf-cni","ipMasq":true,"clusterCIDRs":["10.0.0.0/16","10.1.0.0/33"],"ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "clusterCIDRs[1]"},
		{"too many clusterCIDRs", `{"name":"n","type":"ebpf-cni","ipMasq":true,"clusterCIDRs":[` + strings.Repeat(`"10.0.0.0/16",`, 32) + `"10.1.0.0/16"],"ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "clusterCIDRs: 33 entries, more than the 32"},
		{"maxPods", `{"name":"n","type":"ebpf-cni","maxPods":9000,"ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "maxPods 9000 is out of range (1-8192)"},
		{"negative maxPods", `{"name":"n","type":"ebpf-cni","maxPods":-1,"ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "maxPods -1"},
		{"maxHostPortsPerPod", `{"name":"n","type":"ebpf-cni","maxHostPortsPerPod":-1,"ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig, "maxHostPortsPerPod -1 is out of range (0-1024)"},
		{"maxPods not a number", `{"name":"n","type":"ebpf-cni","maxPods":"110","ipam":{"type":"host-local"}}`, types.ErrDecodingFailure, "maxPods"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseConf([]byte(c.conf))
			assertCNIError(t, err, c.code, c.mention)
		})
	}
}

func TestValidateIPAM(t *testing.T) {
	cases := []struct {
		name, conf string
		mention    string // "" means valid
	}{
		{"ok", `{"ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/24","gateway":"10.0.0.1"}]],"routes":[{"dst":"0.0.0.0/0"}]}}`, ""},
		{"missing", `{}`, "ipam"},
		{"bad subnet", `{"ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/33"}]]}}`, "ipam.ranges[0][0].subnet"},
		{"no subnet", `{"ipam":{"type":"host-local","ranges":[[{"gateway":"10.0.0.1"}]]}}`, "ipam.ranges[0][0].subnet"},
		{"bad gateway", `{"ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/24","gateway":"x"}]]}}`, "ipam.ranges[0][0].gateway"},
		{"bad legacy subnet", `{"ipam":{"type":"host-local","subnet":"nope"}}`, "ipam.subnet"},
		{"bad route", `{"ipam":{"type":"host-local","subnet":"10.0.0.0/24","routes":[{"dst":"1.2.3.4"}]}}`, "ipam.routes[0].dst"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ipamType := ""
			if c.conf != "{}" {
				ipamType = "host-local"
			}
			_, err := validateIPAM([]byte(c.conf), ipamType, 0)
			if c.mention == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			assertCNIError(t, err, types.ErrInvalidNetworkConfig, c.mention)
		})
	}
}

// TestValidateIPAMv4Only: only a host-local configuration whose subnets are
// all IPv4 lets the host veths go without IPv6; any IPv6 range, or an IPAM
// plugin whose addresses the configuration does not show, keeps it.
func TestValidateIPAMv4Only(t *testing.T) {
	for _, c := range []struct {
		name, ipam, conf string
		want             bool
	}{
		{"legacy subnet", "host-local", `{"ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`, true},
		{"v4 ranges", "host-local", `{"ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/24"}]]}}`, true},
		{"v4-mapped v6 is v6", "host-local", `{"ipam":{"type":"host-local","ranges":[[{"subnet":"::ffff:0:0/96"}]]}}`, false},
		{"dual-stack", "host-local", `{"ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}}`, false},
		{"v6 in the same range set", "host-local", `{"ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]}}`, false},
		{"v6 only", "host-local", `{"ipam":{"type":"host-local","subnet":"fd00::/64"}}`, false},
		{"no subnet shown", "host-local", `{"ipam":{"type":"host-local"}}`, false},
		{"runtime ipRanges v6", "host-local", `{"ipam":{"type":"host-local","subnet":"10.0.0.0/24"},"runtimeConfig":{"ipRanges":[[{"subnet":"fd00::/64"}]]}}`, false},
		{"runtime ipRanges v4", "host-local", `{"ipam":{"type":"host-local","subnet":"10.0.0.0/24"},"runtimeConfig":{"ipRanges":[[{"subnet":"10.1.0.0/24"}]]}}`, true},
		{"runtime ipRanges bad", "host-local", `{"ipam":{"type":"host-local","subnet":"10.0.0.0/24"},"runtimeConfig":{"ipRanges":[[{"subnet":"nonsense"}]]}}`, false},
		{"runtime ipRanges malformed", "host-local", `{"ipam":{"type":"host-local","subnet":"10.0.0.0/24"},"runtimeConfig":{"ipRanges":"fd00::/64"}}`, false},
		{"runtime config null", "host-local", `{"ipam":{"type":"host-local","subnet":"10.0.0.0/24"},"runtimeConfig":null}`, true},
		{"runtime config not an object", "host-local", `{"ipam":{"type":"host-local","subnet":"10.0.0.0/24"},"runtimeConfig":"fd00::/64"}`, false},
		{"other ipam", "dhcp", `{"ipam":{"type":"dhcp","subnet":"10.0.0.0/24"}}`, false},
	} {
		got, err := validateIPAM([]byte(c.conf), c.ipam, 0)
		if err != nil || got != c.want {
			t.Errorf("%s: v4Only %v (err %v), want %v", c.name, got, err, c.want)
		}
	}
}

func assertCNIError(t *testing.T, err error, code uint, mention string) {
	t.Helper()
	var te *types.Error
	if !errors.As(cniError(err), &te) {
		t.Fatalf("want CNI error %d, got %v", code, err)
	}
	if te.Code != code {
		t.Fatalf("want code %d, got %d (%s)", code, te.Code, te.Msg)
	}
	if !strings.Contains(te.Msg, mention) {
		t.Fatalf("message %q does not name %q", te.Msg, mention)
	}
}

// The sizing defaults to kubelet's (110 pods) and 32 hostPorts a pod; an
// explicit 0 hostPorts is kept (no pod may map any).
func TestSizing(t *testing.T) {
	for conf, want := range map[string][2]int{
		`{"name":"n","type":"ebpf-cni","ipam":{"type":"host-local"}}`:                                       {110, 32},
		`{"name":"n","type":"ebpf-cni","maxPods":250,"ipam":{"type":"host-local"}}`:                         {250, 32},
		`{"name":"n","type":"ebpf-cni","maxPods":250,"maxHostPortsPerPod":0,"ipam":{"type":"host-local"}}`:  {250, 0},
		`{"name":"n","type":"ebpf-cni","maxPods":0,"maxHostPortsPerPod":1024,"ipam":{"type":"host-local"}}`: {110, 1024},
	} {
		c, err := parseConf([]byte(conf))
		if err != nil {
			t.Fatalf("%s: %v", conf, err)
		}
		if s := c.net.Sizing(); s.MaxPods != want[0] || s.HostPortsPerPod != want[1] {
			t.Errorf("%s: sized for %s, want %v", conf, s, want)
		}
	}
}
