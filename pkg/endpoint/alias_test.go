package endpoint

import (
	"strings"
	"testing"
)

// TestOwnerAliasRoundTrip: every alias ownerAlias writes for an attachment
// skel lets through parses back (ParseOwnerAlias) to the same network,
// interface name and container ID, or the ID's start and Truncated when the
// writer cut it; an ID that ends in "..." and fits is whole.
func TestOwnerAliasRoundTrip(t *testing.T) {
	long := strings.Repeat("a", 300)
	type att struct{ network, id, ifname string }
	cases := []att{
		{"ebpf-cni", "0123456789abcdef", "eth0"},
		{"n", "c", "e"},
		{"net-1_x.y", "pod.with-dots_and_under", "net1"},
		{"ebpf-cni", "ends-in...", "eth0"},                                         // whole: "..." is a valid ID ending
		{"ebpf-cni", long, "eth0"},                                                 // cut
		{"ebpf-cni", strings.Repeat("b", 200-len("ebpf-cni")-4), "eth0"},           // exactly fits
		{"ebpf-cni", strings.Repeat("c", 200-len("ebpf-cni")-4+1), "eth0"},         // one over: cut
		{"ebpf-cni", strings.Repeat("d", 200-len("ebpf-cni")-4-3) + "...", "eth0"}, // ends in "..." and fits exactly
		{strings.Repeat("n", 150), long, "abcdefghijklmno"},
	}
	for _, c := range cases {
		alias := ownerAlias(c.network, c.id, c.ifname)
		o, ok := ParseOwnerAlias(alias)
		if !ok {
			t.Errorf("ParseOwnerAlias(%q) refused the alias ownerAlias(%q, %q, %q) wrote", alias, c.network, c.id, c.ifname)
			continue
		}
		if o.Network != c.network || o.IfName != c.ifname {
			t.Errorf("ParseOwnerAlias(%q) = %+v, want network %q, ifname %q", alias, o, c.network, c.ifname)
		}
		cut := len(alias) > len(aliasPrefix)+200+2 // the writer's "..." took it past 200 bytes of parts
		switch {
		case o.Truncated != cut:
			t.Errorf("ParseOwnerAlias(%q).Truncated = %v, want %v (id of %d bytes)", alias, o.Truncated, cut, len(c.id))
		case !cut && o.ContainerID != c.id:
			t.Errorf("ParseOwnerAlias(%q).ContainerID = %q, want %q", alias, o.ContainerID, c.id)
		case cut && (o.ContainerID == "" || !strings.HasPrefix(c.id, o.ContainerID)):
			t.Errorf("ParseOwnerAlias(%q).ContainerID = %q, want a start of %q", alias, o.ContainerID, c.id)
		}
		if got := ownerAlias(o.Network, o.idText(), o.IfName); !cut && got != alias {
			t.Errorf("ownerAlias of the parsed %+v = %q, want %q", o, got, alias)
		}
		if o.idText() != strings.Split(strings.TrimPrefix(alias, aliasPrefix), "/")[1] {
			t.Errorf("idText of %+v = %q, not the alias's %q", o, o.idText(), alias)
		}
	}
}

// TestParseOwnerAliasRefusesMalformed: an alias ownerAlias could not have
// written for an attachment skel lets through is refused.
func TestParseOwnerAliasRefusesMalformed(t *testing.T) {
	for _, alias := range []string{
		"",
		"ebpf-cni",
		"ebpf-cni:",
		"ebpf-cni:net",
		"ebpf-cni:net/id",
		"ebpf-cni:net/id/",
		"ebpf-cni:net//eth0",
		"ebpf-cni:/id/eth0",
		"ebpf-cni:net/id/eth0/more",
		"ebpf-cni:net/id/eth0/",
		"ebpf-cni:../id/eth0",
		"ebpf-cni:./id/eth0",
		"ebpf-cni:.hidden/id/eth0",
		"ebpf-cni:net/../eth0",
		"ebpf-cni:net/-id/eth0",
		"ebpf-cni:net/i d/eth0",
		"ebpf-cni:net/id/..",
		"ebpf-cni:net/id/.",
		"ebpf-cni:net/id/eth 0",
		"ebpf-cni:net/id/eth:0",
		"ebpf-cni:net/id/" + strings.Repeat("e", 16),
		"EBPF-CNI:net/id/eth0",
		" ebpf-cni:net/id/eth0",
		"other:net/id/eth0",
		"ebpf-cni:net/.../eth0", // no ID before the "..."
	} {
		if o, ok := ParseOwnerAlias(alias); ok {
			t.Errorf("ParseOwnerAlias(%q) = %+v, want refused", alias, o)
		}
	}
}
