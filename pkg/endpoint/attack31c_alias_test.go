package endpoint

import (
	"strings"
	"testing"
)

// TestOwnerAliasLongNetworkName (attack31c): a network name passes
// validation up to 255 bytes (a directory under stateDir), so the writer's
// budget of 200 bytes for the three parts can leave the container ID no
// room or less than none. ownerAlias must neither panic nor write an alias
// ParseOwnerAlias refuses (the uninstall's ourVeths skipped such a veth,
// PinNameOf and holderOf fell back to the link's own name): the alias
// keeps at least one byte of the ID, and parses back to the network, the
// interface and the ID's start, Truncated.
//
// Red before: a network of 196 bytes (eth0) wrote ".../eth0" as the ID,
// refused; one of 197 bytes panicked (slice bounds out of range [:-1]) in
// ADD's readyHost.
//
//	go test -count=1 -run 'TestOwnerAliasLongNetworkName$' -v ./pkg/endpoint/
func TestOwnerAliasLongNetworkName(t *testing.T) {
	for _, n := range []int{190, 195, 196, 197, 200, 210, 225} {
		network := strings.Repeat("n", n)
		for _, id := range []string{"c", "0123456789abcdef", strings.Repeat("i", 64)} {
			for _, ifname := range []string{"eth0", "abcdefghijklmno"} {
				var alias string
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Errorf("ownerAlias(network of %d bytes, id %q, %q) panicked: %v", n, id, ifname, r)
						}
					}()
					alias = ownerAlias(network, id, ifname)
				}()
				if alias == "" {
					continue
				}
				if len(alias) > 255 {
					t.Errorf("ownerAlias(network of %d bytes, id %q, %q) is %d bytes, more than an alias holds (255)", n, id, ifname, len(alias))
				}
				o, ok := ParseOwnerAlias(alias)
				switch {
				case !ok:
					t.Errorf("ParseOwnerAlias refused %q, which ownerAlias(network of %d bytes, id %q, %q) wrote", alias, n, id, ifname)
				case o.Network != network || o.IfName != ifname || !strings.HasPrefix(id, o.ContainerID) || o.ContainerID == "":
					t.Errorf("ParseOwnerAlias(%q) = %+v, want network of %d bytes, %q, a start of %q", alias, o, n, ifname, id)
				case o.Truncated != (o.ContainerID != id):
					t.Errorf("ParseOwnerAlias(%q).Truncated = %v with ID %q of %q", alias, o.Truncated, o.ContainerID, id)
				}
			}
		}
	}
}
