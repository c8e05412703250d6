package endpoint

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckNamesAliasFits (names31): every network and interface name
// CheckNames lets through gives an alias within the kernel's 255 bytes
// (IFALIASZ) whatever the container ID; one byte more is refused, as is
// an interface name with a "%" (the kernel's name pattern).
//
//	go test -count=1 -run 'TestCheckNamesAliasFits$' -v ./pkg/endpoint/
func TestCheckNamesAliasFits(t *testing.T) {
	for _, ifname := range []string{"e", "eth0", "abcdefghijklmno"} {
		for n := 1; n <= 255; n++ {
			network := strings.Repeat("n", n)
			err := CheckNames(network, ifname)
			if fits := n+len(ifname) <= aliasNamesMax; fits != (err == nil) {
				t.Fatalf("CheckNames(network of %d bytes, %q) = %v", n, ifname, err)
			}
			if err != nil {
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "name: a network name of") {
					t.Fatalf("CheckNames(network of %d bytes, %q) = %v, want a config error naming the name", n, ifname, err)
				}
				continue
			}
			for _, id := range []string{"c", strings.Repeat("i", 64), strings.Repeat("x", 100000)} {
				if a := ownerAlias(network, id, ifname); len(a) > 255 {
					t.Fatalf("ownerAlias(network of %d bytes, ID of %d, %q) is %d bytes", n, len(id), ifname, len(a))
				}
			}
		}
	}
	for _, ifname := range []string{"eth%d", "%", "a%x"} {
		if err := CheckNames("net", ifname); !errors.Is(err, ErrEnv) {
			t.Errorf("CheckNames(net, %q) = %v, want an environment error", ifname, err)
		}
	}
}
