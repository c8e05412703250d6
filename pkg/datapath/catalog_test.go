package datapath

import (
	"testing"

	"github.com/cilium/ebpf"
)

// The kernel keeps 15 characters of a program's name: cni_sock_connect4 and
// cni_sock_connect6 both read "cni_sock_connec" where BTF does not give the
// full name back. Upgrade tells them apart by the link's attach type.
func TestProgramOfTruncatedNames(t *testing.T) {
	for _, c := range []struct {
		name   string
		attach ebpf.AttachType
		want   string
	}{
		{"cni_sock_connect4", ebpf.AttachCGroupInet6Connect, "cni_sock_connect4"}, // full name wins
		{"cni_sock_connec", ebpf.AttachCGroupInet4Connect, "cni_sock_connect4"},
		{"cni_sock_connec", ebpf.AttachCGroupInet6Connect, "cni_sock_connect6"},
		{"cni_sock_sendms", ebpf.AttachCGroupUDP4Sendmsg, "cni_sock_sendmsg4"},
		{"cni_sock_recvms", ebpf.AttachCGroupUDP6Recvmsg, "cni_sock_recvmsg6"},
		{"cni_from_contai", ebpf.AttachTCXIngress, "cni_from_container"},
	} {
		p, ok := programOf(c.name, c.attach)
		if !ok || p.Name != c.want {
			t.Errorf("programOf(%q, %v) = %q, %v; want %q", c.name, c.attach, p.Name, ok, c.want)
		}
	}
	if p, ok := programOf("cni_sock_connec", ebpf.AttachTCXIngress); ok {
		t.Errorf("a truncated name on a hook none of its programs uses matched %s", p.Name)
	}
}

// Every pin name is spelled once, in the catalogue: no two programs share a
// name, a link pin, or a kernel name on the same hook.
func TestCatalogIsConsistent(t *testing.T) {
	names, links := map[string]bool{}, map[string]bool{}
	for _, p := range catalog {
		if names[p.Name] || links[p.Link] {
			t.Errorf("%s: name or link pin %q used twice", p.Name, p.Link)
		}
		names[p.Name], links[p.Link] = true, true
		if got, ok := programOf(kernelProgName(p.Name), p.Attach); !ok || got.Name != p.Name {
			t.Errorf("%s: its kernel name on its hook resolves to %q", p.Name, got.Name)
		}
	}
	if len(hostVethPrograms) != 2 || hostVethPrograms[0].Link != DirIngress || hostVethPrograms[1].Link != DirEgress {
		t.Errorf("host veth programs: %+v", hostVethPrograms)
	}
}
